"""An RBD image as a block device: a real one-node Ceph cluster runs inside
the guest, on its loopback (tests/ceph/cluster.py), and `mloop attach
rbd:POOL/IMAGE` serves an image of it through librbd, over NBD or ublk.

1. ext4 made and filled through the device survives detach and re-attach
   (the re-attach names the configuration by $CEPH_CONF alone, and the
   device records it in its name): fsck finds it clean and every file
   reads back the same, and the device's first MiB is what `rbd export`
   reads of the image;
2. fio verify rounds pass while the server is killed with SIGKILL twice:
   each time the supervisor's new server breaks the dead one's exclusive
   lock at once (else librbd would wait 30 s for the dead holder) and the
   device goes on with no IO error and no verify mismatch;
3. the OSD stopped under a fio verify round and started again: the IO
   waits for it and completes, verified;
4. the cluster unreachable (every daemon SIGSTOPped) with --dead-timeout
   5: a read and a write each fail with EIO after about the dead timeout
   (the server's --io-timeout), and once the cluster answers, a block
   written before reads back and writes work;
5. over NBD, resizes: `mloop resize --size` grows the image (librbd hands
   the resize to the server, which holds the exclusive lock) and the
   device, whose new last block takes a write the image's RADOS object
   then holds; a resize made elsewhere (`rbd resize`) reaches the device by
   itself within a few seconds (the server follows librbd's update
   watch, the supervisor gives the kernel the new size), growing and
   shrinking; `mloop resize --size` below the data ext4 left is refused
   and changes nothing; the same two resizes with nbdkit serving (it is
   replaced, the old one killed first as the lock has one holder).  Over
   ublk, `mloop resize` is refused in one line (6.12's ublk cannot change
   a live device's size).  The image renamed (`rbd mv`) under the
   device and another image given its name: `mloop resize` grows the
   device's image, not the newcomer.

SKIPs without the Ceph packages or without the RBD module in the build.
Cost under TCG: 200-267 s in all (the cluster's start 32-62 s; the
resizes about 15 s): the full tier's only (runner.py says why).
"""
import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

from blockio import BLOCK, odirect_block
from kfix import Skip, file_digests, mount, run
import fioverify
from restart import attach, kill_mark, kill_server

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "ceph"))
import cluster  # noqa: E402  (tests/ceph/cluster.py)
import kinds  # noqa: E402

IMAGE_SIZE = 256 << 20
LOST_DEAD_TIMEOUT = 5   # --dead-timeout while the cluster is away
LOST_SLACK = 20         # seconds past it an EIO may take under TCG
MiB = 1 << 20
FOLLOW_LIMIT = 15       # seconds for a resize made elsewhere to reach the device
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
    # Re-attached with the configuration in $CEPH_CONF only, as from a
    # shell set up for the cluster: the device records it in its name,
    # since its servers (mloopd's, a restart's, run in /) see another
    # environment and would find another configuration, or none.
    bare = f"rbd:{c.spec('disk')}:id={c.client_id}"
    os.environ["CEPH_CONF"] = c.conf
    try:
        att = kind.attach(cl, bare)
    finally:
        del os.environ["CEPH_CONF"]
    recorded = kind.status(att.device)["device"]["file"]
    assert recorded == f"{bare}:conf={os.path.abspath(c.conf)}", \
        f"attached by $CEPH_CONF, the device records {recorded!r}"
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

    # 4. The cluster unreachable (every daemon stopped with SIGSTOP).
    check_cluster_loss(kind, cl, c, name)

    # 5. Resizes (the image holds section 1's ext4).
    att = kind.attach(cl, name)
    dev = att.device
    if isinstance(kind, kinds.MloopUblk):
        p = kind.cli("resize", "--size", str(IMAGE_SIZE + 64 * MiB), dev, check=False)
        msg = p.stderr.strip()
        assert p.returncode != 0 and len(msg.splitlines()) == 1 and "ublk" in msg, \
            f"mloop resize of a ublk device: exit {p.returncode}, {msg!r}"
        att.detach()
        return
    check_resizes(kind, c, dev)
    check_renamed(kind, c, dev)
    att.detach()
    if shutil.which("nbdkit"):
        args = kind.attach_args(name)
        args[args.index("--server") + 1] = "nbdkit"
        att = kind.attach(cl, name, args=args)
        try:
            check_nbdkit_resizes(kind, c, att.device)
        except (AssertionError, OSError):
            print_device_logs(kind, att.device)
            raise
        att.detach()


def device_size(dev):
    with open(f"/sys/block/{os.path.basename(dev)}/size") as f:
        return int(f.read()) * 512


def image_info(c):
    return json.loads(c.rbd("info", "--format", "json", c.spec("disk")))


def image_size(c):
    return image_info(c)["size"]


def stored(c, offset, length):
    """What the cluster holds at OFFSET of the image, read from the RADOS
    object itself (an `rbd export` of the whole image is slow under TCG)."""
    info = image_info(c)
    size = info["object_size"]
    assert offset // size == (offset + length - 1) // size, "spans two objects"
    obj = f"{info['block_name_prefix']}.{offset // size:016x}"
    data = subprocess.run(["rados", *c.client_args(), "-p", c.pool, "get", obj, "-"],
                          stdout=subprocess.PIPE, check=True, timeout=60).stdout
    return data[offset % size:offset % size + length]


def wait_device_size(dev, want):
    deadline = time.monotonic() + FOLLOW_LIMIT
    while device_size(dev) != want:
        assert time.monotonic() < deadline, \
            f"{dev} is {device_size(dev)} bytes {FOLLOW_LIMIT} s after the image " \
            f"became {want}"
        time.sleep(0.2)


