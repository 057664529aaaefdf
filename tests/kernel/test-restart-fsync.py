"""Data written and fsync()ed on a mounted ext4 before the server is killed
is all there after the restart, and the filesystem is clean."""
import hashlib
import os
import random

from kfix import make_image, mount, reattach_clean, run
from restart import attach, kill_server


def write_files(mnt, prefix, rng, want):
    for i in range(8):
        data = rng.randbytes(rng.randrange(1, 512 << 10))
        name = f"{prefix}{i}"
        with open(os.path.join(mnt, name), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        want[name] = hashlib.sha256(data).hexdigest()


def run_test(kind, cl):
    image = make_image(cl)
    att = attach(kind, cl, image, 10)
    run(["mkfs.ext4", "-q", "-F", att.device])
    mnt = mount(cl, att.device)
    rng = random.Random(11)
    want = {}
    write_files(mnt, "before", rng, want)
    kill_server(kind, att.device)
    # The filesystem goes on: more writes and fsyncs after the restart.
    write_files(mnt, "after", rng, want)
    run(["umount", mnt])
    att.detach()

    mnt = reattach_clean(kind, cl, image)
    got = {}
    for name in want:
        with open(os.path.join(mnt, name), "rb") as f:
            got[name] = hashlib.sha256(f.read()).hexdigest()
    bad = sorted(n for n in want if got[n] != want[n])
    assert not bad, f"files differ after the restart: {bad}"
