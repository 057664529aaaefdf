"""A recovery that hangs on its image does not hold the device's dead
timeout up.  The image lives on an ext4 over a device-mapper device,
which is suspended before the server is killed: the next mloop-ublk
--recover then waits in the kernel for its first read of the image.
Reads of the device still fail with EIO once the dead timeout passes
(the supervisor follows that attempt from its event loop instead of
waiting in it, and gives up on time), mloop status says why, and once
the disk below is back detach leaves nothing behind."""
import os

import dmtarget
from kfix import mount, run, wait_until
from restart import attach, read_fails_eio, sigkill_server, status

TIMEOUT = 8  # the device's dead timeout
DISK_SIZE = 128 << 20
IMAGE_SIZE = 32 << 20


def run_test(kind, cl):
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "linear", dmtarget.linear(disk))
    run(["mkfs.ext4", "-q", "-F", dm.path])
    mnt = mount(cl, dm.path)
    image = os.path.join(mnt, "disk.img")
    with open(image, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.truncate(IMAGE_SIZE)
        os.fsync(f.fileno())
    att = attach(kind, cl, image, TIMEOUT)
    s = status(kind, att.device)
    fd = os.open(att.device, os.O_RDONLY | os.O_DIRECT)
    cl.push(os.close, fd)

    # From here the image's disk answers nothing; resumed (before the
    # unmount) whatever happens, so the stuck attempt can end.
    run(["dmsetup", "suspend", "--noudevsync", dm.name])
    cl.push(run, ["dmsetup", "resume", "--noudevsync", dm.name])
    sigkill_server(att.device, s["device"]["server_pid"])

    took = read_fails_eio(fd, "a device whose server hangs")
    # The dead timeout, plus slack for the emulated guest; a supervisor
    # waiting inside the attempt would take its start timeout (60 s).
    assert took < TIMEOUT + 20, f"the read hung {took:.0f} s before failing"
    wait_until(lambda: "device stopped" in (status(kind, att.device)["last_failure"] or ""),
               "mloop status to say the device was stopped")
    print(f"# EIO {took:.1f} s after the kill (dead timeout {TIMEOUT} s); "
          f"{status(kind, att.device)['last_failure']}", flush=True)

    run(["dmsetup", "resume", "--noudevsync", dm.name])
    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
