"""A copy-on-write overlay whose disk failed one sync fails every later
FLUSH and FUA write, under this server and the next, until its owner
clears it (mloop overlay clear).

When writeback of a page fails, the kernel reports the error to one
fdatasync of each open file and forgets the page's contents were never
written (the page is clean again): a later fdatasync succeeds although
the overlay's map page it would have made durable is lost.  A server
that answered that later FLUSH with success would promise what a power
cut then takes away.

The overlay lives on ext4 without a journal, mounted errors=continue (a
journal write failing would shut the filesystem down, and every later
sync would fail for that reason alone), on a device-mapper device over a
scratch disk.  Through the kernel, with O_DIRECT: a write to block A and
an fsync (a FLUSH), so the map's page is on disk; a write to block B, a
cluster new to the overlay, whose map word is now in the page cache
only; then the disk fails writes (dm-flakey error_writes; the table is
swapped without freezing the filesystem, which would sync it first) and
a FLUSH fails.  The disk recovers (a linear table again), and still a FLUSH and
a FUA write (O_DSYNC) fail with EIO.  Detached and attached again (the
overlay reopened), B reads its data and a FLUSH still fails: the header
carries the mark, written while the disk failed and so lost with it, but
written again by the supervisor's witness of the overlay as the server
stopped (its sync, on a descriptor opened before the fault, is told).
Detached, cleared and attached again, a FLUSH succeeds; and that FLUSH
made B's map word durable: the kernel held the map page whose writeback
failed as clean, so unless the overlay wrote it again, it was only in the
page cache.  Attached once more after the page cache is dropped, B
still reads its data.

For the CLI kinds (mloop attach --overlay); the loop device has no
overlay.
"""
import errno
import os

import dmtarget
from blockio import BLOCK, odirect_block, pattern, sync_errno, write_errno
from kfix import Skip, mount, run, tmpdir

OUTER_SIZE = 64 << 20
BASE_SIZE = 16 << 20
BLOCK_A = 1 << 20
BLOCK_B = 9 << 20


def run_test(kind, cl):
    if not hasattr(kind, "attach_args"):
        raise Skip("only mloop attach makes overlays")
    dmtarget.load("flakey")
    disk = dmtarget.scratch_disk(cl, OUTER_SIZE)
    dm = dmtarget.Dm.create(cl, "linear", dmtarget.linear(disk))
    run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal",
         "-E", "lazy_itable_init=0,nodiscard", dm.path])
    outer = mount(cl, dm.path, "errors=continue")
    overlay = os.path.join(outer, "overlay")
    base = os.path.join(tmpdir(cl), "base.img")
    with open(base, "wb") as f:
        for off in range(0, BASE_SIZE, BLOCK):
            f.write(pattern(off, 0))
    args = kind.attach_args(base) + ["--overlay", overlay]

    att = kind.attach(cl, base, args=args)
    dev = att.device
    assert write_errno(dev, BLOCK_A, pattern(BLOCK_A, 1)) == 0, "write of A failed"
    assert sync_errno(dev) == 0, "FLUSH before the fault failed"
    assert write_errno(dev, BLOCK_B, pattern(BLOCK_B, 1)) == 0, "write of B failed"

    dm.swap(dmtarget.flakey(disk, "error_writes"), target="flakey", lockfs=False)
    try:
        during = sync_errno(dev)
    finally:
        dm.swap(dmtarget.linear(disk), lockfs=False)
    assert during == errno.EIO, \
        f"FLUSH while the disk failed writes: {os.strerror(during) if during else 'success'}"

    after = sync_errno(dev)
    assert after == errno.EIO, \
        f"FLUSH after a failed sync, the disk well again: " \
        f"{os.strerror(after) if after else 'success'}, though the map page may be lost"
    fua = write_errno(dev, BLOCK_A, pattern(BLOCK_A, 2), dsync=True)
    assert fua == errno.EIO, \
        f"FUA write after a failed sync: {os.strerror(fua) if fua else 'success'}"

    att.detach()
    att = kind.attach(cl, base, args=args)
    dev = att.device
    assert odirect_block(dev, BLOCK_B) == pattern(BLOCK_B, 1), "block B lost its data"
    reopened = sync_errno(dev)
    assert reopened == errno.EIO, \
        f"FLUSH on the overlay opened again: " \
        f"{os.strerror(reopened) if reopened else 'success'}, though its failed " \
        f"sync was never cleared"
    att.detach()
    kind.cli("overlay", "clear", overlay)
    att = kind.attach(cl, base, args=args)
    dev = att.device
    assert sync_errno(dev) == 0, "FLUSH on the overlay cleared failed"
    att.detach()
    # What that FLUSH promised is on the disk, not only in the page cache
    # (which still held B's map word, lost to the disk at the fault).
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    att = kind.attach(cl, base, args=args)
    dev = att.device
    got = odirect_block(dev, BLOCK_B)
    assert got == pattern(BLOCK_B, 1), \
        "after a successful FLUSH and the page cache dropped, block B reads " + \
        ("the base's data: its map word never reached the disk"
         if got == pattern(BLOCK_B, 0) else "other data")
    assert odirect_block(dev, BLOCK_A) in (pattern(BLOCK_A, 1), pattern(BLOCK_A, 2)), \
        "block A lost its data"
    att.detach()
    print(f"# overlay-sync-error: {kind.name}: FLUSH failed during the fault and "
          f"after it; a FUA write failed after it; reopened, FLUSH succeeds and "
          f"B's map word is on disk", flush=True)