def check_resizes(kind, c, dev):
    grown = IMAGE_SIZE + 64 * MiB
    kind.cli("resize", "--size", str(grown), dev)
    assert image_size(c) == grown, f"the image is {image_size(c)} bytes, not {grown}"
    assert device_size(dev) == grown, f"{dev} is {device_size(dev)} bytes, not {grown}"
    last = os.urandom(BLOCK)
    odirect_block(dev, grown - BLOCK, last)
    assert stored(c, grown - BLOCK, BLOCK) == last, "the new last block is not in the image"

    # Elsewhere: `rbd resize` while the server holds the lock.
    t = time.monotonic()
    c.rbd("resize", "--size", f"{(grown + 64 * MiB) // MiB}M", c.spec("disk"))
    wait_device_size(dev, grown + 64 * MiB)
    took = time.monotonic() - t
    c.rbd("resize", "--allow-shrink", "--size", f"{grown // MiB}M", c.spec("disk"))
    wait_device_size(dev, grown)
    print(f"# a resize made elsewhere reached {dev} in {took:.1f} s", flush=True)

    # Below the data: refused, nothing changed.
    p = kind.cli("resize", "--size", str(IMAGE_SIZE // 4), dev, check=False)
    msg = p.stderr.strip()
    assert p.returncode != 0 and "in use" in msg and "nothing" in msg, \
        f"a shrink below the data: exit {p.returncode}, {msg!r}"
    assert image_size(c) == grown and device_size(dev) == grown, \
        "a refused shrink changed a size"


def check_renamed(kind, c, dev):
    """The device's image renamed (`rbd mv`) and another image given its
    name: `mloop resize` grows the device's image, not the newcomer."""
    size = image_size(c)
    c.rbd("mv", c.spec("disk"), c.spec("disk-moved"))
    c.rbd("create", "--size", "8M", c.spec("disk"))
    try:
        kind.cli("resize", "--size", str(size + 64 * MiB), dev)
        assert image_size(c) == 8 * MiB, \
            f"mloop resize resized the image now named so: {image_size(c)} bytes"
        moved = json.loads(c.rbd("info", "--format", "json", c.spec("disk-moved")))["size"]
        assert moved == size + 64 * MiB and device_size(dev) == moved, \
            f"the renamed image is {moved} bytes, {dev} {device_size(dev)}"
    finally:
        c.rbd("rm", "--no-progress", c.spec("disk"))
        c.rbd("mv", c.spec("disk-moved"), c.spec("disk"))
    print("# mloop resize grew the renamed image, not the one given its name",
          flush=True)


def check_nbdkit_resizes(kind, c, dev):
    """nbdkit keeps the size each connection negotiated, so a resize
    replaces it; the image's lock has one holder, so the old one goes
    first and the new one takes the lock over: both kinds of resize, and
    a block written before them reads back after."""
    size = image_size(c)
    before = os.urandom(BLOCK)
    odirect_block(dev, size - BLOCK, before)
    kill_mark(dev, kind.status(dev)["device"]["server_pid"])
    kind.cli("resize", "--size", str(size + 64 * MiB), dev)
    assert device_size(dev) == size + 64 * MiB, f"{dev} is {device_size(dev)} bytes"
    kill_mark(dev, kind.status(dev)["device"]["server_pid"])
    c.rbd("resize", "--size", f"{(size + 128 * MiB) // MiB}M", c.spec("disk"))
    wait_device_size(dev, size + 128 * MiB)
    assert odirect_block(dev, size - BLOCK) == before, \
        "a block written before nbdkit's resizes reads back wrong"
    print("# nbdkit: both resizes replaced the server, the data is there", flush=True)


def check_cluster_loss(kind, cl, c, name):
    """A request to an unreachable cluster fails with EIO after the dead
    timeout (the server's --io-timeout), not never; IO works again, and
    the data is there, once the cluster answers."""
    args = kind.attach_args(name) + ["--dead-timeout", str(LOST_DEAD_TIMEOUT)]
    att = kind.attach(cl, name, args=args)
    dev = att.device
    block = os.urandom(BLOCK)
    odirect_block(dev, 3 * MiB, block)
    c.pause()
    try:
        for what, step in (("read", lambda: odirect_block(dev, 5 * MiB)),
                           ("write", lambda: odirect_block(dev, 6 * MiB, block))):
            t = time.monotonic()
            try:
                step()
                raise AssertionError(f"a {what} with the cluster away succeeded")
            except OSError as e:
                took = time.monotonic() - t
                assert e.errno == errno.EIO, f"the {what} failed with {e!r}, not EIO"
            assert LOST_DEAD_TIMEOUT - 1 <= took <= LOST_DEAD_TIMEOUT + LOST_SLACK, \
                f"the {what} failed after {took:.1f} s (dead timeout {LOST_DEAD_TIMEOUT} s)"
            print(f"# cluster away: the {what} failed with EIO after {took:.1f} s", flush=True)
    finally:
        c.resume()
    try:
        assert odirect_block(dev, 3 * MiB) == block, "the block written before reads back wrong"
        odirect_block(dev, 6 * MiB, block)
        assert odirect_block(dev, 6 * MiB) == block, "a write after the cluster's return"
    except (AssertionError, OSError):
        print_device_logs(kind, dev)
        raise
    att.detach()


def print_device_logs(kind, dev):
    """The device's state and its server's and supervisor's last words,
    for a failure's reader."""
    status = kind.status(dev)
    print(f"# status: {json.dumps(status)}", flush=True)
    log = status["device"].get("server_log")
    for path in (log, log and os.path.join(os.path.dirname(log), "supervisor.log")):
        if path and os.path.exists(path):
            with open(path, errors="replace") as f:
                tail = f.read().splitlines()[-30:]
            print(f"# {path}:", *(f"#   {line}" for line in tail), sep="\n", flush=True)
