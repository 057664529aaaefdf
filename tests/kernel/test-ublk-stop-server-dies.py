"""A supervisor told to stop writes its device's page cache back first,
and its server may die during that write-back (the OOM killer, a crash).
The device then holds the writeback for a next server, which only the
stopping supervisor would start: the stop must recover the device once
and finish the write-back, and where no server can take over, delete
the device so that the held writeback fails and is reported; never
wait for ever.

The image's disk is slowed (dm-delay) so that the supervisor's flush is
still waiting when the server is SIGKILLed, and made well again at once.  Device A recovers: the
writer's data reach the image.  Device B's image is moved away first,
so its recovery fails: the device is deleted, and the supervisor's log
says what was lost.  (The writer's fsync cannot tell: once the disk is
gone its flush fails whatever became of the page cache.)  Device C's
server dies and its recovery fails before the supervisor is told to
stop: the stop deletes the device rather than leave it holding its IO.
Device D's server dies during detach's own flush, before detach stops
the supervisor, and cannot be recovered: detach goes on to the stop at
once instead of waiting for the device's dead timeout.  About 22 s in the 6.12 guest."""
import os
import signal
import subprocess
import time

import dmtarget
from kfix import mount, run, wait_until
import kinds
import restart

DISK_SIZE = 256 << 20
IMAGE_SIZE = 32 << 20
DIRTY = 8 << 20
DELAY_MS = 2000
# The killed server's AIO in flight ends within the delay, a recovery
# and the flush within seconds: a minute is slack for the emulated guest.
STOP_WITHIN_S = 60
# Device D's: long, so that a detach waiting for it shows.
DETACH_DEAD_TIMEOUT = 60


def stop_while_server_dies(kind, cl, dm, disk, image, data, before_kill=lambda: None):
    """Attaches IMAGE, writes DATA to the device's page cache, stops the
    supervisor with the disk slowed and SIGKILLs the server during the
    stop's flush; returns the writer's fsync's errno after (0: none)."""
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    supervisor = restart.supervisor_of(st)
    server = st["device"]["server_pid"]
    index = int(att.device.removeprefix("/dev/ublkb"))

    # Held open, so that no close writes the page cache back before the
    # supervisor's stop does.
    held = [os.open(att.device, os.O_RDWR)]
    cl.push(lambda: [os.close(f) for f in held])
    os.pwrite(held[0], data, 0)

    dm.swap(dmtarget.delay(disk, DELAY_MS), target="delay")
    cl.push(dm.swap, dmtarget.linear(disk))

    def release():
        # Left waiting (a failed test): deleting the device fails the
        # writeback the supervisor waits on.
        if restart.alive(supervisor):
            run([kinds.UBLK_BIN, "--delete", str(index)], check=False)
            wait_until(lambda: not restart.alive(supervisor), "the stuck supervisor to end")
    cl.push(release)

    os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: restart.waits_in_sync(supervisor),
               f"supervisor pid {supervisor} to wait in its stop's flush of {att.device}")
    before_kill()
    restart.sigkill_server(att.device, server)
    # The disk is well again for the recovery (a next mloop-ublk's start
    # reads its image): the flush's wait is what had to meet the kill.
    dm.swap(dmtarget.linear(disk))
    try:
        wait_until(lambda: not os.path.exists(f"/sys/block/ublkb{index}"),
                   f"{att.device} to go", STOP_WITHIN_S)
    except AssertionError:
        raise AssertionError(
            f"{att.device} still there {STOP_WITHIN_S} s after its server died in the "
            f"stop's flush; supervisor waits in a sync: "
            f"{restart.waits_in_sync(supervisor)}") from None
    # The device's deletion waits for its last opener.
    os.close(held.pop())
    wait_until(lambda: not restart.alive(supervisor), "the supervisor to end its stop",
               STOP_WITHIN_S)
    return att, restart.supervisor_log(st)


def new_image(mnt, name):
    """A new empty image NAME.img in MNT, and where it is moved away to."""
    image = os.path.join(mnt, f"{name}.img")
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    return image, image + ".away"


