#!/usr/bin/python3
"""mloop-server serving Ceph RBD images (rbd:POOL/IMAGE[@SNAP]) from a real
one-node cluster (tests/ceph/cluster.py), checked against what Ceph holds,
and the same images through nbdkit's plugin (rbd=) and `mloop serve`:

1. data written through the server at odd offsets and lengths, on an
   image of an odd size (64 MiB + 4097) to its last byte, reads back the
   same through the server and, once it has stopped, through `rbd export`;
2. FUA writes and FLUSH succeed; TRIM (unaligned and of whole objects)
   and WRITE_ZEROES (plain, NO_HOLE, FAST_ZERO) read back as zeroes;
   BLOCK_STATUS base:allocation follows the image's allocation (written
   data: flags 0; never written and trimmed objects: HOLE|ZERO); CACHE,
   when offered, succeeds; size and block sizes (minimum 1, preferred
   512) are the image's;
3. a snapshot (@SNAP) serves the data it was taken with, read-only
   (EPERM, can_write false), while a writer changes the image; `-r` on
   the image serves it read-only; neither takes the exclusive lock;
4. a writable server holds the image's exclusive lock from its start and
   releases it when stopped; a second writer is refused in one line
   naming the holder, and the first keeps serving; two `--shared`
   servers both serve the image; a missing image, pool or snapshot, a
   bad spec, a missing ceph.conf and a --ceph-id with no keyring or a
   key the cluster does not know are each refused quickly in one line;
5. a writer killed with SIGKILL while serving: a new server on the image
   with the same --lock-record (as a device's restarted server has)
   breaks the dead one's lock and starts at once, where librbd would
   wait for the OSD to drop the dead client's watch (30 s), and what was
   flushed before the kill is there; a writer that was only stopped
   (SIGSTOP) when its successor broke its lock fails every request with
   EIO once it runs again (the cluster blocklisted it), saying so once in
   its log, and its late write is not in the image;
6. nbdkit -f with the plugin's rbd=POOL/IMAGE (ceph-conf=, ceph-id=):
   the image's size, writes across an object boundary and at its last
   bytes read back after FLUSH, a trimmed object reads as zeroes and is
   HOLE|ZERO as a never-written one is, written data flags 0; it holds
   the exclusive lock and releases it on SIGTERM; `rbd export` has what
   it wrote; rbd=POOL/IMAGE@SNAP serves the snapshot's data read-only
   (EPERM) beside a writer; a missing image makes nbdkit exit non-zero
   with one line;
7. options in the name (rbd:POOL/IMAGE:conf=FILE:id=NAME): mloop-server
   serves it with no --ceph-conf or --ceph-id, and the options win over
   a --ceph-conf of a missing file and a --ceph-id with no keyring;
   :shared=on takes no lock at the start and two servers write beside
   each other; an unknown option (:foo=1) and shared=maybe are refused
   in one line, and so are --offset and --sizelimit (a window is a
   file's); nbdkit's rbd= takes the options too (and refuses :foo=1);
8. `mloop serve --ceph-conf C --ceph-id ID --listen unix:S rbd:POOL/IMAGE`
   with --server native and --server nbdkit: each reads the other's
   writes and `rbd export` has both; `mloop serve --ceph-conf C FILE` is
   refused in one line saying the option is for RBD images;
9. the cluster lost: with --io-timeout 3, while every daemon is
   paused (SIGSTOP: nothing answers, connections stay open) a READ and a
   WRITE fail with EIO in 3-5 s, and so does a READ through nbdkit's
   io-timeout=3, while a server without --io-timeout keeps its READ
   waiting; once the daemons resume, that READ completes with the data,
   and each server's same connection reads what was written before and
   writes again; the server says once that the cluster did not answer in
   3 s and once that it answers again.  Then the cluster is shut down
   (SIGTERM, the OSD first): a READ fails with EIO in 3-5 s; started again
   on its data, the same connection reads and writes again and the
   server still holds the image's exclusive lock.  --io-timeout -1 and
   --io-timeout x, io-timeout=-1 and io-timeout=x, are refused in one
   line naming the option;
10. no server, daemon or file is left.

nbdkit 1.32 leaves its -U socket and pid file when it exits: 6 to 9 do
not ask nbdkit to remove them.

SKIPs (77) without the Ceph packages or python3-libnbd.  Fails at once,
before starting a cluster, when mloop-server has no --ceph-conf option.
Without nbdkit or the built plugin (MLOOP_PLUGIN) the nbdkit checks of
6 to 9 are skipped, and without the built mloop (MLOOP_CLI) those of 8,
each saying so; the rest runs.

Run by hand from the repository root:
  MLOOP_SERVER_BIN=build/server/mloop-server \\
      MLOOP_PLUGIN=build/plugin/nbdkit-mloop-plugin.so \\
      MLOOP_CLI=build/client/mloop PYTHONPATH=tests:tests/ceph \\
      /usr/bin/python3 tests/ceph/test-rbd-server.py

Cost on the project machine (2 cores): about 26 s alone: the cluster's
start 5-8 s, every section under 2.5 s (6 to 8 together 3 s) but 9,
about 13 s (two waits of the 3 s timeout, 3 s more for the server to
say the cluster answers again, the shut-down cluster's start 3-8 s);
about 65 s beside test-cluster.py, which `meson test` runs at the same
time (9 then takes up to 20 s).  A server that dies on SIGTERM instead
of closing the image leaves its lock to time out the same way: then
`rbd snap create` in the snapshot sections waits 30 s more.
"""
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import cluster  # tests/ceph, beside this file

reason = cluster.missing_reason()
if reason:
    print(f"SKIP: {reason}")
    sys.exit(77)

# The harness checks for mloop-server; nbdkit and the plugin are looked
# for by their own checks (6 to 9), which skip without them.
os.environ.setdefault("MLOOP_SERVER", "native")
import harness  # tests/: skips without python3-libnbd or MLOOP_SERVER_BIN
import procstop  # tests/: a SIGSTOP that has taken effect
import nbd

if harness.SERVER_KIND != "native":
    harness.skip("this test drives mloop-server first (MLOOP_SERVER=native)")

from harness import check

SERVER_BIN = harness.SERVER_BIN
MiB = 1 << 20
HOLE = nbd.STATE_HOLE | nbd.STATE_ZERO
START_LIMIT = 30      # seconds a server may take to start on a live image
REFUSE_LIMIT = 10     # seconds a refusal may take (librados answers in ms)
RESTART_LIMIT = 5     # seconds to start after a SIGKILLed writer (its lock broken)
RESTART_WAIT = 120    # how long to wait for it before giving up

# A server without RBD support fails here, in a second, not after a cluster.
helptext = subprocess.run([SERVER_BIN, "--help"], capture_output=True, text=True).stdout
if "--ceph-conf" not in helptext:
    check("mloop-server has RBD support", False,
          f"{SERVER_BIN} --help lists no --ceph-conf option (built without librbd?)")
    harness.exit_if_failed()


class Abort(Exception):
    """Ends a section whose next step cannot run (its check already failed)."""


