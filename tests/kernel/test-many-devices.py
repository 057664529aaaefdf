"""Many devices at once: 16 parallel `mloop attach` of small images give
16 distinct devices, each reading back what was written to it (and its
data lands in its own image); 16 parallel detaches leave no device
connected, no server or supervisor, nothing in the state directory.
Four attaches of one image at once give one device and three one-line
refusals (each attach claims its image under the state lock, then works
under its device's own lock).

What a device reserves of the kernel's AIO events (fs.aio-nr, limited
system-wide by fs.aio-max-nr, 65536 by default) is measured while the
devices sit idle after their IO: it must let 256 devices fit the default
limit (docs/design.md, "What a device reserves").  Before, each
mloop-server reserved 4 x (1024 + 128) events at start, and the 15th
attach failed.  MLOOP_MANY_DEVICES=256 attaches that many instead of 16
(slow under TCG: run-kernel-tests with MLOOP_VM_TIMEOUT and
MLOOP_VM_MEMORY_MB raised).

Then the limit itself, lowered for a moment: with no room even for the
smallest context attach fails in one line naming fs.aio-max-nr and the
sysctl that raises it; with room for a little, attach succeeds and the
device serves."""
import concurrent.futures
import mmap
import os
import time

from kfix import make_image, nbd_in_use, processes_mentioning, wait_until

