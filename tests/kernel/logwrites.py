#!/usr/bin/python3
"""Reads the log the kernel's dm-log-writes target keeps and replays it.

dm-log-writes (drivers/md/dm-log-writes.c, Documentation/admin-guide/
device-mapper/log-writes.rst) passes writes through to a data device and
appends each one, in the order it became stable, to a log device.  Replaying
the log onto a copy of the data device's starting contents up to any FLUSH
or FUA entry rebuilds exactly what a disk that lost power right after that
entry would hold: the power-cut test (test-power-cut.py) uses that to check
a filesystem at every such point.

The on-disk format, all little-endian, in units of the data device's logical
block size ("sectorsize", stored in the super block):
  block 0       super: magic u64, version u64, nr_entries u64, sectorsize u32
  then, nr_entries times:
    one block   entry: sector u64, nr_sectors u64, flags u64, data_len u64
                (sector and nr_sectors count sectorsize blocks of the data
                device); a MARK entry's name (data_len bytes) follows the
                entry header inside that same block
    nr_sectors blocks of written data, unless the entry is a DISCARD (a
                discard's range is in the entry, its data is not logged)

The super's nr_entries is only rewritten at FUA and MARK entries, so it can
lag the entries actually present: after a clean teardown the target logs a
final "dm-log-writes-end" mark, which brings it up to date.

  logwrites.py list LOG             every entry, one line each
  logwrites.py points LOG           the FLUSH/FUA entries (replay points)
  logwrites.py replay LOG TARGET N  applies entries 0..N (inclusive) to TARGET
"""
import os
import struct
import sys

MAGIC = 0x6a736677736872
VERSION = 1
FLUSH, FUA, DISCARD, MARK, METADATA = 1, 2, 4, 8, 16
_SUPER = struct.Struct("<QQQI")
_ENTRY = struct.Struct("<QQQQ")


class LogError(Exception):
    """The log is not a dm-log-writes log, or is cut short."""


class Entry:
    """One logged request.  INDEX counts from 0; DATA_OFFSET is where its
    written data starts in the log (meaningful when nr_sectors and not a
    discard); MARK is the mark's name (str) for mark entries."""

    __slots__ = ("index", "sector", "nr_sectors", "flags", "data_len",
                 "data_offset", "mark")

    def __init__(self, index, sector, nr_sectors, flags, data_len, data_offset, mark):
        self.index, self.sector, self.nr_sectors = index, sector, nr_sectors
        self.flags, self.data_len, self.data_offset = flags, data_len, data_offset
        self.mark = mark

    def flag_names(self):
        return "|".join(n for bit, n in [(FLUSH, "FLUSH"), (FUA, "FUA"),
                                         (DISCARD, "DISCARD"), (MARK, "MARK"),
                                         (METADATA, "METADATA")]
                        if self.flags & bit) or "-"

    def __repr__(self):
        extra = f" mark={self.mark!r}" if self.mark is not None else ""
        return (f"{self.index} sector={self.sector} nr_sectors={self.nr_sectors} "
                f"flags={self.flag_names()}{extra}")


class Log:
    """A dm-log-writes log (a file or the log block device), opened read-only."""

    def __init__(self, path):
        self.f = open(path, "rb")
        head = self.f.read(_SUPER.size)
        if len(head) < _SUPER.size:
            raise LogError(f"{path}: too short for a super block")
        magic, version, self.nr_entries, self.sectorsize = _SUPER.unpack(head)
        if magic != MAGIC:
            raise LogError(f"{path}: bad magic {magic:#x}, not a dm-log-writes log")
        if version != VERSION:
            raise LogError(f"{path}: log version {version}, only {VERSION} is known")
        if self.sectorsize < 512 or self.sectorsize & (self.sectorsize - 1):
            raise LogError(f"{path}: implausible sector size {self.sectorsize}")

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def entries(self):
        """Yields every entry the super block counts, in log order."""
        bs = self.sectorsize
        pos = bs  # the super takes the first block
        for index in range(self.nr_entries):
            self.f.seek(pos)
            block = self.f.read(bs)
            if len(block) < bs:
                raise LogError(f"entry {index} at byte {pos}: log cut short")
            sector, nr, flags, data_len = _ENTRY.unpack_from(block)
            mark = None
            if flags & MARK:
                if data_len > bs - _ENTRY.size:
                    raise LogError(f"entry {index}: mark of {data_len} bytes")
                mark = block[_ENTRY.size:_ENTRY.size + data_len].decode(errors="replace")
            pos += bs
            yield Entry(index, sector, nr, flags, data_len, pos, mark)
            # A discard logs its range only; everything else is followed by
            # the data it wrote (the kernel advances by nr_sectors + 1 blocks).
            if not flags & DISCARD:
                pos += nr * bs

    def points(self):
        """The FLUSH and FUA entries: where a power cut may be simulated."""
        return [e for e in self.entries() if e.flags & (FLUSH | FUA)]

    def replay(self, target, upto, start=0, entries=None):
        """Applies entries START..UPTO (inclusive) to the file or block device
        TARGET, opened by path or given as a writable binary file object.
        Replaying in steps (start = previous upto + 1) onto the same target
        gives the same result as one replay from 0.  ENTRIES, a list from
        entries(), saves re-reading the headers."""
        own = isinstance(target, (str, bytes, os.PathLike))
        t = open(target, "r+b") if own else target
        bs = self.sectorsize
        try:
            for e in (entries if entries is not None else self.entries()):
                if e.index < start:
                    continue
                if e.index > upto:
                    break
                if e.flags & MARK or e.nr_sectors == 0:
                    continue  # marks and empty flushes change no data
                t.seek(e.sector * bs)
                left = e.nr_sectors * bs
                if e.flags & DISCARD:
                    # What a discarded range reads back as is up to the
                    # device; zeroes are what the filesystem must cope with.
                    while left:
                        n = min(left, 1 << 20)
                        t.write(bytes(n))
                        left -= n
                    continue
                self.f.seek(e.data_offset)
                while left:
                    chunk = self.f.read(min(left, 1 << 20))
                    if not chunk:
                        raise LogError(f"entry {e.index}: data cut short")
                    t.write(chunk)
                    left -= len(chunk)
            t.flush()
        finally:
            if own:
                t.close()


def main(argv):
    if len(argv) < 3 or argv[1] not in ("list", "points", "replay"):
        print(__doc__.strip().splitlines()[-3:], file=sys.stderr)
        return 2
    with Log(argv[2]) as log:
        if argv[1] == "list":
            print(f"# {log.nr_entries} entries, sectorsize {log.sectorsize}")
            for e in log.entries():
                print(e)
        elif argv[1] == "points":
            for e in log.points():
                print(e)
        else:
            log.replay(argv[3], int(argv[4]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
