"""Power cut right after a FUA write to a cluster a copy-on-write overlay
took without a flush: the FUA write is there after the cut.

A cluster's first write (or a trim) records the cluster in the overlay's
map, whose word then sits in the outer filesystem's page cache until a
commit; the write was not FUA, so nothing more was promised.  A FUA write
to that cluster promises its data durable, and its data is only reachable
through that map word: the reply must not go out while the word is in
the page cache alone.

The overlay lives on ext4 (the outer filesystem) on the logged device of
dmtarget.py (dm-log-writes); the base is a file beside it, never written.
mloop-server serves the overlay, and an NBD client (libnbd) writes block
B, then writes B again with FUA, and a MARK goes into the log; then trims
block T, writes T with FUA, and another MARK.  Replaying the log up to a
mark rebuilds what a disk that lost power then would hold; the outer
filesystem recovers (mount replays its journal), mloop-server serves the
overlay found there over the base, and the block must read its FUA
write's data.

Not through the kernel's NBD client: for an O_DSYNC write to the device
it sends a FLUSH after the FUA write (the block device's own sync), which
commits the map anyway; other clients (qemu, libnbd, nbdcopy) send FUA
alone.  The engine is the server's whichever device: run once, in the
native kind's group.
"""
import os
import subprocess

import dmtarget
import logwrites
from blockio import BLOCK, pattern
from kfix import Cleanup, Skip, mount, run, tmpdir, wait_until

SERVER = os.environ.get("MLOOP_SERVER_BIN", "")
OUTER_SIZE = 64 << 20
BASE_SIZE = 16 << 20
LOG_SIZE = 256 << 20
WRITTEN = 3 << 20       # block B: written, then written with FUA
TRIMMED = 5 << 20       # block T: discarded, then written with FUA
# Each case gets its own mark: a trim syncs the whole overlay file
# (marking a cluster does), so B's map word would be durable at a mark
# after T's trim whatever B's FUA write did.
CASES = [("after-write-fua", WRITTEN), ("after-trim-fua", TRIMMED)]


def serve(cl, overlay, base):
    """mloop-server serving OVERLAY over BASE, stopped by CL; returns a
    libnbd handle connected to it (closed by CL first)."""
    import nbd
    sock = os.path.join(tmpdir(cl), "s")
    server = subprocess.Popen([SERVER, "--listen", f"unix:{sock}", "--overlay", overlay,
                               base], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)

    def stop():
        server.terminate()
        server.wait(timeout=60)
    cl.push(stop)
    wait_until(lambda: os.path.exists(sock) or server.poll() is not None,
               "mloop-server to listen", timeout=60)
    assert server.poll() is None, f"mloop-server refused {overlay}: {server.stderr.read()}"
    h = nbd.NBD()
    h.connect_unix(sock)
    cl.push(h.shutdown)
    return h


def read_after_cut(snap, base, offsets):
    """The blocks at OFFSETS of the device the overlay found on the
    recovered outer filesystem SNAP serves over BASE."""
    with Cleanup() as cl:
        outer = mount(cl, snap, "loop")
        overlay = os.path.join(outer, "overlay")
        assert os.path.exists(overlay), "the overlay file did not survive the cut"
        h = serve(cl, overlay, base)
        return [h.pread(BLOCK, off) for off in offsets]


def run_test(kind, cl):
    if getattr(kind, "name", "") != "native" or not hasattr(kind, "attach_args"):
        raise Skip("the engine is mloop-server's whichever device: run with the native kind")
    if not SERVER or not os.path.exists(SERVER):
        raise Skip("mloop-server is not built")
    try:
        import nbd
    except ImportError:
        raise Skip("python3-libnbd is not installed")
    dmtarget.load("log-writes")
    d = tmpdir(cl)
    data, log, start, base = (os.path.join(d, n)
                              for n in ("outer.img", "log.img", "start.img", "base.img"))
    for path, size in ((data, OUTER_SIZE), (log, LOG_SIZE)):
        with open(path, "wb") as f:
            f.truncate(size)
    run(["mkfs.ext4", "-q", "-F", "-b", "4096",
         "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", data])
    run(["cp", "--sparse=always", data, start])
    # The base names every block, so a block read from it cannot pass
    # for one the device wrote.
    with open(base, "wb") as f:
        for off in range(0, BASE_SIZE, BLOCK):
            f.write(pattern(off, 0))

    with Cleanup() as wcl:
        data_dev, log_dev = dmtarget.losetup(wcl, data), dmtarget.losetup(wcl, log)
        dm = dmtarget.Dm.create(wcl, "log-writes", f"0 {dmtarget.sectors(data_dev)} "
                                f"log-writes {data_dev} {log_dev}")
        outer = mount(wcl, dm.path)
        with Cleanup() as scl:
            h = serve(scl, os.path.join(outer, "overlay"), base)
            h.pwrite(pattern(WRITTEN, 1), WRITTEN)
            h.pwrite(pattern(WRITTEN, 2), WRITTEN, nbd.CMD_FLAG_FUA)
            dm.message("mark", CASES[0][0])
            h.trim(BLOCK, TRIMMED)
            h.pwrite(pattern(TRIMMED, 2), TRIMMED, nbd.CMD_FLAG_FUA)
            dm.message("mark", CASES[1][0])
        run(["umount", outer])
        dm.remove()

    wrong, done = [], -1
    with logwrites.Log(log) as lw:
        entries = list(lw.entries())
        for mark, off in CASES:
            at = [e for e in entries if e.mark == mark]
            assert at, f"no mark {mark!r} in the log"
            lw.replay(start, at[0].index, start=done + 1, entries=entries)
            done = at[0].index
            snap = os.path.join(d, "snap.img")
            run(["cp", "--sparse=always", start, snap])
            data = read_after_cut(snap, base, [off])[0]
            os.unlink(snap)
            if data != pattern(off, 2):
                what = ("the base's" if data == pattern(off, 0) else
                        "the first write's" if data == pattern(off, 1) else
                        "zeroes" if data == bytes(BLOCK) else "other")
                wrong.append(f"at mark {mark} (entry {done}), block at {off} reads "
                             f"{what} data")
    os.unlink(log)
    assert not wrong, "after a power cut right after a FUA write: " + "; ".join(wrong)
    print(f"# power-cut-overlay-fua: both FUA writes survived the cut "
          f"({len(entries)} log entries)", flush=True)
