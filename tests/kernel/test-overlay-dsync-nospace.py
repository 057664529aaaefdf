"""A copy-on-write overlay's failed writeback for want of space must fail
every later FLUSH: after a FUA write took the kernel's report of it, and
after the device's server was killed and restarted.

A FUA write to clusters already in the overlay goes out as one write with
RWF_DSYNC.  Its sync reports any failed writeback of the whole file that
its descriptor has not seen yet, not only its own range's, and the kernel
reports each failure once per open file, and to no file opened after one
took it.  When the outer filesystem's disk runs out of space under the
page cache (a thin pool without room, an NFS server's full disk),
writeback of other clusters fails with ENOSPC; a FUA write's error
ENOSPC may be that report.  Taken on the descriptor a FLUSH syncs, the
next FLUSH would find nothing to report and succeed over the lost pages;
taken by a server killed before its next FLUSH (or by the open of the
server after a killed one), the restarted server's FLUSH would.

The overlays live on XFS over a dm-thin volume much larger than its pool
(error_if_no_space: a write needing a new block fails at once with
ENOSPC instead of queueing).  XFS, because it records a failed
writeback's own error on both kernels; ext4 on Linux 6.1 records EIO
whatever the disk said, which the overlay keeps anyway (6.12's records
ENOSPC).  A small XFS: mkfs.xfs makes one under 300 MB, with a log that
fits the pool, only for a test suite that says so, as fstests does
(TEST_DIR, TEST_DEV and QA_CHECK_FS set).  The base lives on ramfs,
which has no O_DIRECT: the overlay follows the base, so its data area
goes through the page cache, as on a filesystem without O_DIRECT.
Through the kernel, three devices over the base, each with its overlay:
block A is written and flushed (its thin block is allocated); 256 KiB
at B are discarded, so that the overlay holds them as a hole (marked, no
block anywhere), and flushed; another thin volume of the pool takes all
its free space; B is written (the page cache only) and sync(2) writes
it back, which fails ENOSPC and takes no file's report.  Then:
  - the first: the test's own descriptor of its overlay sees ENOSPC
    (the failure is real), a FUA write to A (its own block is there: it
    may succeed or fail) and a FLUSH, which must fail, and so must the
    next;
  - the second: its server is killed before any sync, and the next
    one's open takes the report: the FLUSH must fail, and after another
    kill too (the overlay's header keeps the mark);
  - the third: a FUA write to A takes the report, then its server is
    killed: the restarted server's FLUSH must fail;
  - the fourth: its server is killed while the sync of a FLUSH waits on
    B's writeback (the pool, reloaded, now queues a write it has no
    room for), and the pool's reload back makes that writeback fail:
    the killed server's sync took the report as it died, before it
    could mark the overlay.  Its supervisor's own descriptor of the
    overlay (supervisor/overlay_witness.h), opened before and synced
    after the server's exit, is still told and marks it: the restarted
    server's FLUSH must fail;
  - the fifth: detached while such a sync is held for longer than the
    supervisor is given to stop (it is killed, its witness with it),
    the pool then failing the write: attached again, its FLUSH must
    fail (detach holds a witness of its own).

About 75 s under TCG (three kills and restarts, a detach held 35 s):
the durable groups of the CLI kinds, in the full tier only (the
standard tier has no room left; the overlay is the engine's, whichever
server).  The first device fails (the FLUSH succeeds) where the FUA
write goes out on the descriptor the FLUSH syncs; the second and third
where the error lives only in the server's memory; the fourth where no
process but the server had the overlay open; the fifth where only the
supervisor did.
"""
import errno
import mmap
import os
import shutil
import threading
import time

import dmtarget
from blockio import BLOCK, pattern, sync_errno, write_errno
from kfix import Skip, run, tmpdir
import restart

