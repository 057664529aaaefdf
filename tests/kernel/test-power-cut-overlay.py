"""Power cut at the flushes of a device with a copy-on-write overlay: what
an fsync() on the device promised is in the overlay.

The overlay file lives on an ext4 filesystem (the "outer" one) on the
logged device of powercut.py; the base is a fresh ext4 image beside it,
never written.  The workload runs on ext4 on the attached device, so its
syncs become FLUSH requests, the overlay's commit (fdatasync of the
overlay file), and the outer filesystem's journal commits in the log.
At each point checked the outer filesystem is rebuilt and recovered
(mount replays its journal), mloop-server serves the overlay there over
the base, nbdcopy copies what the device would read after the power
cut, and that must be a filesystem that recovers and passes fsck -fn
with every synced file as powercut.check_files allows.

The standard tier checks the sample powercut.choose makes (every point
where a sync's promise is first checkable and SPREAD more); the full
tier twice as many spread points.  Every point, as test-power-cut does,
would take the full tier's group past its VM's deadline: each check
here also starts a server and copies the device.  For the CLI kinds
(mloop attach --overlay); the loop device has no overlay.
"""
import os
import subprocess

import powercut
from kfix import Cleanup, Skip, mount, run, tmpdir, wait_until

SERVER = os.environ.get("MLOOP_SERVER_BIN", "")
# The outer filesystem holds the overlay of a DATA_SIZE base: its map,
# and at most every cluster of the base.
OUTER_SIZE = 2 * powercut.DATA_SIZE
SPREAD = 12


def overlay_attach(kind, base):
    """powercut.run_workload's ATTACH: mounts the logged device (the outer
    filesystem) and attaches BASE with an overlay file on it."""
    def attach(cl, logged):
        outer = mount(cl, logged)
        att = kind.attach(cl, base, args=kind.attach_args(base) +
                          ["--overlay", os.path.join(outer, "overlay")])
        detach = att.detach

        def detach_then_unmount():
            detach()
            run(["umount", outer])
        # The logged device must be free before run_workload removes it.
        att.detach = detach_then_unmount
        return att
    return attach


def device_after_cut(snap, base, out):
    """Writes to OUT what the device reads after the power cut that left
    the outer filesystem as SNAP: the overlay found there served over BASE
    (or BASE alone when the overlay file was not made yet)."""
    with Cleanup() as cl:
        outer = mount(cl, snap, "loop")
        overlay = os.path.join(outer, "overlay")
        if not os.path.exists(overlay):
            run(["cp", "--sparse=always", base, out])
            return
        sock = os.path.join(tmpdir(cl), "s")
        server = subprocess.Popen([SERVER, "--listen", f"unix:{sock}", "--overlay", overlay,
                                   base], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)

        def stop():
            server.terminate()
            server.wait(timeout=60)
        cl.push(stop)
        wait_until(lambda: os.path.exists(sock) or server.poll() is not None,
                   "mloop-server to listen on the recovered overlay", timeout=60)
        assert server.poll() is None, \
            f"mloop-server refused the recovered overlay: {server.stderr.read()}"
        run(["nbdcopy", f"nbd+unix:///?socket={sock}", out])


def run_test(kind, cl):
    points, distinct, checked, rec, failure = replay(kind, cl)
    print(f"# power-cut-overlay: {points} flush/FUA points, {distinct} distinct images, "
          f"{checked} checked, {rec.seq} syncs", flush=True)
    assert failure is None, failure
    assert rec.seq > 0 and checked > 0, "nothing was synced or checked"


def replay(kind, cl):
    """Runs the workload on an overlay device and checks the points the
    tier's sample picks.  Returns (points, distinct images, checked,
    Record, the first failure or None)."""
    if not hasattr(kind, "attach_args"):
        raise Skip("only mloop attach makes overlays")
    if not SERVER or not os.path.exists(SERVER):
        raise Skip("mloop-server is not built")
    d = tmpdir(cl)
    base = os.path.join(d, "inner.img")
    with open(base, "wb") as f:
        f.truncate(powercut.DATA_SIZE)
    run(["mkfs.ext4", "-q", "-F", "-b", "4096",
         "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", base])
    log, outer_base, rec, ops = powercut.run_workload(
        kind, d, attach=overlay_attach(kind, base), data_size=OUTER_SIZE)

    def check(snap, seq, ops):
        device = snap + ".device"
        try:
            device_after_cut(snap, base, device)
        finally:
            os.unlink(snap)
        return powercut.check_image(device, seq, ops)

    spread = SPREAD * (2 if powercut.tier_seed() is None else 1)
    points, distinct, checked, failure = powercut.check_points(
        d, log, outer_base, ops, powercut.tier_seed() or 1,
        lambda line: print(line, flush=True), check=check, spread=spread)
    os.unlink(log)
    return points, distinct, checked, rec, failure