def first_difference(a, b):
    if a == b:
        return "equal"
    if len(a) != len(b):
        return f"lengths {len(a)} and {len(b)}"
    for i in range(0, len(a), 4096):
        if a[i:i + 4096] != b[i:i + 4096]:
            j = next(k for k in range(i, min(i + 4096, len(a))) if a[k] != b[k])
            return f"first difference at byte {j}: {a[j]:#x} != {b[j]:#x}"
    return "equal"


def same(name, got, want):
    return check(name, got == want, first_difference(got, want))


servers = []


class RbdServer:
    """mloop-server on an rbd: spec, in the foreground on a private Unix
    socket; stderr kept apart from stdout (a refusal must be one line)."""

    def __init__(self, spec, *opts, ceph_id=None, conf=None, argv=None, env=None,
                 ready_on_socket=False):
        """ARGV(self), when given, is the command instead (nbdkit, `mloop
        serve`, mloop-server without --ceph-*), SPEC then only its label;
        READY_ON_SOCKET: it writes no pid file, it is ready once its
        socket is there."""
        self.dir = c.path("test", f"server{len(servers)}")
        os.mkdir(self.dir)
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.pid_file = os.path.join(self.dir, "server.pid")
        self.ready_path = self.sock if ready_on_socket else self.pid_file
        self.err_path = os.path.join(self.dir, "stderr")
        self.spec = spec
        self.handles = []
        if argv:
            cmd = argv(self)
        else:
            cmd = [SERVER_BIN, "--listen", f"unix:{self.sock}", "--pid-file", self.pid_file,
                   f"--ceph-conf={conf or c.conf}", f"--ceph-id={ceph_id or c.client_id}",
                   *opts, spec]
        with open(os.path.join(self.dir, "stdout"), "wb") as out, \
                open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=err, env=env,
                                         preexec_fn=cluster._die_with(os.getpid()))
        self.started = time.monotonic()
        self.elapsed = None
        servers.append(self)

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=START_LIMIT):
        """Whether it listens (wrote its pid file) within TIMEOUT; sets
        elapsed either way (at its exit if it exited)."""
        deadline = self.started + timeout
        while not os.path.exists(self.ready_path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.elapsed = time.monotonic() - self.started
                return False
            time.sleep(0.02)
        self.elapsed = time.monotonic() - self.started
        return True

    def wait_exit(self, timeout):
        """Its exit status, or None if it still runs after TIMEOUT."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.elapsed = time.monotonic() - self.started
        return self.proc.poll()

    def why(self):
        state = (f"exited {self.proc.returncode}" if self.proc.poll() is not None
                 else "still running, not listening")
        return f"{state} after {self.elapsed:.1f} s; stderr: {self.stderr().strip()!r}"

    def connect(self, strict=True):
        deadline = time.monotonic() + 5
        while True:
            h = nbd.NBD()
            if not strict:
                h.set_strict_mode(0)  # let refused requests reach the server
            h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
            try:
                h.connect_unix(self.sock)
                break
            except nbd.Error as e:
                # Ready on its socket: bound, maybe not listening yet.
                if (e.errno != "ECONNREFUSED" or self.proc.poll() is not None
                        or time.monotonic() > deadline):
                    raise
                time.sleep(0.02)
        self.handles.append(h)
        return h

    def stop(self, timeout=30):
        """SIGTERM, as a user stops it; SIGKILL after TIMEOUT.  Returns the
        exit status (negative: killed)."""
        for h in self.handles:
            try:
                h.shutdown()
            except nbd.Error:
                pass
        self.handles = []
        if not harness.terminate(self.proc, timeout):
            print(f"# {self.spec}: no exit within {timeout} s of SIGTERM: killed")
        return self.proc.returncode


def start(what, spec, *opts, timeout=START_LIMIT, **kw):
    """A server that must start; Abort (after a failed check) if it does not."""
    s = RbdServer(spec, *opts, **kw)
    ok = s.wait_ready(timeout)
    if not check(f"{what} starts ({s.elapsed:.1f} s)", ok, s.why() if not ok else ""):
        s.stop(5)
        raise Abort(what)
    return s


def stop(what, s, removes_socket=True):
    """Stops S, which must exit 0 on SIGTERM and (if REMOVES_SOCKET: not
    nbdkit 1.32, which leaves its -U socket) remove its socket."""
    rc = s.stop()
    left = os.path.exists(s.sock)
    check(f"{what} exits 0 on SIGTERM" + (" and removes its socket" if removes_socket else ""),
          rc == 0 and not (removes_socket and left),
          f"exit {rc}, socket {'left' if left else 'removed'}; "
          f"stderr: {s.stderr().strip()!r}")


def locks(image):
    """The image's locks as `rbd lock ls` lists them (the exclusive lock is
    one, id "auto COOKIE"): [{"id", "locker", "address"}]."""
    return json.loads(c.rbd("lock", "ls", "--format", "json", c.spec(image)).strip() or "[]")


def export(spec):
    path = c.path("test", "export")
    c.rbd("export", "--no-progress", spec, path)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def read_all(h, size):
    return b"".join(h.pread(min(4 * MiB, size - o), o) for o in range(0, size, 4 * MiB))


def extents(h, start, end):
    """base:allocation as [(offset, length, flags)] covering [START, END)."""
    out, pos = [], start
    while pos < end:
        got = []

        def cb(metacontext, offset, entries, err):
            if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries)
        h.block_status(end - pos, pos, cb)
        if not got or 0 in got[0::2]:
            raise AssertionError(f"BLOCK_STATUS at {pos}: no progress: {got!r}")
        for i in range(0, len(got), 2):
            out.append((pos, got[i], got[i + 1]))
            pos += got[i]
    return out


def covered(ext, start, end, flags):
    """Whether every extent overlapping [START, END) has FLAGS."""
    return all(f == flags for o, n, f in ext if o < end and o + n > start)


def show(ext, start, end):
    return [(o, n, f) for o, n, f in ext if o < end and o + n > start]


def write(h, model, off, data, flags=0):
    h.pwrite(data, off, flags)
    model[off:off + len(data)] = data


def refused_in_one_line(what, s, words, limit=REFUSE_LIMIT, cleans_up=True):
    """S must exit non-zero within LIMIT with one line on stderr holding
    one of WORDS (case-insensitive), and (if CLEANS_UP: not nbdkit 1.32,
    which leaves its -U socket and pid file) leave no socket or pid file."""
    rc = s.wait_exit(60)
    if rc is None:
        s.stop(5)
    err = s.stderr().strip()
    lines = err.splitlines()
    print(f"# {what}: {err!r}")
    check(f"{what}: refused, exit non-zero ({s.elapsed:.2f} s)",
          rc is not None and rc > 0, s.why())
    check(f"{what}: refused within {limit} s", s.elapsed < limit, f"{s.elapsed:.1f} s")
    check(f"{what}: one line on stderr naming the cause",
          len(lines) == 1 and any(w.lower() in err.lower() for w in words),
          f"wanted one line with one of {words}: {err!r}")
    if cleans_up:
        check(f"{what}: leaves no socket or pid file",
              not os.path.exists(s.sock) and not os.path.exists(s.pid_file))
    return err


# --- 1 and 2: data, commands and allocation ------------------------------

SIZE = 64 * MiB + 4097
# (offset, length): odd ones, object (4 MiB) boundaries crossed, the
# partial last object, the last byte, and an overwrite inside an earlier one.
WRITES = [(0, 1), (511, 2), (4095, 8193), (4096 + 100, 50), (4 * MiB - 3, 7),
          (7 * MiB + 12345, MiB + 4097), (33 * MiB + 1, 5 * MiB + 1),
          (SIZE - 4097 - 3, 4100), (SIZE - 1, 1)]
WRITTEN_AT = (12 * MiB + 100, MiB)        # before anything else: a fresh image
NEVER_WRITTEN = (52 * MiB, 60 * MiB)      # stays a hole to the end
TRIM_UNALIGNED = (30 * MiB + 1000, 2 * MiB + 333)
TRIM_OBJECTS = (40 * MiB, 48 * MiB)       # two whole objects
ZEROES = [("plain", 20 * MiB + 7, 2 * MiB + 9, 0),
          ("NO_HOLE", 24 * MiB - 5, MiB + 10, nbd.CMD_FLAG_NO_HOLE),
          ("FAST_ZERO", 26 * MiB + 1, 3 * MiB, nbd.CMD_FLAG_FAST_ZERO)]


def section_data():
    c.create_image("disk", SIZE)
    model = bytearray(SIZE)
    rng = random.Random(1)
    w = start("a writable server on a fresh image", f"rbd:{c.spec('disk')}")
    lk = locks("disk")
    check("the writable server holds the image's exclusive lock from its start",
          len(lk) == 1 and lk[0]["id"].startswith("auto "), repr(lk))
    h = w.connect()
    check("the export is the image's size, 64 MiB + 4097", h.get_size() == SIZE,
          f"{h.get_size()}")
    check("minimum block size 1, preferred 512",
          (h.get_block_size(nbd.SIZE_MINIMUM), h.get_block_size(nbd.SIZE_PREFERRED))
          == (1, 512),
          f"{h.get_block_size(nbd.SIZE_MINIMUM)}, {h.get_block_size(nbd.SIZE_PREFERRED)}")
    offered = {"write": not h.is_read_only(), "flush": h.can_flush(), "FUA": h.can_fua(),
               "trim": h.can_trim(), "write zeroes": h.can_zero(),
               "fast zero": h.can_fast_zero(),
               "base:allocation": h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)}
    check("offers write, flush, FUA, trim, write zeroes, fast zero, base:allocation",
          all(offered.values()), repr(offered))

    # Allocation of a fresh image with one write.
    off, n = WRITTEN_AT
    write(h, model, off, rng.randbytes(n))
    h.flush()
    ext = extents(h, 0, SIZE)
    check("BLOCK_STATUS: the written range is data (flags 0)",
          covered(ext, off, off + n, 0), repr(show(ext, off, off + n)))
    check("BLOCK_STATUS: a never-written range is HOLE|ZERO",
          covered(ext, *NEVER_WRITTEN, HOLE), repr(show(ext, *NEVER_WRITTEN)))
    check("BLOCK_STATUS: the never-written partial last object is HOLE|ZERO",
          covered(ext, 64 * MiB, SIZE, HOLE), repr(show(ext, 64 * MiB, SIZE)))
    check("BLOCK_STATUS covers the export exactly",
          sum(n for _, n, _ in ext) == SIZE, repr(ext[-3:]))

    # Odd writes, each read back.
    for off, n in WRITES:
        write(h, model, off, rng.randbytes(n))
    bad = [(off, n) for off, n in WRITES if h.pread(n, off) != model[off:off + n]]
    check(f"{len(WRITES)} writes at odd offsets and lengths read back", not bad, repr(bad))
    check("the last byte reads back", h.pread(1, SIZE - 1) == model[-1:])

    # FUA and FLUSH.
    off = 17 * MiB - 1
    data = rng.randbytes(MiB + 3)
    try:
        write(h, model, off, data, nbd.CMD_FLAG_FUA)
        h.flush()
        ok, detail = h.pread(len(data), off) == data, "read back differs"
    except nbd.Error as e:
        ok, detail = False, str(e)
    check("a FUA write and a FLUSH succeed and the write reads back", ok, detail)

    # TRIM: unaligned (librbd skips partial objects unless told not to),
    # then whole objects.
    for what, (start_, end) in (("unaligned", (TRIM_UNALIGNED[0], sum(TRIM_UNALIGNED))),
                                ("of whole objects", TRIM_OBJECTS)):
        write(h, model, start_, rng.randbytes(end - start_))
        h.flush()
        h.trim(end - start_, start_)
        model[start_:end] = bytes(end - start_)
        got = h.pread(end - start_, start_)
        same(f"TRIM {what} [{start_}, {end}) reads back as zeroes", got, model[start_:end])
    ext = extents(h, *TRIM_OBJECTS)
    check("BLOCK_STATUS: trimmed whole objects are HOLE|ZERO",
          covered(ext, *TRIM_OBJECTS, HOLE), repr(show(ext, *TRIM_OBJECTS)))

    # WRITE_ZEROES over data.
    for what, off, n, flags in ZEROES:
        write(h, model, off, rng.randbytes(n))
        try:
            h.zero(n, off, flags)
            model[off:off + n] = bytes(n)
            same(f"WRITE_ZEROES ({what}) reads back as zeroes", h.pread(n, off),
                 model[off:off + n])
        except nbd.Error as e:
            check(f"WRITE_ZEROES ({what}) succeeds", False, str(e))
            model[off:off + n] = h.pread(n, off)  # whatever it left

    if h.can_cache():
        try:
            h.cache(8 * MiB, 0)
            check("CACHE succeeds", True)
        except nbd.Error as e:
            check("CACHE succeeds", False, str(e))
    else:
        print("# CACHE is not offered")

    ext = extents(h, 0, SIZE)
    check("BLOCK_STATUS: the never-written range is still HOLE|ZERO at the end",
          covered(ext, *NEVER_WRITTEN, HOLE), repr(show(ext, *NEVER_WRITTEN)))
    same("the whole export reads back as written", read_all(h, SIZE), bytes(model))
    h.flush()
    stop("the writable server", w)
    check("it released the exclusive lock", locks("disk") == [], repr(locks("disk")))
    same("rbd export of the image equals what was written through the server",
         export(c.spec("disk")), bytes(model))


# --- 3: a snapshot, and -r ------------------------------------------------

SIZE2 = 16 * MiB + 513


def section_snapshot():
    c.create_image("snapimg", SIZE2)
    rng = random.Random(2)
    a = bytearray(SIZE2)
    w = start("a writer of data A", f"rbd:{c.spec('snapimg')}")
    h = w.connect()
    for off, n in ((MiB - 7, 3 * MiB), (SIZE2 - 600, 600)):
        write(h, a, off, rng.randbytes(n))
    h.flush()
    stop("the writer of A", w)
    c.rbd("snap", "create", c.spec("snapimg", "s1"))

    b = bytearray(a)
    w = start("a writer of data B over A", f"rbd:{c.spec('snapimg')}")
    h = w.connect()
    for off, n in ((2 * MiB, 3 * MiB + 11), (SIZE2 - 100, 100)):
        write(h, b, off, rng.randbytes(n))
    h.flush()
    held = locks("snapimg")
    snap = start("a server of @s1 beside the writer", f"rbd:{c.spec('snapimg', 's1')}")
    ro = start("a -r server of the image beside the writer", f"rbd:{c.spec('snapimg')}", "-r")
    check("neither read-only server took or broke the writer's lock",
          locks("snapimg") == held and len(held) == 1, f"{held!r} -> {locks('snapimg')!r}")

    hs = snap.connect(strict=False)
    check("@s1: can_write is false", hs.is_read_only())
    check("@s1: the export is the image's size", hs.get_size() == SIZE2, f"{hs.get_size()}")
    same("@s1 reads A, not the B written after it", read_all(hs, SIZE2), bytes(a))
    for name, fn, args in (("WRITE", hs.pwrite, (b"x" * 512, 0)),
                           ("WRITE_ZEROES", hs.zero, (512, 0)),
                           ("TRIM", hs.trim, (512, 0))):
        try:
            harness.expect_error(errno.EPERM, fn, *args)
            check(f"@s1: {name} fails with EPERM", True)
        except AssertionError as e:
            check(f"@s1: {name} fails with EPERM", False, str(e))
    hr = ro.connect(strict=False)
    check("-r: can_write is false", hr.is_read_only())
    same("-r reads the image's B", read_all(hr, SIZE2), bytes(b))
    try:
        harness.expect_error(errno.EPERM, hr.pwrite, b"x" * 512, 0)
        check("-r: WRITE fails with EPERM", True)
    except AssertionError as e:
        check("-r: WRITE fails with EPERM", False, str(e))

    # The writer still writes: it kept its lock.
    off = 9 * MiB + 3
    data = rng.randbytes(4099)
    write(h, b, off, data)
    h.flush()
    check("the writer still writes beside them", h.pread(len(data), off) == data)
    stop("the writer of B", w)
    check("with only read-only servers left, the image has no lock",
          locks("snapimg") == [], repr(locks("snapimg")))
    same("@s1 still reads A after the writer's last write", read_all(hs, SIZE2), bytes(a))
    stop("the @s1 server", snap)
    stop("the -r server", ro)
    same("rbd export of the image is B", export(c.spec("snapimg")), bytes(b))
    same("rbd export of @s1 is A", export(c.spec("snapimg", "s1")), bytes(a))


# --- 4: the exclusive lock, --shared, and refusals ------------------------

SIZE3 = 8 * MiB + 1


def section_lock():
    c.create_image("lockimg", SIZE3)
    rng = random.Random(3)
    w1 = start("a first writer", f"rbd:{c.spec('lockimg')}")
    held = locks("lockimg")
    if not check("the first writer holds the exclusive lock", len(held) == 1, repr(held)):
        raise Abort("no lock")
    holder = held[0]
    w2 = RbdServer(f"rbd:{c.spec('lockimg')}")
    err = refused_in_one_line("a second writer", w2, ["lock"])
    check("the second writer's refusal names the lock's holder",
          holder["locker"] in err or holder["address"] in err,
          f"holder {holder['locker']} at {holder['address']}: {err!r}")
    check("the first writer still holds the lock", locks("lockimg") == held,
          repr(locks("lockimg")))
    h = w1.connect()
    data = rng.randbytes(10000)
    h.pwrite(data, 12345)
    h.flush()
    check("the first writer still writes", h.pread(len(data), 12345) == data)
    stop("the first writer", w1)


def section_shared():
    c.create_image("sharedimg", SIZE3)
    rng = random.Random(5)
    s1 = start("a --shared writer", f"rbd:{c.spec('sharedimg')}", "--shared")
    s2 = start("a second --shared writer", f"rbd:{c.spec('sharedimg')}", "--shared")
    h1, h2 = s1.connect(), s2.connect()
    check("both --shared servers are writable", not h1.is_read_only() and not h2.is_read_only())
    x, y = rng.randbytes(5000), rng.randbytes(7000)
    t = time.monotonic()
    try:
        h1.pwrite(x, 2 * MiB + 1)
        h1.flush()
        ok1 = h2.pread(len(x), 2 * MiB + 1) == x
        h2.pwrite(y, 6 * MiB - 3)
        h2.flush()
        ok2 = h1.pread(len(y), 6 * MiB - 3) == y
        detail = ""
    except nbd.Error as e:
        ok1 = ok2 = False
        detail = str(e)
    check("--shared: what one writes and flushes the other reads", ok1, detail)
    check(f"--shared: and the other way ({time.monotonic() - t:.2f} s for both)", ok2, detail)
    stop("the first --shared server", s1)
    stop("the second --shared server", s2)
    got = export(c.spec("sharedimg"))
    check("rbd export has both --shared servers' writes",
          got[2 * MiB + 1:2 * MiB + 1 + len(x)] == x and got[6 * MiB - 3:6 * MiB - 3 + len(y)] == y)


def section_refusals():
    """Bad input: each refused quickly, in one line."""
    c.create_image("refimg", SIZE3)
    ghost_keyring = c.path("test", "client.ghost.keyring")
    subprocess.run(["ceph-authtool", "--create-keyring", ghost_keyring, "--gen-key",
                    "-n", "client.ghost"], check=True, capture_output=True)
    ghost_conf = c.path("test", "ghost.conf")
    with open(c.conf) as f, open(ghost_conf, "w") as g:
        g.write(f.read() + f"\n[client.ghost]\nkeyring = {ghost_keyring}\n")
    os.chmod(ghost_conf, 0o644)  # a server reads no one else's (any umask)
    pool = c.pool
    for what, spec, kw, words in [
            ("a missing image", f"rbd:{pool}/nosuch", {}, ["nosuch"]),
            ("a missing pool", "rbd:nopool/refimg", {}, ["nopool"]),
            ("a missing snapshot", f"rbd:{pool}/refimg@nosnap", {}, ["nosnap"]),
            ("the spec rbd:", "rbd:", {}, ["rbd:", "spec", "pool", "image"]),
            (f"the spec rbd:{pool}/", f"rbd:{pool}/", {}, ["rbd:", "spec", "image"]),
            (f"the spec rbd:{pool}/refimg@", f"rbd:{pool}/refimg@", {},
             ["rbd:", "spec", "snap"]),
            ("a missing --ceph-conf file", f"rbd:{pool}/refimg",
             {"conf": c.path("test", "nosuch.conf")}, ["nosuch.conf"]),
            ("--ceph-id with no keyring", f"rbd:{pool}/refimg",
             {"ceph_id": "nobody"}, ["nobody", "keyring"]),
            ("--ceph-id with a key the cluster does not know", f"rbd:{pool}/refimg",
             {"ceph_id": "ghost", "conf": ghost_conf},
             ["ghost", "auth", "permission", "denied"])]:
        refused_in_one_line(what, RbdServer(spec, **kw), words)


# --- 6, 7 and 8: the nbdkit plugin, options in the name, `mloop serve` ----

PLUGIN = os.environ.get("MLOOP_PLUGIN")
MLOOP_CLI = os.environ.get("MLOOP_CLI")
if shutil.which("nbdkit") is None:
    PLUGIN_MISSING = "nbdkit is not installed"
elif not PLUGIN or not os.path.exists(PLUGIN):
    PLUGIN_MISSING = "MLOOP_PLUGIN does not name the built plugin"
else:
    PLUGIN_MISSING = ""
SIZE5 = 16 * MiB + 7


def ceph_params():
    return [f"ceph-conf={c.conf}", f"ceph-id={c.client_id}"]


def with_options(image, **opts):
    """POOL/IMAGE with qemu-style options: POOL/IMAGE:conf=C:id=ID..."""
    return c.spec(image) + "".join(f":{k}={v}" for k, v in opts.items())


def nbdkit_argv(rbd, *params):
    """nbdkit in the foreground serving rbd=RBD with the plugin.  It
    writes its pid file before .after_fork opens the image: a server that
    cannot open it exits then (and resets the connections waiting)."""
    return lambda s: ["nbdkit", "-f", "-U", s.sock, "-P", s.pid_file, PLUGIN,
                      f"rbd={rbd}", *params]


def server_argv(name, *opts):
    """mloop-server on NAME with only OPTS (no --ceph-conf, --ceph-id)."""
    return lambda s: [SERVER_BIN, "--listen", f"unix:{s.sock}", "--pid-file", s.pid_file,
                      *opts, name]


def serve_argv(*args):
    """`mloop serve --listen unix:SOCK ARGS`: it execs the server."""
    return lambda s: [MLOOP_CLI, "serve", "--listen", f"unix:{s.sock}", *args]


def plugin(what, rbd, *params):
    return start(what, f"nbdkit rbd={rbd}", argv=nbdkit_argv(rbd, *params),
                 env=harness.nbdkit_env())


def expect_eperm(what, fn, *args):
    try:
        harness.expect_error(errno.EPERM, fn, *args)
        check(f"{what} fails with EPERM", True)
    except AssertionError as e:
        check(f"{what} fails with EPERM", False, str(e))


def section_plugin():
    """nbdkit with the plugin's rbd=: data, trim and allocation, a
    snapshot, a missing image."""
    if PLUGIN_MISSING:
        print(f"# SKIP the nbdkit plugin's checks: {PLUGIN_MISSING}")
        return
    c.create_image("plugimg", SIZE5)
    rng = random.Random(6)
    model = bytearray(SIZE5)
    p = plugin("nbdkit with rbd=", c.spec("plugimg"), *ceph_params())
    h = p.connect()
    check("nbdkit rbd=: the export is the image's size, writable, with trim and "
          "base:allocation",
          (h.get_size(), h.is_read_only(), h.can_trim(), h.can_flush(),
           h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)) == (SIZE5, False, True, True, True),
          f"size {h.get_size()}, read-only {h.is_read_only()}, trim {h.can_trim()}, "
          f"flush {h.can_flush()}")
    lk = locks("plugimg")
    check("nbdkit rbd=: holds the image's exclusive lock",
          len(lk) == 1 and lk[0]["id"].startswith("auto "), repr(lk))
    # Across the first object boundary, and the image's last 3 bytes.
    crossing = (4 * MiB - 4097, 8193)
    for off, n in (crossing, (SIZE5 - 3, 3)):
        write(h, model, off, rng.randbytes(n))
    h.flush()
    same("nbdkit rbd=: writes at odd offsets read back after FLUSH",
         b"".join(h.pread(n, off) for off, n in (crossing, (SIZE5 - 3, 3))),
         b"".join(model[off:off + n] for off, n in (crossing, (SIZE5 - 3, 3))))
    trimmed = (8 * MiB, 12 * MiB)
    write(h, model, trimmed[0], rng.randbytes(trimmed[1] - trimmed[0]))
    h.flush()
    h.trim(trimmed[1] - trimmed[0], trimmed[0])
    model[trimmed[0]:trimmed[1]] = bytes(trimmed[1] - trimmed[0])
    same("nbdkit rbd=: TRIM of a whole object reads back as zeroes",
         h.pread(trimmed[1] - trimmed[0], trimmed[0]), model[trimmed[0]:trimmed[1]])
    ext = extents(h, 0, SIZE5)
    check("nbdkit rbd=: BLOCK_STATUS: the written range is data (flags 0)",
          covered(ext, crossing[0], sum(crossing), 0), repr(show(ext, crossing[0], sum(crossing))))
    check("nbdkit rbd=: BLOCK_STATUS: the trimmed object is HOLE|ZERO",
          covered(ext, *trimmed, HOLE), repr(show(ext, *trimmed)))
    check("nbdkit rbd=: BLOCK_STATUS: a never-written object is HOLE|ZERO",
          covered(ext, 12 * MiB, 16 * MiB, HOLE), repr(show(ext, 12 * MiB, 16 * MiB)))
    same("nbdkit rbd=: the whole export reads back as written", read_all(h, SIZE5),
         bytes(model))
    stop("nbdkit rbd=", p, removes_socket=False)
    check("nbdkit rbd=: released the exclusive lock on SIGTERM", locks("plugimg") == [],
          repr(locks("plugimg")))
    same("nbdkit rbd=: rbd export equals what was written through it",
         export(c.spec("plugimg")), bytes(model))

    c.rbd("snap", "create", c.spec("plugimg", "ps"))
    w = start("a mloop-server writer beside nbdkit rbd=@SNAP", f"rbd:{c.spec('plugimg')}")
    hw = w.connect()
    hw.pwrite(rng.randbytes(MiB), 3 * MiB)   # after the snapshot: not in it
    hw.flush()
    p = plugin("nbdkit with rbd=POOL/IMAGE@SNAP", c.spec("plugimg", "ps"), *ceph_params())
    hs = p.connect(strict=False)
    check("nbdkit rbd=@SNAP: can_write is false", hs.is_read_only())
    same("nbdkit rbd=@SNAP reads the data it was taken with, not what came after",
         read_all(hs, SIZE5), bytes(model))
    expect_eperm("nbdkit rbd=@SNAP: WRITE", hs.pwrite, b"x" * 512, 0)
    stop("nbdkit rbd=@SNAP", p, removes_socket=False)
    stop("the writer beside it", w)

    s = RbdServer(f"nbdkit rbd={c.pool}/nosuch",
                  argv=nbdkit_argv(f"{c.pool}/nosuch", *ceph_params()),
                  env=harness.nbdkit_env())
    refused_in_one_line("nbdkit rbd= of a missing image", s, ["nosuch"], cleans_up=False)


def section_name_options():
    """conf=, id= and shared= in the name, for mloop-server and the plugin."""
    c.create_image("optimg", SIZE3)
    rng = random.Random(7)
    name = "rbd:" + with_options("optimg", conf=c.conf, id=c.client_id)
    s = start("mloop-server on rbd:POOL/IMAGE:conf=C:id=ID, no --ceph-conf or --ceph-id",
              name, argv=server_argv(name))
    h = s.connect()
    data = rng.randbytes(5001)
    h.pwrite(data, 4 * MiB - 99)
    h.flush()
    check("name options: what is written reads back", h.pread(len(data), 4 * MiB - 99) == data)
    lk = locks("optimg")
    check("name options: without shared= the server holds the exclusive lock",
          len(lk) == 1, repr(lk))
    stop("the server on the name with options", s)

    # The name's options win: these alone would be refused.
    s = start("mloop-server on the name with options, --ceph-conf of a missing file, "
              "--ceph-id with no keyring", name,
              argv=server_argv(name, f"--ceph-conf={c.path('test', 'nosuch.conf')}",
                               "--ceph-id=nobody"))
    h = s.connect()
    check("name options win over --ceph-conf and --ceph-id: the data reads back",
          h.pread(len(data), 4 * MiB - 99) == data)
    stop("the server whose options won", s)

    shared = name + ":shared=on"
    # librbd still passes the lock between writers as they write; a
    # server with shared=on only does not take it at its start.
    s1 = start("a server on NAME:shared=on", shared, argv=server_argv(shared))
    check("shared=on in the name: the server did not take the exclusive lock at its start",
          locks("optimg") == [], repr(locks("optimg")))
    s2 = start("a second server on NAME:shared=on beside it", shared, argv=server_argv(shared))
    h1, h2 = s1.connect(), s2.connect()
    x = rng.randbytes(3000)
    h1.pwrite(x, MiB + 1)
    h1.flush()
    check("shared=on in the name: both writable, one reads what the other wrote",
          not h1.is_read_only() and not h2.is_read_only() and h2.pread(len(x), MiB + 1) == x)
    stop("the first shared=on server", s1)
    stop("the second shared=on server", s2)

    for what, suffix, words in (("an unknown option :foo=1", ":foo=1", ["foo=1"]),
                                ("shared=maybe", ":shared=maybe", ["shared=maybe"])):
        refused_in_one_line(f"mloop-server on a name with {what}",
                            RbdServer(name + suffix, argv=server_argv(name + suffix)), words)
    # A window (losetup's --offset, --sizelimit) is a file's: served
    # whole, the image would be written where the client does not think.
    for opt in ("--offset=1M", "--sizelimit=2M"):
        refused_in_one_line(f"mloop-server {opt} on an RBD image",
                            RbdServer(name, argv=server_argv(name, opt)),
                            ["--offset and --sizelimit are for files"])

    if PLUGIN_MISSING:
        print(f"# SKIP the nbdkit plugin's name options: {PLUGIN_MISSING}")
        return
    rbd = with_options("optimg", conf=c.conf, id=c.client_id)
    p = plugin("nbdkit rbd=POOL/IMAGE:conf=C:id=ID, no ceph-conf= or ceph-id=", rbd)
    h = p.connect()
    check("nbdkit, name options: the data reads back", h.pread(len(data), 4 * MiB - 99) == data)
    stop("nbdkit on the name with options", p, removes_socket=False)
    s = RbdServer(f"nbdkit rbd={rbd}:foo=1", argv=nbdkit_argv(rbd + ":foo=1"),
                  env=harness.nbdkit_env())
    refused_in_one_line("nbdkit rbd= with an unknown option :foo=1", s, ["foo=1"],
                        cleans_up=False)


def section_serve():
    """`mloop serve --ceph-conf --ceph-id rbd:...` with each server."""
    if not MLOOP_CLI or not os.path.exists(MLOOP_CLI):
        print("# SKIP `mloop serve`: MLOOP_CLI does not name the built mloop")
        return
    c.create_image("serveimg", SIZE3)
    rng = random.Random(8)
    kinds = ["native"]
    if PLUGIN_MISSING:
        print(f"# SKIP `mloop serve --server nbdkit`: {PLUGIN_MISSING}")
    else:
        kinds.append("nbdkit")
    written = []
    for i, kind in enumerate(kinds):
        s = start(f"mloop serve --server {kind} --ceph-conf C --ceph-id ID rbd:POOL/IMAGE",
                  f"mloop serve --server {kind} rbd:{c.spec('serveimg')}",
                  argv=serve_argv("--server", kind, "--ceph-conf", c.conf,
                                  "--ceph-id", c.client_id, f"rbd:{c.spec('serveimg')}"),
                  env=harness.nbdkit_env(), ready_on_socket=True)
        h = s.connect()
        if written:
            bad = [off for off, data in written if h.pread(len(data), off) != data]
            check(f"mloop serve --server {kind}: reads what the server before it wrote",
                  not bad, f"differs at {bad}")
        off, data = 2 * MiB * (i + 1) + 4093, rng.randbytes(3 * 4096 + 5)
        h.pwrite(data, off)
        h.flush()
        written.append((off, data))
        check(f"mloop serve --server {kind}: a write at an odd offset reads back",
              h.pread(len(data), off) == data)
        stop(f"mloop serve --server {kind}", s, removes_socket=kind != "nbdkit")
    got = export(c.spec("serveimg"))
    bad = [off for off, data in written if got[off:off + len(data)] != data]
    check("rbd export has what each `mloop serve` wrote", not bad, f"differs at {bad}")

    plain = c.path("test", "plain.img")
    with open(plain, "wb") as f:
        f.truncate(MiB)
    s = RbdServer(f"mloop serve --ceph-conf {plain}",
                  argv=serve_argv("--ceph-conf", c.conf, plain), ready_on_socket=True)
    err = refused_in_one_line("mloop serve --ceph-conf with a plain file", s,
                              ["--ceph-conf"])
    check("mloop serve --ceph-conf with a plain file: says it is for RBD images and names "
          "the file", "RBD" in err and plain in err, repr(err))


# --- 5: a writer killed --------------------------------------------------

SIZE4 = 32 * MiB + 1


def section_kill():
    c.create_image("crash", SIZE4)
    rng = random.Random(4)
    record = c.path("test", "crash-lock-record")
    k = start("a writer to be killed", f"rbd:{c.spec('crash')}", f"--lock-record={record}")
    h = k.connect()
    flushed = [(0, rng.randbytes(5 * MiB + 3)), (9 * MiB + 1, rng.randbytes(MiB))]
    h.pwrite(flushed[0][1], flushed[0][0])
    h.flush()
    h.pwrite(flushed[1][1], flushed[1][0], nbd.CMD_FLAG_FUA)
    # Writes in flight at the kill, to a range not checked.
    for i in range(4):
        h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(rng.randbytes(MiB))),
                     20 * MiB + i * MiB)
    dead = locks("crash")
    k.proc.send_signal(signal.SIGKILL)
    k.proc.wait()
    check("the writer died of SIGKILL", k.proc.returncode == -signal.SIGKILL,
          f"exit {k.proc.returncode}")
    k.handles = []  # its connection is gone with it

    k2 = RbdServer(f"rbd:{c.spec('crash')}", f"--lock-record={record}")
    ok = k2.wait_ready(RESTART_WAIT)
    check(f"a new writer starts after the SIGKILL ({k2.elapsed:.1f} s)", ok, k2.why())
    if not ok:
        k2.stop(5)
        raise Abort("no restart")
    check(f"it starts within {RESTART_LIMIT} s (it broke the recorded dead writer's lock)",
          k2.elapsed < RESTART_LIMIT, f"{k2.elapsed:.1f} s")
    now = locks("crash")
    check("the new writer holds the lock, not the dead one",
          len(now) == 1 and len(dead) == 1 and now[0]["address"] != dead[0]["address"],
          f"{dead!r} -> {now!r}")
    with open(record) as f:
        recorded = f.read().split()
    check("the lock record names the new holder first, then the dead one",
          len(now) == 1 and recorded[:2] == [now[0]["address"], dead[0]["address"]],
          f"{recorded!r} vs {now!r}, {dead!r}")
    h = k2.connect()
    bad = [off for off, data in flushed if h.pread(len(data), off) != data]
    check("what was flushed (and FUA-written) before the kill reads back", not bad,
          f"differs at {bad}")
    data = rng.randbytes(3 * MiB)
    h.pwrite(data, 25 * MiB)
    h.flush()
    flushed.append((25 * MiB, data))
    check("the new writer writes", h.pread(len(data), 25 * MiB) == data)
    stop("the new writer", k2)
    got = export(c.spec("crash"))
    bad = [off for off, data in flushed if got[off:off + len(data)] != data]
    check("rbd export has everything flushed, before the kill and after", not bad,
          f"differs at {bad}")
    check_fenced(rng)


def check_fenced(rng):
    """A writer stopped, not dead, whose lock a successor broke: the
    cluster refuses it from then on (librbd's EBLOCKLISTED), which it
    answers as an IO error, not NBD's ESHUTDOWN."""
    c.create_image("fenced", SIZE4)
    record = c.path("test", "fenced-lock-record")
    old = start("a writer to be stopped", f"rbd:{c.spec('fenced')}",
                f"--lock-record={record}")
    h = old.connect()
    before = rng.randbytes(MiB)
    h.pwrite(before, 0)
    h.flush()
    procstop.sigstop(old.proc.pid)
    try:
        new = start("its successor", f"rbd:{c.spec('fenced')}", f"--lock-record={record}")
    finally:
        old.proc.send_signal(signal.SIGCONT)
    errs = []
    for what, fn in (("write", lambda: h.pwrite(rng.randbytes(4096), 8192)),
                     ("read", lambda: h.pread(4096, 0))):
        try:
            fn()
            errs.append(f"{what}: succeeded")
        except nbd.Error as e:
            if e.errno != "EIO":
                errs.append(f"{what}: {e}")
    check("the fenced writer's write and read fail with EIO", not errs, "; ".join(errs))
    said = [line for line in old.stderr().splitlines() if "blocklisted" in line]
    check("its log says once that the cluster refuses it", len(said) == 1, repr(said))
    h2 = new.connect()
    check("the successor reads what the fenced writer flushed",
          h2.pread(MiB, 0) == before)
    stop("the fenced writer", old)
    stop("its successor", new)


# --- 10: the cluster lost -------------------------------------------------

SIZE6 = 8 * MiB + 1
IO_TIMEOUT = 3        # the --io-timeout of section 10's servers
LOSS_MARGIN = 2       # seconds past it a request may take to fail
RESTART_SERVES_LIMIT = 20  # seconds to serve again once the daemons restarted
# Known data and the writes that fail, all in the image's first object:
# one already written, so a write needs one answer from the cluster (the
# first write to an object also updates the object map: two).  A write
# that failed may still land once the cluster answers, as on a disk that
# failed it: it goes where no check reads.
KNOWN_AT = 4096 - 3
LOST_WRITE_AT = 2 * MiB


def await_commands(cmds, limit):
    """CMDS: [(name, handle, cookie)] of commands in flight.  Polls their
    handles until each has completed or LIMIT seconds have passed; returns
    {name: (outcome, seconds)} of those that completed, outcome "ok" or
    the errno name (EIO)."""
    t = time.monotonic()
    done = {}
    while len(done) < len(cmds) and time.monotonic() - t < limit:
        for name, h, cookie in cmds:
            if name in done:
                continue
            h.poll(10)
            try:
                if h.aio_command_completed(cookie):
                    done[name] = ("ok", time.monotonic() - t)
            except nbd.Error as e:
                done[name] = (e.errno, time.monotonic() - t)
    return done


def fails_in_time(what, outcome):
    """OUTCOME (outcome, seconds) or None: an EIO after IO_TIMEOUT, within
    IO_TIMEOUT + LOSS_MARGIN."""
    got, secs = outcome or ("still waiting", IO_TIMEOUT + LOSS_MARGIN)
    return check(f"{what} fails with EIO in {IO_TIMEOUT}-{IO_TIMEOUT + LOSS_MARGIN} s "
                 f"({secs:.2f} s)",
                 got == "EIO" and IO_TIMEOUT - 0.1 <= secs <= IO_TIMEOUT + LOSS_MARGIN,
                 f"{got} after {secs:.2f} s")


def notices(s):
    """S's lines about its cluster: did not answer, answers again."""
    return [line for line in s.stderr().splitlines()
            if "the cluster did not answer" in line or "the cluster answers again" in line]


def serves_again(what, h, known, rng, at, within=0):
    """H, connected before the loss, reads KNOWN and writes (at AT) again.
    WITHIN: seconds the first read may fail with EIO, tried again (a
    client whose monitor was gone looks for it at growing intervals, and
    learns of the OSD's return from it)."""
    t = time.monotonic()
    tries = 1
    try:
        while True:
            try:
                got = h.pread(len(known), KNOWN_AT)
                break
            except nbd.Error as e:
                if e.errno != "EIO" or time.monotonic() - t > within:
                    raise
                tries += 1
        if within:
            print(f"# {what}: read again after {time.monotonic() - t:.1f} s, "
                  f"{tries} tr{'y' if tries == 1 else 'ies'}")
        same(f"{what}: the same connection reads what was written before the loss",
             got, known)
        data = rng.randbytes(70001)
        h.pwrite(data, at)
        h.flush()
        same(f"{what}: a write on it then reads back", h.pread(len(data), at), data)
    except nbd.Error as e:
        check(f"{what}: the same connection serves again", False, str(e))


def section_cluster_loss():
    """--io-timeout while the whole cluster is paused, then shut down."""
    rng = random.Random(10)
    known = rng.randbytes(MiB + 5)
    c.create_image("lost", SIZE6)
    c.create_image("waits", SIZE6)
    a = start(f"a server with --io-timeout {IO_TIMEOUT}", f"rbd:{c.spec('lost')}",
              "--io-timeout", str(IO_TIMEOUT))
    b = start("a server without --io-timeout", f"rbd:{c.spec('waits')}")
    ha, hb = a.connect(), b.connect()
    handles = [("mloop-server --io-timeout", ha), ("mloop-server, no timeout", hb)]
    p = None
    if PLUGIN_MISSING:
        print(f"# SKIP nbdkit's io-timeout=: {PLUGIN_MISSING}")
    else:
        c.create_image("lostplug", SIZE6)
        p = plugin(f"nbdkit rbd= io-timeout={IO_TIMEOUT}", c.spec("lostplug"),
                   *ceph_params(), f"io-timeout={IO_TIMEOUT}")
        handles.append((f"nbdkit io-timeout={IO_TIMEOUT}", p.connect()))
    for _, h in handles:
        h.pwrite(known, KNOWN_AT)
        h.pwrite(rng.randbytes(4096), LOST_WRITE_AT)   # the object exists
        h.flush()

    # Paused: nothing answers, every connection stays open.
    c.pause()
    try:
        wait_buf = nbd.Buffer(len(known))
        cmds = [("read", ha, ha.aio_pread(nbd.Buffer(len(known)), KNOWN_AT)),
                ("write", ha, ha.aio_pwrite(
                    nbd.Buffer.from_bytearray(bytearray(rng.randbytes(65536))),
                    LOST_WRITE_AT)),
                ("waiting read", hb, hb.aio_pread(wait_buf, KNOWN_AT))]
        if p:
            hp = handles[2][1]
            cmds.append(("nbdkit read", hp, hp.aio_pread(nbd.Buffer(len(known)), KNOWN_AT)))
        done = await_commands([x for x in cmds if x[0] != "waiting read"],
                              IO_TIMEOUT + LOSS_MARGIN)
        done.update(await_commands([cmds[2]], 0.1))
        ok = fails_in_time(f"--io-timeout {IO_TIMEOUT}, the cluster paused: a READ",
                           done.get("read"))
        ok &= fails_in_time(f"--io-timeout {IO_TIMEOUT}, the cluster paused: a WRITE",
                            done.get("write"))
        if p:
            fails_in_time(f"nbdkit io-timeout={IO_TIMEOUT}, the cluster paused: a READ",
                          done.get("nbdkit read"))
        ok &= check(f"without --io-timeout, a READ still waits after {IO_TIMEOUT} s",
                    "waiting read" not in done, repr(done.get("waiting read")))
        if not ok:  # what the servers knew of their cluster
            for what, s in (("--io-timeout", a), ("no timeout", b)):
                for line in s.stderr().splitlines()[-20:]:
                    print(f"# {what} server: {line}")
    finally:
        c.resume()
    t = time.monotonic()
    waited = await_commands([cmds[2]], 30)
    check(f"without --io-timeout, the waiting READ completes once the cluster answers "
          f"({time.monotonic() - t:.2f} s)",
          waited.get("waiting read", ("none",))[0] == "ok"
          and bytes(wait_buf.to_bytearray()) == known, repr(waited))
    for i, (what, h) in enumerate(handles):
        serves_again(f"{what}, the cluster resumed", h, known, rng, 5 * MiB + i * MiB)
    if p:
        said = notices(p)
        check("nbdkit said that the cluster did not answer",
              len(said) >= 1 and f"did not answer in {IO_TIMEOUT} s" in said[0], repr(said))
        stop(f"nbdkit io-timeout={IO_TIMEOUT}", p, removes_socket=False)
    stop("the server without --io-timeout", b)
    check("the server without --io-timeout said nothing of the cluster", notices(b) == [],
          repr(notices(b)))
    # "Answers again" once a request succeeds with none timed out for
    # IO_TIMEOUT seconds.
    time.sleep(max(0, IO_TIMEOUT + 0.2 - (time.monotonic() - t)))
    ha.pread(512, 0)
    said = notices(a)
    check("the server said once that the cluster did not answer in "
          f"{IO_TIMEOUT} s, and once that it answers again",
          len(said) == 2 and f"did not answer in {IO_TIMEOUT} s" in said[0]
          and "answers again" in said[1], repr(said))

    # Shut down, its daemons started again on their data.
    c.stop_daemons()
    try:
        t = time.monotonic()
        try:
            ha.pread(len(known), KNOWN_AT)
            outcome = ("ok", time.monotonic() - t)
        except nbd.Error as e:
            outcome = (e.errno, time.monotonic() - t)
        fails_in_time(f"--io-timeout {IO_TIMEOUT}, the cluster shut down: a READ", outcome)
    finally:
        t = time.monotonic()
        c.start_daemons()
        print(f"# the cluster started again in {time.monotonic() - t:.1f} s")
    serves_again("--io-timeout, the cluster started again", ha, known, rng, 7 * MiB,
                 within=RESTART_SERVES_LIMIT)
    lk = locks("lost")
    check("the server still holds the image's exclusive lock", len(lk) == 1, repr(lk))
    stop(f"the server with --io-timeout {IO_TIMEOUT}", a)

    for value in ("-1", "x"):
        refused_in_one_line(f"--io-timeout {value}",
                            RbdServer(f"rbd:{c.spec('lost')}", "--io-timeout", value),
                            ["--io-timeout"])
    if p:
        for value in ("-1", "x"):
            s = RbdServer(f"nbdkit io-timeout={value}",
                          argv=nbdkit_argv(c.spec("lost"), *ceph_params(),
                                           f"io-timeout={value}"),
                          env=harness.nbdkit_env())
            refused_in_one_line(f"nbdkit io-timeout={value}", s, ["io-timeout"],
                                cleans_up=False)


# --- run ------------------------------------------------------------------


def section(name, fn):
    t = time.monotonic()
    first = len(servers)
    print(f"# {name}")
    try:
        fn()
    except Abort:
        pass
    except Exception as e:  # nbd.Error, a failed rbd command: this section ends
        check(f"{name}: runs to its end", False, f"{type(e).__name__}: {e}")
        for s in servers[first:]:
            err = s.stderr().strip().splitlines()
            if err:
                print(f"# stderr of the server of {s.spec} (last lines):")
                print("\n".join("#   " + line for line in err[-10:]))
    print(f"# {name}: {time.monotonic() - t:.1f} s")


t0 = time.monotonic()
c = cluster.Cluster()
daemon_pids, cluster_dir = [], None
try:
    c.start()
    print(f"# cluster started in {c.times['start']:.1f} s")
    daemon_pids = [d.proc.pid for d in c.daemons.values()]
    cluster_dir = c.dir
    os.mkdir(c.path("test"))
    section("data through the server, and its commands", section_data)
    section("a snapshot and -r", section_snapshot)
    section("the exclusive lock", section_lock)
    section("two --shared writers", section_shared)
    section("bad input", section_refusals)
    section("the nbdkit plugin's rbd=", section_plugin)
    section("options in the name", section_name_options)
    section("mloop serve", section_serve)
    section("a writer killed with SIGKILL", section_kill)
    section("cluster loss", section_cluster_loss)
finally:
    # The servers first: with the cluster gone, librbd's close would wait.
    for s in servers:
        if s.proc.poll() is None:
            s.stop(10)
    c.stop()

print(f"# whole test {time.monotonic() - t0:.1f} s")
alive = [s.proc.pid for s in servers if s.proc.poll() is None]
check("no server is left running", alive == [], repr(alive))
alive = [pid for pid in daemon_pids if os.path.exists(f"/proc/{pid}")]
check("no Ceph daemon is left running", alive == [], repr(alive))
check("no file is left", cluster_dir is None or not os.path.exists(cluster_dir),
      cluster_dir)
harness.exit_if_failed()