BASE_SIZE = 16 << 20
META_SIZE = 4 << 20
POOL_SIZE = 8 << 20          # the thin pool's data: 128 blocks of 64 KiB
THIN_SIZE = 256 << 20        # the overlay's filesystem, far larger
# mkfs.xfs makes a filesystem under 300 MB (and its log under 64 MiB)
# only for a test suite that says so, as fstests does.
SMALL_XFS = {"TEST_DIR": "/tmp", "TEST_DEV": "/dev/null", "QA_CHECK_FS": "1"}
THIN_BLOCK_SECTORS = 128     # 64 KiB, dm-thin's smallest
BLOCK_A = 1 << 20
BLOCK_B = 8 << 20
SPAN_B = 256 << 10           # several thin blocks, wherever XFS puts them
TIMEOUT = 10                 # the devices' request timeout (restart.attach)
NO_SPACE_TIMEOUT = "/sys/module/dm_thin_pool/parameters/no_space_timeout"
# Past the time detach gives a supervisor to stop (device/attach.c, 30 s)
DETACH_HELD_S = 35


def fill_pool(dev):
    """Writes DEV, a thin volume, until its pool has no room left."""
    chunk = THIN_BLOCK_SECTORS * 512
    buf = mmap.mmap(-1, chunk)
    buf.write(b"\xa5" * chunk)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        for off in range(0, POOL_SIZE + chunk, chunk):
            try:
                os.pwrite(fd, buf, off)
            except OSError as e:
                assert e.errno == errno.ENOSPC, \
                    f"filling the pool: {os.strerror(e.errno)}, expected ENOSPC"
                return
        raise AssertionError("the thin pool took more than its size")
    finally:
        os.close(fd)
        buf.close()


def flush_held(kind, dev, b, name):
    """Writes B at BLOCK_B of DEV (the page cache of its overlay) and
    starts a FLUSH on a thread of its own; returns once the server's
    sync waits on B's writeback, which the pool queues: the thread and
    the dict its errno goes to."""
    assert write_errno(dev, BLOCK_B, b) == 0, \
        f"{name}: write of B (to the page cache) failed"
    server = restart.status(kind, dev)["device"]["server_pid"]
    flushed = {}
    flusher = threading.Thread(
        target=lambda: flushed.update(errno=sync_errno(dev)), daemon=True)
    flusher.start()
    deadline = time.monotonic() + 30
    while not restart.waits_in_sync(server):
        assert time.monotonic() < deadline and flusher.is_alive(), \
            f"{name}: no thread of server pid {server} waited in a sync on B's " \
            f"queued writeback (the FLUSH: {describe_flush(flushed)})"
        time.sleep(0.1)
    return flusher, flushed


def describe(err):
    return os.strerror(err) if err else "success"


def describe_flush(flushed):
    return describe(flushed["errno"]) if "errno" in flushed else "still waiting"


def write_file(path, text):
    with open(path, "w") as f:
        f.write(text)


