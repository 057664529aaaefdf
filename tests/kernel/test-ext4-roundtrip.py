"""A filesystem made and filled through the device survives detach and
re-attach: fsck finds it clean and every file reads back the same."""
import hashlib
import os
import random

from kfix import file_digests, make_image, mount, reattach_clean, run


def run_test(kind, cl):
    image = make_image(cl)
    att = kind.attach(cl, image)
    run(["mkfs.ext4", "-q", "-F", att.device])
    mnt = mount(cl, att.device)
    rng = random.Random(7)
    want = {}
    for i in range(24):
        # Odd sizes, so partial blocks and tails are covered too.
        data = rng.randbytes(rng.randrange(1, 1 << 20))
        name = f"file{i:02}"
        with open(os.path.join(mnt, name), "wb") as f:
            f.write(data)
        want[name] = hashlib.sha256(data).hexdigest()
    os.mkdir(os.path.join(mnt, "dir"))
    run(["sync", "-f", mnt])
    run(["umount", mnt])
    att.detach()

    mnt = reattach_clean(kind, cl, image)
    got = file_digests(mnt)
    assert got == want, f"files differ after re-attach: " \
        f"{sorted(k for k in want if got.get(k) != want[k])} {sorted(set(got) - set(want))}"
    assert os.path.isdir(os.path.join(mnt, "dir")), "the directory is gone"
