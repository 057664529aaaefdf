"""A supervisor told to stop writes its device's page cache back first,
and its server may die during that write-back (the OOM killer, a crash).
The device then holds the writeback for a next server, which a stopping
supervisor will not start: the stop must end anyway, deleting the device
so that the held writeback fails and is reported, never wait for ever.

The image's disk is slowed (dm-delay) so that the supervisor's flush is
still waiting when the server is SIGKILLed; the supervisor must be gone
soon after, the device deleted, and the loss reported to the writer, whose
fsync fails.  About 22 s in the 6.12 guest."""
import os
import signal

import dmtarget
from kfix import mount, run, wait_until
import kinds
import restart

DISK_SIZE = 256 << 20
IMAGE_SIZE = 64 << 20
DIRTY = 16 << 20
DELAY_MS = 3000
# The killed server's AIO in flight ends within the delay, the device's
# deletion within seconds: a minute is slack for the emulated guest.
STOP_WITHIN_S = 60


def alive(pid):
    """Whether PID runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def supervisor_of(st):
    """The pid of the supervisor whose directory holds ST's server log."""
    want = f"--dir={os.path.dirname(st['device']['server_log'])}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"mloop-supervisor") and want in argv:
            return int(pid)
    raise AssertionError(f"no mloop-supervisor with {want.decode()}")


def run_test(kind, cl):
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "linear", dmtarget.linear(disk))
    run(["mkfs.ext4", "-q", "-F", dm.path])
    mnt = mount(cl, dm.path)
    image = os.path.join(mnt, "disk.img")
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    supervisor = supervisor_of(st)
    server = st["device"]["server_pid"]
    index = int(att.device.removeprefix("/dev/ublkb"))

    # Held open, so that no close writes the page cache back before the
    # supervisor's stop does.
    fd = os.open(att.device, os.O_RDWR)
    held = [fd]
    cl.push(lambda: [os.close(f) for f in held])
    os.pwrite(fd, os.urandom(DIRTY), 0)

    dm.swap(dmtarget.delay(disk, DELAY_MS), target="delay")
    cl.push(dm.swap, dmtarget.linear(disk))

    def release():
        # Before the fix the supervisor waits for ever: deleting the
        # device fails the writeback it waits on.
        if alive(supervisor):
            run([kinds.UBLK_BIN, "--delete", str(index)], check=False)
            wait_until(lambda: not alive(supervisor), "the stuck supervisor to end")
    cl.push(release)

    os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: restart.waits_in_sync(supervisor),
               f"supervisor pid {supervisor} to wait in its stop's flush of {att.device}")
    restart.sigkill_server(att.device, server)
    try:
        wait_until(lambda: not restart.waits_in_sync(supervisor),
                   "the supervisor's flush to end", STOP_WITHIN_S)
    except AssertionError:
        raise AssertionError(
            f"supervisor pid {supervisor} still waits in its stop's flush "
            f"{STOP_WITHIN_S} s after its server died") from None
    try:
        os.fsync(fd)
    except OSError as e:
        print(f"# the writer's fsync: {e}", flush=True)
    else:
        raise AssertionError("the writer's fsync succeeded, though the page cache "
                             "its writes were in was never written back")
    # The device's deletion waits for its last opener.
    os.close(held.pop())
    wait_until(lambda: not alive(supervisor), "the supervisor to end its stop",
               STOP_WITHIN_S)
    wait_until(lambda: not os.path.exists(f"/sys/block/ublkb{index}"),
               f"{att.device} to be deleted")

    dm.swap(dmtarget.linear(disk))
    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