def run_test(kind, cl):
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "linear", dmtarget.linear(disk))
    run(["mkfs.ext4", "-q", "-F", dm.path])
    mnt = mount(cl, dm.path)

    image, _ = new_image(mnt, "a")
    data = os.urandom(DIRTY)
    att, log = stop_while_server_dies(kind, cl, dm, disk, image, data)
    assert any("again, for its stop's write-back" in line for line in log), \
        f"A: no recovery for the stop; supervisor.log: {log[-6:]}"
    att.detach()
    with open(image, "rb") as f:
        assert f.read(DIRTY) == data, "A: the image lacks what the page cache held; " \
            f"supervisor.log: {log[-6:]}"
    left = kind.leftovers(att, image)
    assert not left, "A: " + "; ".join(left)

    image, away = new_image(mnt, "b")
    att, log = stop_while_server_dies(kind, cl, dm, disk, image, data,
                                      lambda: os.rename(image, away))
    os.rename(away, image)
    assert any("what its page cache held is lost" in line for line in log), \
        f"B: the supervisor did not say the page cache was lost; supervisor.log: {log[-6:]}"
    print("# B: " + next(line for line in log if "is lost" in line).split(": ", 2)[-1], flush=True)
    # The stop's deletion must not wait on the stop's own descriptor of
    # the disk (DEL_DEV waits for its last opener).
    assert not any("still in use after" in line for line in log), \
        f"B: the stop's deletion waited on an opener; supervisor.log: {log[-6:]}"
    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "B: " + "; ".join(left)

    # C: the server died and no recovery can take over (its image is
    # gone) when the supervisor is told to stop by someone else than
    # detach: the device must go, not be left holding its IO with no
    # supervisor left to give up on it.
    image, away = new_image(mnt, "c")
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    supervisor = restart.supervisor_of(st)
    os.rename(image, away)
    restart.sigkill_server(att.device, st["device"]["server_pid"])
    wait_until(lambda: any("failed" in line for line in restart.supervisor_log(st)),
               "the supervisor's recovery to fail")
    os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: not restart.alive(supervisor), "the supervisor to end its stop")
    log = restart.supervisor_log(st)
    os.rename(away, image)
    assert not os.path.exists(f"/sys/block/{os.path.basename(att.device)}"), \
        f"C: {att.device} left behind by its stopped supervisor, holding its IO; " \
        f"supervisor.log: {log[-6:]}"
    assert any("is lost" in line for line in log), \
        f"C: the supervisor did not say the page cache was lost; supervisor.log: {log[-6:]}"
    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "C: " + "; ".join(left)

    # D: the server dies during detach's own flush (before detach stops
    # the supervisor) and no recovery can take over: detach must not
    # wait for the device's dead timeout, holding every other attach
    # and detach (the state lock) that long.
    image, away = new_image(mnt, "d")
    att = restart.attach(kind, cl, image, DETACH_DEAD_TIMEOUT)
    st = restart.status(kind, att.device)
    held = [os.open(att.device, os.O_RDWR)]
    cl.push(lambda: [os.close(f) for f in held])
    os.pwrite(held[0], data, 0)
    dm.swap(dmtarget.delay(disk, DELAY_MS), target="delay")
    detach = subprocess.Popen([kinds.CLI, "detach", att.device], env=kind.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: detach.poll() is None and detach.kill())
    wait_until(lambda: restart.waits_in_sync(detach.pid),
               f"mloop detach to wait in its flush of {att.device}")
    os.rename(image, away)
    restart.sigkill_server(att.device, st["device"]["server_pid"])
    killed = time.monotonic()
    dm.swap(dmtarget.linear(disk))
    wait_until(lambda: not os.path.exists(f"/sys/block/{os.path.basename(att.device)}"),
               f"{att.device} to go", DETACH_DEAD_TIMEOUT + 30)
    os.close(held.pop())
    out, err = detach.communicate(timeout=DETACH_DEAD_TIMEOUT + 30)
    took = time.monotonic() - killed
    os.rename(away, image)
    att.attached = detach.returncode != 0
    assert took < DETACH_DEAD_TIMEOUT / 2, \
        f"D: detach took {took:.0f} s after its server died in its flush " \
        f"(the device's dead timeout: {DETACH_DEAD_TIMEOUT} s)"
    assert detach.returncode == 0, f"D: mloop detach: exit {detach.returncode}: {err.strip()}"
    print(f"# D: detach done {took:.1f} s after the kill", flush=True)
    left = kind.leftovers(att, image)
    assert not left, "D: " + "; ".join(left)
