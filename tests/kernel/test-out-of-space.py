"""The filesystem under a sparse image fills up: the writes that cannot be
stored fail, everything else goes on.

The image (sparse, 256 MiB) lives on a small ext4 (on a scratch loop
device, not tmpfs: Linux 6.1's tmpfs has no O_DIRECT), which a filler file
makes nearly full.  Writer threads write distinct data with O_DIRECT to
distinct offsets of the attached device, in random order, until each has
seen writes fail.  Then, with the filesystem still full:
  * every write that succeeded reads back as written, and overwriting
    blocks that already have space still works, as does an fsync;
  * the failed writes failed with EIO (nbd has no other error for the
    client) or ENOSPC (loop, ublk);
  * the server is the one attach started and was never restarted, all its
    connections are open, `mloop status` counts the errors, and its log
    names the cause (mloop-server; nbdkit logs to syslog).
The filler is deleted: the offsets that failed, and new ones, take writes
again and read back as written, and the image file holds them all after
the detach."""
import mmap
import os
import random
import socket
import threading

import dmtarget
import kinds
from kfix import mount, run

FS_SIZE = 48 << 20
IMAGE_SIZE = 256 << 20
CHUNK = 16 << 10          # one write; 4 KiB-aligned offsets, CHUNK apart
LEFT_FREE = 4 << 20       # what the filler leaves of the filesystem
WRITERS = 4
FAILS_PER_WRITER = 4      # a writer stops after this many failed writes
MAX_WRITES = 4 * (LEFT_FREE // CHUNK) + 256  # the filesystem must fill by then
NOSPACE_LINE = "No space left on device"


def chunk_data(offset, generation):
    return random.Random(offset * 7919 + generation).randbytes(CHUNK)


class Device:
    """O_DIRECT access to the attached device from one thread, through
    an aligned buffer."""

    def __init__(self, dev):
        self.fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
        self.buf = mmap.mmap(-1, CHUNK)

    def write(self, offset, data):
        """None, or the errno of a failed write."""
        self.buf[:] = data
        try:
            n = os.pwrite(self.fd, self.buf, offset)
        except OSError as e:
            return e.errno
        assert n == CHUNK, f"short write at {offset}: {n} of {CHUNK} bytes"
        return None

    def read(self, offset):
        n = os.preadv(self.fd, [self.buf], offset)
        assert n == CHUNK, f"short read at {offset}: {n} of {CHUNK} bytes"
        return bytes(self.buf)

    def close(self):
        if self.fd != -1:
            os.close(self.fd)
            self.fd = -1
            self.buf.close()


def writer(dev, offsets, stored, failed, problems):
    """Writes generation 0 of each of OFFSETS until FAILS_PER_WRITER
    writes failed; records offset -> data in STORED, offset -> errno in
    FAILED."""
    d = Device(dev)
    try:
        fails = 0
        for off in offsets:
            data = chunk_data(off, 0)
            err = d.write(off, data)
            if err is None:
                stored[off] = data
            else:
                failed[off] = err
                fails += 1
                if fails == FAILS_PER_WRITER:
                    break
    except Exception as e:  # reported by the main thread
        problems.append(f"writer: {e!r}")
    finally:
        d.close()


def check_reads(d, stored, when):
    bad = [off for off, data in sorted(stored.items()) if d.read(off) != data]
    assert not bad, f"{when}: {len(bad)} of {len(stored)} acknowledged writes read back " \
        f"wrong, first at offsets {bad[:8]}"


def server_log(st):
    """The lines of the device's server.log (in its runtime directory)."""
    path = st["device"]["server_log"]
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


class Syslog:
    """Where nbdkit's messages go after it daemonizes: a /dev/log this test
    listens on, made only where there is none (the test VM has no syslog
    daemon); LINES collects what arrives."""

    PATH = "/dev/log"

    def __init__(self, cl):
        self.lines = []
        self.sock = None
        if os.path.lexists(self.PATH):
            return  # a real one: the messages are in the system's log
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.PATH)
        cl.push(self.close)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return  # closed
            self.lines.append(data.decode(errors="replace").rstrip("\0\n"))

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None
            os.unlink(self.PATH)


def free_bytes(mnt):
    s = os.statvfs(mnt)
    return s.f_bavail * s.f_frsize