def run_test(kind, cl):
    if not hasattr(kind, "attach_args"):
        raise Skip("only mloop attach makes overlays")
    if shutil.which("mkfs.xfs") is None:
        raise Skip("mkfs.xfs is not installed")
    moddir = os.environ.get("MLOOP_VM_MODDIR")
    p = run(["modprobe"] + (["-d", moddir] if moddir else []) + ["xfs"], check=False)
    if p.returncode != 0:
        raise Skip(f"no xfs: {(p.stderr or p.stdout).strip()}")
    dmtarget.load("thin-pool")
    meta = dmtarget.scratch_disk(cl, META_SIZE)
    data = dmtarget.scratch_disk(cl, POOL_SIZE)
    # A new pool's metadata device starts with a zeroed superblock (the
    # scratch file is new and sparse, so it is; written all the same).
    with open(meta, "r+b") as f:
        f.write(bytes(4096))
    pool_table = (f"0 {dmtarget.sectors(data)} thin-pool {meta} {data} "
                  f"{THIN_BLOCK_SECTORS} 0")
    pool = dmtarget.Dm.create(cl, "thin-pool", pool_table + " 1 error_if_no_space",
                              name=f"mloop-ktest-pool-{os.getpid()}")
    pool.message("create_thin", "0")
    pool.message("create_thin", "1")
    thin = dmtarget.Dm.create(cl, "thin", f"0 {THIN_SIZE // 512} thin {pool.path} 0",
                              name=f"mloop-ktest-thin0-{os.getpid()}")
    filler = dmtarget.Dm.create(cl, "thin", f"0 {THIN_SIZE // 512} thin {pool.path} 1",
                                name=f"mloop-ktest-thin1-{os.getpid()}")
    run(["mkfs.xfs", "-q", "-f", "-K", "-m", "reflink=0", thin.path],
        env=dict(os.environ, **SMALL_XFS))
    outer = tmpdir(cl)
    run(["mount", "-t", "xfs", thin.path, outer])
    cl.push(run, ["umount", outer])
    overlay = os.path.join(outer, "overlay")

    ram = tmpdir(cl)
    run(["mount", "-t", "ramfs", "ramfs", ram])
    cl.push(run, ["umount", ram])
    base = os.path.join(ram, "base.img")
    with open(base, "wb") as f:
        for off in range(0, BASE_SIZE, BLOCK):
            f.write(pattern(off, 0))

    devices = {}
    for name in ("running", "killed", "fua-killed", "sync-killed", "detach-held"):
        overlay = os.path.join(outer, f"overlay-{name}")
        att = restart.attach(kind, cl, base, TIMEOUT, ["--overlay", overlay])
        assert write_errno(att.device, BLOCK_A, pattern(BLOCK_A, 1)) == 0, \
            f"{name}: write of A failed"
        run(["blkdiscard", "-o", str(BLOCK_B), "-l", str(SPAN_B), att.device])
        assert sync_errno(att.device) == 0, \
            f"{name}: FLUSH before the pool filled failed"
        devices[name] = (att, overlay)

    fill_pool(filler.path)
    status = run(["dmsetup", "status", pool.name]).stdout
    assert "out_of_data_space" in status, f"the pool is not full: {status.strip()}"

    b = b"".join(pattern(BLOCK_B + off, 1) for off in range(0, SPAN_B, BLOCK))
    for name, (att, _) in devices.items():
        if name in ("sync-killed", "detach-held"):
            continue  # later, with the pool queueing
        assert write_errno(att.device, BLOCK_B, b) == 0, \
            f"{name}: write of B (to the page cache) failed"
    # B's writeback, taking no descriptor's report.
    os.sync()

    att, overlay = devices["running"]
    dev = att.device
    # A look at the error that leaves the server's descriptors theirs to
    # see.
    lost = sync_errno(overlay)
    if lost != errno.ENOSPC:
        raise AssertionError(f"writeback of B with the pool full: {describe(lost)}, "
                             f"expected ENOSPC (XFS found B a block the pool had)")
    fua = write_errno(dev, BLOCK_A, pattern(BLOCK_A, 2), dsync=True)
    assert fua in (0, errno.ENOSPC, errno.EIO), \
        f"FUA write of A: {describe(fua)}"
    after = sync_errno(dev)
    assert after != 0, \
        f"FLUSH after B's writeback failed for want of space (the FUA write of A: " \
        f"{describe(fua)}): success, though B's data is lost"
    again = sync_errno(dev)
    assert again != 0, "a second FLUSH after B's lost writeback: success"

    att = devices["killed"][0]
    restart.kill_server(kind, att.device)
    killed = sync_errno(att.device)
    assert killed != 0, \
        "FLUSH after B's lost writeback, its server killed before any sync: " \
        "success (the next server's open took the report and forgot it)"
    restart.kill_server(kind, att.device)
    killed_again = sync_errno(att.device)
    assert killed_again != 0, \
        "FLUSH after B's lost writeback and two kills: success (the mark of " \
        "the failed sync did not outlive the server that saw it)"

    att = devices["fua-killed"][0]
    fua_killed = write_errno(att.device, BLOCK_A, pattern(BLOCK_A, 2), dsync=True)
    assert fua_killed in (0, errno.ENOSPC, errno.EIO), \
        f"FUA write of A before the kill: {describe(fua_killed)}"
    restart.kill_server(kind, att.device)
    after_kill = sync_errno(att.device)
    assert after_kill != 0, \
        f"FLUSH after a FUA write ({describe(fua_killed)}) took B's lost " \
        f"writeback and its server was killed: success"

    # The pool queues a write it has no room for (as LVM's pools do by
    # default), for as long as this test holds it (no_space_timeout 0:
    # no time limit), until it is reloaded to fail them again, as it is
    # whatever happens.
    with open(NO_SPACE_TIMEOUT) as f:
        no_space_timeout = f.read().strip()
    cl.push(write_file, NO_SPACE_TIMEOUT, no_space_timeout)
    write_file(NO_SPACE_TIMEOUT, "0")
    fail_when_full = pool_table + " 1 error_if_no_space"
    queue_when_full = pool_table + " 0"
    cl.push(pool.swap, fail_when_full, None, False)

    att = devices["sync-killed"][0]
    pool.swap(queue_when_full, lockfs=False)
    flusher, flushed = flush_held(kind, att.device, b, "sync-killed")
    # Killed in the sync, the server dies as it returns: once the pool
    # fails the write, with the report.
    restart.kill_server(kind, att.device, timeout=60,
                        killed=lambda pid: pool.swap(fail_when_full, lockfs=False))
    flusher.join(60)
    sync_killed = sync_errno(att.device)
    assert sync_killed != 0, \
        "FLUSH after its server was killed in a sync that then failed: success " \
        "(the killed server took the report with it, and nothing marked the overlay)"

    # Detached while its FLUSH's sync is held past the supervisor's time
    # to stop (DETACH_HELD_S): the supervisor, whose witness would have
    # marked the overlay, is killed before the server can die.
    att, overlay = devices["detach-held"]
    pool.swap(queue_when_full, lockfs=False)
    held_flusher, held_flushed = flush_held(kind, att.device, b, "detach-held")
    detached = {}
    # Its request times out while held: the kernel log says so.
    restart.kill_mark(att.device, restart.status(kind, att.device)["device"]["server_pid"])

    def detach():
        try:
            att.detach()
        except Exception as e:  # reported by the join below
            detached["error"] = e
    detacher = threading.Thread(target=detach, daemon=True)
    detacher.start()
    time.sleep(DETACH_HELD_S)
    assert detacher.is_alive(), \
        f"detach-held: the detach ended ({detached.get('error')}) with the sync still held"
    pool.swap(fail_when_full, lockfs=False)
    detacher.join(60)
    held_flusher.join(60)
    assert not detacher.is_alive() and "error" not in detached, \
        f"detach-held: the detach did not end once the pool let go: {detached.get('error')}"
    att = restart.attach(kind, cl, base, TIMEOUT, ["--overlay", overlay])
    detach_held = sync_errno(att.device)
    assert detach_held != 0, \
        "FLUSH after a detach whose server was killed in a sync that then " \
        "failed: success (the supervisor was killed before its witness " \
        "synced, and nothing else marked the overlay)"
    devices["detach-held"] = (att, overlay)

    for att, _ in devices.values():
        att.detach()
    print(f"# overlay-dsync-nospace: {kind.name}: B's writeback failed ENOSPC; "
          f"FUA write of A: {describe(fua)}; FLUSH then failed "
          f"({describe(after)}), and again ({describe(again)}); after a kill "
          f"before any sync ({describe(killed)}), and another "
          f"({describe(killed_again)}); after a FUA write "
          f"({describe(fua_killed)}) and a kill ({describe(after_kill)}); "
          f"after a kill in a sync that then failed ({describe(sync_killed)}; the "
          f"FLUSH in it: {describe_flush(flushed)}); attached again after a "
          f"detach held in such a sync ({describe(detach_held)}; the FLUSH in it: "
          f"{describe_flush(held_flushed)})",
          flush=True)
