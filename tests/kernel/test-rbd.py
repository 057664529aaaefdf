"""An RBD image as a block device: a real one-node Ceph cluster runs inside
the guest, on its loopback (tests/ceph/cluster.py), and `mloop attach
rbd:POOL/IMAGE` serves an image of it through librbd, over NBD or ublk.

1. ext4 made and filled through the device survives detach and re-attach:
   fsck finds it clean and every file reads back the same, and the
   device's first MiB is what `rbd export` reads of the image;
2. fio verify rounds pass while the server is killed with SIGKILL twice:
   each time the supervisor's new server breaks the dead one's exclusive
   lock at once (else librbd would wait 30 s for the dead holder) and the
   device goes on with no IO error and no verify mismatch;
3. the OSD stopped under a fio verify round and started again: the IO
   waits for it and completes, verified.

SKIPs without the Ceph packages or without the RBD module in the build.
Cost under TCG: the cluster's start 35-40 s, then about a minute.
"""
import hashlib
import os
import random
import subprocess
import sys
import time

from kfix import Skip, file_digests, mount, run
import fioverify
from restart import attach, kill_server

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "ceph"))
import cluster  # noqa: E402  (tests/ceph/cluster.py)

IMAGE_SIZE = 256 << 20
KILLS = 2
RESUME_LIMIT = 15       # seconds from SIGKILL to a reconnected device
TIMEOUT_FACTOR = 6      # the cluster's start limits, scaled for TCG
OSD_AWAY_TIMEOUT = 120  # the request timeout while the OSD restarts
# Per fio job (four): a quarter of the other tests' rounds, as each 4 KiB
# write is a BlueStore transaction on the guest's emulated CPU (about 100
# a second under TCG).
REGION = 2 << 20


def rbd_module():
    server = os.environ.get("MLOOP_SERVER_BIN", "")
    path = os.path.join(os.path.dirname(os.path.dirname(server)), "engine",
                        "mloop-store-rbd.so")
    return path if os.path.exists(path) else None


def fill_fs(mnt):
    rng = random.Random(11)
    want = {}
    for i in range(12):
        data = rng.randbytes(rng.randrange(1, 1 << 20))
        with open(os.path.join(mnt, f"file{i:02}"), "wb") as f:
            f.write(data)
        want[f"file{i:02}"] = hashlib.sha256(data).hexdigest()
    run(["sync", "-f", mnt])
    return want


def run_test(kind, cl):
    reason = cluster.missing_reason(with_mgr=False)
    if reason:
        raise Skip(reason)
    if rbd_module() is None:
        raise Skip("mloop was built without RBD support (no mloop-store-rbd.so)")
    c = cluster.Cluster(with_mgr=False, timeout_factor=TIMEOUT_FACTOR)
    cl.push(c.stop)
    start = time.monotonic()
    c.start()
    print(f"# the cluster started in {time.monotonic() - start:.0f} s", flush=True)
    c.create_image("disk", IMAGE_SIZE)
    name = f"rbd:{c.spec('disk')}:conf={c.conf}:id={c.client_id}"

    # 1. ext4 round trip, through detach and re-attach.
    att = kind.attach(cl, name)
    run(["mkfs.ext4", "-q", "-F", att.device])
    mnt = mount(cl, att.device)
    want = fill_fs(mnt)
    run(["umount", mnt])
    att.detach()
    att = kind.attach(cl, name)
    run(["fsck.ext4", "-n", "-f", att.device])
    mnt = mount(cl, att.device)
    got = file_digests(mnt)
    assert got == want, f"files differ after re-attach: " \
        f"{sorted(k for k in want if got.get(k) != want[k])}"
    run(["umount", mnt])
    with open(att.device, "rb") as f:
        head = f.read(1 << 20)
    att.detach()
    out = subprocess.run(["rbd", *c.client_args(), "export", "--no-progress",
                          c.spec("disk"), "-"],
                         stdout=subprocess.PIPE, check=True, timeout=300).stdout
    assert len(out) == IMAGE_SIZE, f"rbd export gave {len(out)} bytes"
    assert out[:len(head)] == head, "the device and rbd export differ"

    # 2. fio verify while the server is killed (short request timeout:
    # what the killed server held is requeued when it expires).
    att = attach(kind, cl, name, 10)
    dev = att.device
    took, rounds = fioverify.under_kills(dev, cl, KILLS, lambda: kill_server(kind, dev),
                                         region=REGION)
    slow = [t for t in took if t > RESUME_LIMIT]
    assert not slow, f"reconnects took {['%.1f s' % t for t in took]} " \
        f"(limit {RESUME_LIMIT} s): the dead server's lock not taken over?"
    print(f"# reconnected after each SIGKILL in {', '.join('%.1f s' % t for t in took)} "
          f"({rounds} fio round(s))", flush=True)

    att.detach()

    # 3. The OSD away under IO: the requests wait for it, well within a
    # request timeout long enough for the OSD's restart under TCG.
    att = attach(kind, cl, name, OSD_AWAY_TIMEOUT)
    dev = att.device
    fio = fioverify.start_round(dev, cl, REGION)
    time.sleep(fioverify.ROUND_START + 1)
    c.stop_osd()
    time.sleep(3)
    assert fio.poll() is None, "fio finished with the OSD down"
    c.start_osd()
    fioverify.check_round(fio, REGION)
    print("# a verify round waited for the OSD's restart and passed", flush=True)
    att.detach()