def run_test(kind, cl):
    cli = isinstance(kind, kinds.MloopCli)
    disk = dmtarget.scratch_disk(cl, FS_SIZE)
    # -m 0: the server runs as root, which could use the blocks reserved
    # for root; nodiscard keeps mkfs quick on the sparse file.
    run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096",
         "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", disk])
    mnt = mount(cl, disk)
    image = os.path.join(mnt, "disk.img")
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    filler = os.path.join(mnt, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, free_bytes(mnt) - LEFT_FREE)
    finally:
        os.close(fd)

    syslog = Syslog(cl) if kind.name == "nbdkit" else None
    att = kind.attach(cl, image)
    dev = att.device
    before = kind.status(dev) if cli else None

    offsets = list(range(0, IMAGE_SIZE, CHUNK))
    random.Random(5).shuffle(offsets)
    offsets, spare = offsets[:MAX_WRITES], offsets[MAX_WRITES:]
    stored, failed, problems = {}, {}, []
    threads = [threading.Thread(target=writer,
                                args=(dev, offsets[w::WRITERS], stored, failed, problems))
               for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, "; ".join(problems)
    assert failed, f"the filesystem never filled: {len(stored)} writes of {CHUNK} bytes " \
        f"all succeeded ({free_bytes(mnt)} bytes free)"
    errnos = sorted({os.strerror(e) for e in failed.values()})
    # ENOSPC where the driver carries it (loop, ublk); NBD's EIO.
    want = {"loop": {28}, "ublk": {28}}.get(kind.name, {5})
    assert set(failed.values()) <= want, f"writes failed with {errnos}"
    print(f"# out-of-space {kind.name}: {len(stored)} writes stored, {len(failed)} failed "
          f"({', '.join(errnos)}), {free_bytes(mnt)} bytes free", flush=True)

    # Still full: what was acknowledged is there, overwrites and flushes work.
    d = Device(dev)
    cl.push(d.close)
    check_reads(d, stored, "filesystem full")
    for off in sorted(stored)[:16]:
        data = chunk_data(off, 1)
        err = d.write(off, data)
        assert err is None, f"filesystem full: overwriting {off}, which has its space, " \
            f"failed: {os.strerror(err)}"
        stored[off] = data
    os.fsync(d.fd)
    check_reads(d, stored, "filesystem full, after overwrites and fsync")

    if cli:
        full = kind.status(dev)
        kind.assert_same_server(dev, before, full)
        assert full.get("errors", 0) > 0, f"{dev}: mloop status counts no errors"
        # mloop-server logs to server.log; nbdkit, once daemonized, to syslog.
        where, log = ("server.log", server_log(full)) if syslog is None \
            else ("syslog", syslog.lines)
        nospace = [line for line in log if NOSPACE_LINE in line]
        print(f"# out-of-space {kind.name}: mloop status errors {full['errors']}; "
              f"{where}: {len(nospace)} of {len(log)} lines name ENOSPC"
              + (f", e.g. {nospace[0]!r}" if nospace else ""), flush=True)
        if syslog is None or syslog.sock is not None:
            assert nospace, f"{dev}: the server logged no line naming ENOSPC to {where}: " \
                f"{log[-5:]}"

    # Space again: the failed offsets and new ones take writes.
    os.unlink(filler)
    os.sync()
    again = {}
    for off in sorted(failed) + spare[:16]:
        data = chunk_data(off, 2)
        err = d.write(off, data)
        assert err is None, f"after freeing space, writing {off} failed: {os.strerror(err)}"
        again[off] = data
    stored.update(again)
    os.fsync(d.fd)
    check_reads(d, stored, "after freeing space")
    if cli:
        after = kind.status(dev)
        kind.assert_same_server(dev, before, after)
        assert after.get("errors") == full.get("errors"), \
            f"{dev}: errors went from {full.get('errors')} to {after.get('errors')} " \
            f"with space free"
    d.close()
    att.detach()

    # The image file itself holds every acknowledged write.
    with open(image, "rb") as f:
        bad = [off for off, data in sorted(stored.items())
               if os.pread(f.fileno(), CHUNK, off) != data]
    assert not bad, f"the image file differs from acknowledged writes at {bad[:8]}"