SIZE = 16 << 20
BLOCK = 64 << 10
# Where each device gets its own pattern: the start, the middle, the end.
OFFSETS = (0, SIZE // 2, SIZE - BLOCK)
# 256 devices at the default fs.aio-max-nr, with room to spare for the
# rest of the system: at most this many events per idle device.
DEFAULT_AIO_MAX = 65536
PER_DEVICE_MAX = DEFAULT_AIO_MAX // 256 * 3 // 4
PARALLEL = 16


def aio_nr():
    with open("/proc/sys/fs/aio-nr") as f:
        return int(f.read())


def set_aio_max(n):
    with open("/proc/sys/fs/aio-max-nr", "w") as f:
        f.write(f"{n}\n")


def get_aio_max():
    with open("/proc/sys/fs/aio-max-nr") as f:
        return int(f.read())


def block(dev_no, offset):
    """64 KiB naming device DEV_NO and OFFSET."""
    unit = f"dev {dev_no:5d} at {offset:12d} ".encode()
    return (unit * (BLOCK // len(unit) + 1))[:BLOCK]


def write_blocks(dev, dev_no):
    buf = mmap.mmap(-1, BLOCK)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        for off in OFFSETS:
            buf.seek(0)
            buf.write(block(dev_no, off))
            assert os.pwrite(fd, buf, off) == BLOCK, f"{dev}: short write"
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()


def check_blocks(dev, dev_no):
    buf = mmap.mmap(-1, BLOCK)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        for off in OFFSETS:
            assert os.preadv(fd, [buf], off) == BLOCK, f"{dev}: short read"
            got = bytes(buf)
            assert got == block(dev_no, off), \
                f"{dev} (image {dev_no}) at {off}: read {got[:24]!r}"
    finally:
        os.close(fd)
        buf.close()


def check_image(path, dev_no):
    with open(path, "rb") as f:
        for off in OFFSETS:
            f.seek(off)
            got = f.read(BLOCK)
            assert got == block(dev_no, off), \
                f"image {dev_no} at {off} holds {got[:24]!r}"


def run_test(kind, cl):
    n = int(os.environ.get("MLOOP_MANY_DEVICES", "16"))
    images = [make_image(cl, size=SIZE, seed=i) for i in range(n)]
    attached = {}               # image number -> device

    def detach_left():
        for i, dev in list(attached.items()):
            kind.cli("detach", dev, check=False)
            attached.pop(i)
    cl.push(detach_left)

    aio_before = aio_nr()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL)
    cl.push(pool.shutdown)

    def attach(i):
        p = kind.cli(*kind.attach_args(images[i]))
        dev = p.stdout.strip()
        attached[i] = dev
        return dev

    t0 = time.monotonic()
    devs = list(pool.map(attach, range(n)))
    attach_time = time.monotonic() - t0
    assert len(set(devs)) == n, f"{n} attaches gave {len(set(devs))} distinct devices: {devs}"
    for dev in devs:
        assert nbd_in_use(dev), f"{dev} is not connected"

    t0 = time.monotonic()
    list(pool.map(lambda i: write_blocks(devs[i], i), range(n)))
    list(pool.map(lambda i: check_blocks(devs[i], i), range(n)))
    io_time = time.monotonic() - t0

    # Idle now: what the devices keep reserved.
    time.sleep(1)
    held = aio_nr() - aio_before
    per_device = held / n
    mem = meminfo()
    print(f"# {kind.name}: {n} devices attached in {attach_time:.1f} s, IO checked in "
          f"{io_time:.1f} s; idle they hold {held} AIO events ({per_device:.0f} per "
          f"device; fs.aio-nr {aio_nr()}, fs.aio-max-nr {get_aio_max()}); "
          f"memory used {mem} MiB", flush=True)
    assert per_device <= PER_DEVICE_MAX, \
        f"{per_device:.0f} AIO events per idle device: 256 devices would need " \
        f"{per_device * 256:.0f} of the default fs.aio-max-nr {DEFAULT_AIO_MAX}"

    def detach(i):
        kind.cli("detach", devs[i])
        attached.pop(i)
    t0 = time.monotonic()
    list(pool.map(detach, range(n)))
    detach_time = time.monotonic() - t0
    for dev in devs:
        wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
    for i in range(n):
        check_image(images[i], i)
    left = []
    for img in images:
        left += [f"process {pid}: {cmd}" for pid, cmd in processes_mentioning(img)]
    left += [f"state dir holds {e}" for e in kind.state_entries()]
    assert not left, "; ".join(left)
    wait_until(lambda: aio_nr() <= aio_before, "fs.aio-nr back to its value before", 10)
    print(f"# {kind.name}: {n} devices detached in {detach_time:.1f} s", flush=True)

    check_limit(kind, cl, images[0])
    check_same_image(kind, pool, images[0])


def check_same_image(kind, pool, image):
    """Attaches of one image run side by side, each holding the state
    lock only while it claims its image: of several at once exactly one
    gets a device and the others are refused in one line; then two
    detaches of that device at once leave nothing behind."""
    results = list(pool.map(lambda _: kind.cli(*kind.attach_args(image), check=False),
                            range(4)))
    won = [p.stdout.strip() for p in results if p.returncode == 0]
    refused = [p.stderr.strip() for p in results if p.returncode != 0]
    assert len(won) == 1, f"{len(won)} of 4 attaches of one image succeeded: {won}"
    for msg in refused:
        assert len(msg.splitlines()) == 1 and "is already attached to" in msg, \
            f"a losing attach said {msg!r}"
    dev = won[0]
    assert nbd_in_use(dev), f"{dev} is not connected"
    results = list(pool.map(lambda _: kind.cli("detach", dev, check=False), range(2)))
    for p in results:
        # The second finds it detached by the first: done, or not attached.
        assert p.returncode == 0 or "is not attached by mloop" in p.stderr, \
            f"detach {dev} twice at once: {p.stderr.strip()!r}"
    assert any(p.returncode == 0 for p in results), "neither detach succeeded"
    wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
    left = [f"process {pid}: {cmd}" for pid, cmd in processes_mentioning(image)]
    left += [f"state dir holds {e}" for e in kind.state_entries()]
    assert not left, "; ".join(left)
    print(f"# {kind.name}: 4 attaches of one image at once: one device, "
          f"3 refused ({refused[0]})", flush=True)


def meminfo():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            info[k] = int(v.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) // 1024


def check_limit(kind, cl, image):
    """fs.aio-max-nr lowered to just above what is in use, then restored."""
    saved = get_aio_max()
    cl.push(set_aio_max, saved)

    # No room even for the smallest context (8 events): refused, in one line.
    set_aio_max(aio_nr() + 4)
    p = kind.cli(*kind.attach_args(image), check=False)
    set_aio_max(saved)
    msg = p.stderr.strip()
    assert p.returncode != 0, "attach succeeded with no room for an AIO context"
    assert len(msg.splitlines()) == 1 and "fs.aio-max-nr" in msg and \
        "sysctl fs.aio-max-nr=" in msg, f"attach said {msg!r}"
    assert not kind.state_entries(), f"a refused attach left {kind.state_entries()}"
    print(f"# {kind.name}: at the limit, attach says: {msg}", flush=True)

    # Room for a few small contexts: attach works, the device serves (with
    # smaller contexts, or mloop-server's helper threads).
    set_aio_max(aio_nr() + 48)
    try:
        dev = kind.cli(*kind.attach_args(image)).stdout.strip()
        try:
            write_blocks(dev, 1000)
            check_blocks(dev, 1000)
        finally:
            kind.cli("detach", dev)
            wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
    finally:
        set_aio_max(saved)
