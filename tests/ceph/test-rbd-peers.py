#!/usr/bin/python3
"""mloop-server beside other Ceph clients and settings it does not choose,
on a real one-node cluster (tests/ceph/cluster.py):

1. a live writer that is not mloop (a python3-rbd client with the image
   open, writing, holding the exclusive lock as qemu or rbd-nbd would):
   mloop-server is refused in one line naming the holder, and the writer
   keeps writing without an error; once the writer is killed and the OSD
   has dropped its watch, mloop-server breaks the dead holder's lock and
   serves the image;
   the same with the writer's image open 20 times (20 watchers, more
   than the server's first guess at their number): refused as well;
   and a writer arriving while the server is held by gdb at its first
   rbd_lock_get_owners (mid-look at who lives on the image): refused,
   the writer never broken nor blocklisted (without gdb, a line says
   this part is skipped);
1d. a dead writer's lock beside a live librbd client with the image
   open for writing but no lock (no write yet): refused in one line
   naming that client, whose write then succeeds (its lock not taken
   from under it by a server that never hands it back);
2. the lock lost without a blocklist: the server stopped (SIGSTOP) until
   the OSD drops its watch, a librbd client with
   rbd_blocklist_on_break_lock=false breaks its lock, takes it
   explicitly and writes; the server continued re-establishes its watch
   and, the lock record naming the other, says it has lost the lock
   (whether librbd found that out or, its watch's handle unchanged,
   still believed it held it); the other releases it and closes the
   image; the next write through the
   server's same connection succeeds, the server saying it took the
   lock again, which it holds;
2p. librbd answering a write EROFS while the cluster's lock record
   still names the server, and failing to say who owns the lock (gdb
   forges both answers; ~7 s with the cluster): the server names itself
   as the holder, does not break its own lock nor blocklist itself, and
   later writes go through under the lock it holds;
2v. as 2p, with another client having the image open for writing
   (a watch; its writes refused while the server holds the lock): the
   server must not let go of a lock librbd may hold (it only failed to
   say so), which that client would take at its next write: the server
   still holds it after, the other client's write is still refused and
   the server's goes through;
2q. another client, which does not blocklist, breaking the lock the
   server has just taken and taking it, before the server reads whose
   the lock is (gdb holds it there): the device's lock record must not
   name that client as one of its servers, and the server's first
   write must fail rather than land beside that client's (librbd still
   believes it holds the lock: a break tells it nothing); once that
   client lets the lock go, a later write through the same connection
   takes it again and succeeds (not only the first write tries), and
   a third client breaking it then, unseen by librbd, and taking a
   snapshot has the server fail its next write (it knows its address
   as the lock's holder once it took the lock again, and checks the
   record); the same again with librbd failing (gdb) to say whether
   the server still holds the lock once it has read the owner: its
   first write fails all the same;
2s. another client, which does not blocklist, breaking the server's
   lock with the server's watch up (librbd, whom a break tells nothing,
   believes it still holds it), taking it and then a snapshot, which
   wakes the server's check of the lock record, whose read fails (gdb
   forges a timeout): the server lets the lock go rather than write
   beside that client, and writes again once it lets the lock go;
2t. the server unable to read (gdb forges a timeout) the address it
   holds the lock it has just taken under: it lets the lock go, its
   first write takes it again and learns the address, and a client
   breaking the lock unseen and taking a snapshot then has the
   server's next write fail rather than land beside it;
2u. as 2t, the release that lets the lock go never reaching the
   cluster (gdb sends librbd's unlock to a missing object; librbd takes
   any failed unlock for done): the cluster still records the server as
   the holder, librbd holds nothing; the server's first write lets that
   lock of its own go (unlocks its own entry, breaks and blocklists
   nothing), takes the lock again and succeeds;
2r. the lock's owners unreadable (gdb forges a timeout of the server's
   rbd_lock_get_owners) while its holder, a server stopped until the
   OSD dropped its watch, is on an image that turns librbd's
   blocklisting off: the new server is refused in one line, rather
   than have librbd break the holder's lock unfenced; the holder,
   continued, still holds the lock and writes on;
2b. a device's server killed (gdb) as its rbd_lock_acquire returns,
   then its successor as its rbd_lock_break of that lock returns, both
   watches still up: the next server with the same lock record breaks
   what lock they hold and serves (the record names each server before
   it breaks or takes a lock);
2a. a device's server killed (gdb) as it calls rbd_lock_acquire:
   recorded, holding no lock, so its successor (the same lock record)
   blocklists nobody and its watch lingers (Ceph's 30 s here); the
   successor cannot read (gdb forges a timeout) the address it holds
   the lock it took under, so lets it go: its first write takes the
   lock again, the killed server's watch no live writer there either
   (as at the start), and succeeds;
2c. a device's server stopped (SIGSTOP), not dead, on an image whose
   configuration turns librbd's blocklisting off
   (rbd_blocklist_on_break_lock false), and its successor started with
   the same lock record: the successor breaks the lock and writes, the
   stopped server is blocklisted all the same (for the day the image's
   rbd_blocklist_expire_seconds says, not the monitors' default hour),
   and once continued its write fails instead of landing over the successor's;
2l. a lock record another user could write (nobody's, or anybody's
   to write) naming a live librbd writer: the server refuses it in one
   line naming the record, and the writer keeps writing (its lock not
   broken, it not blocklisted);
2m. a shared open (mloop-server --shared, as `mloop resize` opens a
   device's image) with a device's lock record, beside that device's
   server, on a name saying :shared=off: the server keeps its lock, is
   not blocklisted and writes on;
2n. a device's image renamed by another client to a name holding a
   line break and an escape sequence: its next server says so in one
   line, no control character raw;
2o. `mloop serve --read-only --server nbdkit` of an image a live
   librbd writer holds: it serves read-only beside the writer, which
   keeps its lock and writes on (without nbdkit, the plugin or mloop,
   a line says this part is skipped);
2k. a snapshot's device, its snapshot's name 5,000 characters long:
   its next server (the same lock record) serves it;
2d. the image's exclusive-lock feature turned off (`rbd feature
   disable`) while the server holds the lock: the server says that
   other clients may now write beside it;
2e. a snapshot removed (`rbd snap rm`) while a server serves it, and
   the image written after: the server says so within 10 s and fails
   the snapshot's reads (librbd's read-only open has no watch, and
   would read the image as it is now); another snapshot's server
   stopped (SIGTERM) while every daemon is paused stops within 10 s;
   and a snapshot's server whose image is removed (its snapshots
   purged, then `rbd rm`) fails its reads too;
2f. a device's image renamed (`rbd mv`, to a name longer than librbd's
   96-byte bound of format 1) while its server holds it, the
   server killed and another image given the old name: the next server
   with the same lock record serves the renamed image, and says so, and
   once that image is removed it is refused in one line naming both; a
   snapshot's next server serves its snapshot, renamed, not the one
   given its name, and is refused once it is removed;
2g. an image served read-only removed (`rbd rm`: a read-only open has
   no watch to stop it) or moved to the trash: the server says so within
   10 s and fails the reads, which would answer zeroes;
2h. a device's image moved to the trash (`rbd trash mv`) while its
   server is down: its next server, and a snapshot's, are refused in one
   line naming the trash (librbd would open it by its recorded id);
2i. a snapshot of an image with 4,101 snapshots (a list of their ids
   is over 32 KiB), removed while served, under AddressSanitizer where installed: the server says so
   and fails the reads, and overruns nothing;
2j. an image served read-only and shrunk by its writer: the server
   says so within 10 s, fails a read past the new end (which librbd
   would answer with zeroes) and gives new connections the new size,
   after a SIGHUP too;
2w. a clone served read-only, shrunk and grown back with `rbd resize`
   (which cuts its overlap with its parent): the server serves none of
   the parent's data past the cut, where the clone reads zeroes;
2x. a clone served read-only and flattened (`rbd flatten`), then a
   whole object discarded (python3-rbd), or the clone shrunk and grown
   back: the server says it opened the clone again and serves none of
   its former parent's data, where the clone reads zeroes;
2y. a clone served read-only and flattened, the cluster paused just as
   the server's check opens it again (gdb holds the server there): a
   SIGTERM stops the server within 10 s all the same; once the cluster
   is back, with the server held in exit (gdb), every other thread of it
   ends (the open's, librados's), and it exits 0 (without gdb, a line
   says this is skipped);
2z. a clone served read-only and flattened, a SIGTERM arriving while
   the server's check waits for the header's answer that it was
   flattened (gdb holds the check there until the close waits for it):
   the server must not open the clone again once it is closing, and
   exits 0 (without gdb, a line says this is skipped);
3. librbd's cache and partial trims turned on for the image in the
   cluster (`rbd config image set`: rbd_cache true, writeback, dirty data
   kept 60 s; rbd_skip_partial_discard true), over the server's own
   rbd_cache=false: a trim inside an object reads back as zeroes, and a
   FUA write, and a FUA zero that must stay allocated (NO_HOLE: a
   write, in the cache), acknowledged just before the server is
   SIGKILLed are in the image (`rbd export`);
3b. rbd_skip_partial_discard turned on for the image while a server
   has it open (librbd applies it at its next refresh): a trim inside
   an object made after it still reads back as zeroes;
3c. rbd_cache set on the image as "1", then as "TRUE" (librbd reads
   both as true; its configuration list shows them as set): a FUA write
   acknowledged just before the server is SIGKILLed is in the image;
4. BLOCK_STATUS over a sparse 8 GiB image with data scattered in 64
   objects: a request for 4 GiB - 4 KiB is answered with extents
   covering at most 1 GiB, neighbours of one kind merged; REQ_ONE
   requests, as qemu-img convert makes, each cost librbd at most two
   callbacks (the server says how many under MLOOP_TEST_RBD_WALKS), and
   a walk of the whole image with them finds every written extent.
   With MLOOP_RBD_TIMINGS=1, qemu-img convert of the image over NBD and
   `rbd export` are timed and printed, not checked (wall time is not a
   test; the export alone takes 8-17 s);
5. a namespace of the pool (rbd:POOL/NAMESPACE/IMAGE, as ceph-csi makes
   them): served, written, and `rbd export` of the namespace's image
   has the data; a missing namespace is refused in one line;
6. client_mount_timeout = 2 in ceph.conf, with no monitor at the address
   it names: refused in one line within 10 s (Ceph's default would be
   300 s, the server's own 30 s);
7. no server, client, daemon or file is left.

SKIPs (77) without the Ceph packages, python3-libnbd or python3-rbd.

Run by hand from the repository root:
  MLOOP_SERVER_BIN=build/server/mloop-server PYTHONPATH=tests:tests/ceph \\
      /usr/bin/python3 tests/ceph/test-rbd-peers.py
MLOOP_RBD_SECTIONS="WORD,WORD" runs only the sections whose name (the
"# NAME" lines it prints) has one of the words.

Cost on the project machine (2 cores): the cluster's start 6-7 s (up
to 19 s loaded), 1 and 2 about 7-8 s each (each waits once for a watch
to end: the 5 s this test sets osd_client_watch_timeout to), the
arriving writer 2-3 s (gdb's start), 20 watchers, 2c, 2e and 3 to 6
about 1-3 s each, 2d about 5 s (`rbd feature disable`), 1d about 6 s (a
watch timeout), 2f 3-5 s, 3b under 1 s, 2q 8-11 s (two cases), 2r 6-7 s
(a watch timeout), 2s 3 s, 2t 3-4 s, 2u 2-3 s, 2v 1-2 s, 2b 12-13 s
(two gdb starts), 2a 12-14 s (two gdb starts, and librbd's release of
the lock and its taking again each waiting 5 s for the killed server's
watch to answer), 2i 9-13 s (4,100 snapshots added to the header), 2j
2-3 s, 2w 5-7 s, 2x about 10 s, 2y about 5 s, 2z about 5 s, 2k under
1 s, 2l, 2m, 2n and 2o 1-2 s each; about 145-165 s in all alone, more
beside other work.
"""
import datetime
import json
import os
import select
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
if subprocess.run([sys.executable, "-c", "import rados, rbd"],
                  capture_output=True).returncode != 0:
    print("SKIP: python3-rbd is not installed (the writer that is not mloop)")
    sys.exit(77)

os.environ.setdefault("MLOOP_SERVER", "native")
import harness  # tests/: skips without python3-libnbd or MLOOP_SERVER_BIN
import procstop  # tests/: a SIGSTOP that has taken effect
import nbd
from harness import check

SERVER_BIN = harness.SERVER_BIN
MiB = 1 << 20
GiB = 1 << 30
START_LIMIT = 30
REFUSE_LIMIT = 10
WATCH_TIMEOUT = 5       # osd_client_watch_timeout here: a dead client's watch
SUCCESSOR_WATCH_TIMEOUT = 30   # Ceph's default, while a device's servers die


class Abort(Exception):
    """Ends a section whose next step cannot run (its check already failed)."""


servers, others = [], []


class Server:
    """mloop-server on SPEC in the foreground, on a private Unix socket."""

    def __init__(self, spec, conf=None, env=None, wrap=(), args=()):
        self.dir = c.path("test", f"server{len(servers)}")
        os.mkdir(self.dir)
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.pid_file = os.path.join(self.dir, "server.pid")
        self.err_path = os.path.join(self.dir, "stderr")
        cmd = [*wrap, SERVER_BIN, "--listen", f"unix:{self.sock}", "--pid-file", self.pid_file,
               f"--ceph-conf={conf or c.conf}", f"--ceph-id={c.client_id}", *args, spec]
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err,
                                         env=dict(os.environ, **(env or {})),
                                         preexec_fn=cluster._die_with(os.getpid()))
        self.started = time.monotonic()
        self.elapsed = 0.0
        servers.append(self)

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def ready(self, timeout=START_LIMIT):
        deadline = self.started + timeout
        while not os.path.exists(self.pid_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.elapsed = time.monotonic() - self.started
        return os.path.exists(self.pid_file)

    def connect(self):
        h = nbd.NBD()
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        h.connect_unix(self.sock)
        return h

    def says(self, words, limit):
        """Waits until the server has written WORDS on stderr, for LIMIT
        seconds at most; whether it has."""
        deadline = time.monotonic() + limit
        while words not in self.stderr() and time.monotonic() < deadline:
            time.sleep(0.1)
        return words in self.stderr()

    def stop(self):
        harness.terminate(self.proc, 20)


def start(what, spec, **kw):
    s = Server(spec, **kw)
    ok = s.ready()
    if not check(f"{what} starts ({s.elapsed:.1f} s)", ok,
                 f"exit {s.proc.poll()}: {s.stderr().strip()!r}"):
        s.stop()
        raise Abort(what)
    return s


def refused_in_one_line(what, s, words):
    try:
        s.proc.wait(60)
    except subprocess.TimeoutExpired:
        s.stop()
    s.elapsed = time.monotonic() - s.started
    err = s.stderr().strip()
    print(f"# {what}: {err!r}")
    check(f"{what}: refused, exit non-zero", s.proc.returncode not in (None, 0),
          f"exit {s.proc.returncode}")
    check(f"{what}: refused within {REFUSE_LIMIT} s", s.elapsed < REFUSE_LIMIT,
          f"{s.elapsed:.1f} s")
    check(f"{what}: one line naming the cause",
          len(err.splitlines()) == 1 and all(w in err for w in words),
          f"wanted one line with {words}: {err!r}")
    return err


def export(spec):
    path = c.path("test", "export")
    c.rbd("export", "--no-progress", spec, path)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


# --- 1: a live writer that is not mloop ------------------------------------

# Opens the image for writing and writes 4 KiB every 20 ms (librbd takes
# the exclusive lock at the first write, as qemu's and rbd-nbd's do),
# until its stdin closes; says "writing" after the first write, then
# "wrote N" at the end, or the first error and exits 1.
WRITER = r"""
import rados, rbd, select, sys
conf, client, pool, image = sys.argv[1:5]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image)
n = 0
try:
    while True:
        img.write(bytes([n % 251 + 1]) * 4096, (n * 4096) % (4 * 1024 * 1024))
        n += 1
        if n == 1:
            print("writing", flush=True)
        if select.select([sys.stdin], [], [], 0.02)[0]:
            break
except Exception as e:
    print(f"write {n}: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
img.close()
io.close()
cl.shutdown()
print(f"wrote {n}", flush=True)
"""


def watchers(image):
    status = json.loads(c.rbd("status", "--format", "json", c.spec(image)))
    return status.get("watchers", [])


def watches_end(image):
    """Waits until IMAGE has no watcher, for 4 watch timeouts at most: a
    killed or stopped client's watch stays until the OSD drops it.
    Whether none is left."""
    deadline = time.monotonic() + 4 * WATCH_TIMEOUT
    while watchers(image) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not watchers(image)


def librbd_client(script, image):
    """SCRIPT (WRITER and the like) run on IMAGE by a python3-rbd client of
    its own, a peer of mloop-server that is not mloop, with pipes to its
    stdin and (with its stderr) stdout; it dies with this test."""
    p = subprocess.Popen([sys.executable, "-c", script, c.conf, c.client_id, c.pool,
                          image], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=cluster._die_with(os.getpid()))
    others.append(p)
    return p


def section_live_writer():
    c.create_image("shared-by-others", 8 * MiB)
    w = librbd_client(WRITER, "shared-by-others")
    first = w.stdout.readline().strip()
    if not check("the librbd writer writes", first == "writing", repr(first)):
        raise Abort("no writer")
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("shared-by-others")))
    if not check("the librbd writer holds the exclusive lock", len(held) == 1, repr(held)):
        raise Abort("no lock")
    err = refused_in_one_line("mloop-server beside a live writer",
                              Server(f"rbd:{c.spec('shared-by-others')}"), ["in use"])
    check("the refusal names the holder",
          held[0]["locker"] in err and held[0]["address"] in err,
          f"holder {held[0]['locker']}: {err!r}")
    time.sleep(1)               # the writer's next writes, had it lost the lock
    w.stdin.close()
    out = w.stdout.read().strip()
    w.wait(30)
    check("the librbd writer kept writing without an error",
          w.returncode == 0 and out.startswith("wrote"), f"exit {w.returncode}: {out!r}")

    # The writer killed: its lock stays, its watch until the OSD drops it.
    w = librbd_client(WRITER, "shared-by-others")
    check("a second librbd writer writes", w.stdout.readline().strip() == "writing")
    w.kill()
    w.wait()
    if not check("the killed writer's watch ends", watches_end("shared-by-others"),
                 repr(watchers("shared-by-others"))):
        raise Abort("watch")
    s = start("mloop-server after a dead holder", f"rbd:{c.spec('shared-by-others')}")
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("shared-by-others")))
    h = s.connect()
    h.pwrite(b"m" * 4096, 0)
    h.flush()
    check("it took the dead holder's lock and writes",
          len(held) == 1 and h.pread(4096, 0) == b"m" * 4096, repr(held))
    h.shutdown()
    s.stop()


# --- 1b: a live writer among many watchers --------------------------------

# The writer above, with the image open MANY_WATCHERS - 1 times more in the same
# process (each open watches the header, as many clients of one image
# do): more watchers than a first guess at their number holds.
MANY_WATCHERS = 20
CROWD = WRITER.replace("img = rbd.Image(io, image)\n",
                       "crowd = [rbd.Image(io, image) for _ in range(%d)]\n"
                       "img = rbd.Image(io, image)\n" % (MANY_WATCHERS - 1)
                       ).replace("img.close()\n", "img.close()\nfor i in crowd:\n"
                                 "    i.close()\n")


def section_many_watchers():
    c.create_image("crowded", 8 * MiB)
    w = librbd_client(CROWD, "crowded")
    first = w.stdout.readline().strip()
    if not check("the crowded librbd writer writes", first == "writing", repr(first)):
        raise Abort("no writer")
    check(f"the image has {MANY_WATCHERS} watchers",
          len(watchers("crowded")) == MANY_WATCHERS, repr(len(watchers("crowded"))))
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("crowded")))
    err = refused_in_one_line(f"mloop-server beside a writer among {MANY_WATCHERS} "
                              "watchers", Server(f"rbd:{c.spec('crowded')}"), ["in use"])
    check("the refusal names the holder",
          len(held) == 1 and held[0]["address"] in err, f"holder {held}: {err!r}")
    time.sleep(1)               # the writer's next writes, had it lost the lock
    w.stdin.close()
    out = w.stdout.read().strip()
    w.wait(30)
    check("the crowded librbd writer kept writing without an error",
          w.returncode == 0 and out.startswith("wrote"), f"exit {w.returncode}: {out!r}")


# --- 1d: a dead holder beside a live client without the lock -------------

# Opens the image for writing and says "open" (a watch, no lock yet:
# librbd takes it at the first write, as qemu's and rbd-nbd's do); at a
# line on stdin writes 4 KiB and says "wrote", or the error.
IDLE = r"""
import rados, rbd, sys
conf, client, pool, image = sys.argv[1:5]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image)
print("open", flush=True)
sys.stdin.readline()
try:
    img.write(b"i" * 4096, 0)
    img.flush()
    print("wrote", flush=True)
except Exception as e:
    print(f"write: {type(e).__name__}: {e}", flush=True)
img.close()
io.close()
cl.shutdown()
"""


def section_dead_holder_live_client():
    c.create_image("dead-and-idle", 8 * MiB)
    w = librbd_client(WRITER, "dead-and-idle")
    if not check("a librbd writer writes", w.stdout.readline().strip() == "writing"):
        raise Abort("no writer")
    w.kill()
    w.wait()
    if not check("the killed writer's watch ends", watches_end("dead-and-idle"),
                 repr(watchers("dead-and-idle"))):
        raise Abort("watch")
    idle = librbd_client(IDLE, "dead-and-idle")
    if not check("a librbd client opens the image", idle.stdout.readline().strip() == "open"):
        raise Abort("no client")
    live = [x["address"] for x in watchers("dead-and-idle")]
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("dead-and-idle")))
    check("the dead writer holds the lock, the live client watches",
          len(held) == 1 and len(live) == 1 and held[0]["address"] not in live,
          f"lock {held}, watchers {live}")
    s = Server(f"rbd:{c.spec('dead-and-idle')}")
    if s.ready(REFUSE_LIMIT):
        check("mloop-server beside a dead holder and a live client: refused", False,
              "it started, the dead holder's lock broken and taken")
    else:
        refused_in_one_line("mloop-server beside a dead holder and a live client", s,
                            ["in use", "open for writing", *live[:1]])
    idle.stdin.write("\n")
    idle.stdin.flush()
    out = idle.stdout.readline().strip()
    check("the live client then writes", out == "wrote", repr(out))
    idle.stdin.close()
    idle.wait(30)
    s.stop()


# --- 1c: a writer arriving while the server looks -------------------------

# mloop-server held (by gdb, at its first rbd_lock_get_owners, before
# the call) while its look at who lives on the image is under way; a
# librbd writer opens the image and takes its lock meanwhile.  Whatever
# the order of the look's two parts (the lock's owners, the watchers),
# the writer must be seen alive: refused, never broken and blocklisted.
PAUSE_AT_OWNERS = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break rbd_lock_get_owners
commands 1
silent
shell touch {paused}
shell while [ ! -e {go} ]; do sleep 0.05; done
delete 1
continue
end
run
"""


def section_writer_arriving():
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to hold the server mid-look")
        return
    c.create_image("arriving", 8 * MiB)
    paused, go = c.path("test", "paused"), c.path("test", "go")
    script = c.path("test", "pause.gdb")
    with open(script, "w") as f:
        f.write(PAUSE_AT_OWNERS.format(paused=paused, go=go))
    s = Server(f"rbd:{c.spec('arriving')}",
               wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    deadline = time.monotonic() + START_LIMIT
    while not os.path.exists(paused) and s.proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    if not check("gdb holds mloop-server before it reads the lock's owners",
                 os.path.exists(paused), s.stderr().strip()[-500:]):
        s.stop()
        raise Abort("no pause")
    w = librbd_client(WRITER, "arriving")
    first = w.stdout.readline().strip()
    open(go, "w").close()
    if not check("the arriving librbd writer writes", first == "writing", repr(first)):
        s.stop()
        raise Abort("no writer")
    try:
        s.proc.wait(REFUSE_LIMIT)
    except subprocess.TimeoutExpired:
        pass
    served = s.proc.poll() is None
    if served:                  # the server itself first, then gdb
        stop_under_gdb(s)
    err = s.stderr()
    check("mloop-server is refused, naming the arriving writer",
          not served and "is in use" in err, f"served: {served}: {err.strip()[-300:]!r}")
    time.sleep(1)               # the writer's next writes, had it lost the lock
    w.stdin.close()
    out = w.stdout.read().strip()
    w.wait(30)
    check("the arriving librbd writer kept writing without an error",
          w.returncode == 0 and out.startswith("wrote"), f"exit {w.returncode}: {out!r}")


# --- 2: the lock lost without a blocklist ----------------------------------

# Opens the image for writing as a client that does not blocklist the
# holders whose lock it breaks, takes the lock explicitly (so that it
# hands it to no one who asks, as mloop does), writes, says "holding",
# and releases the lock and closes the image when a line comes on stdin.
BREAKER = r"""
import rados, rbd, sys
conf, client, pool, image = sys.argv[1:5]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.conf_set("rbd_blocklist_on_break_lock", "false")
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image)
img.lock_acquire(rbd.RBD_LOCK_MODE_EXCLUSIVE)
img.write(b"z" * 4096, 8192)
print("holding", flush=True)
sys.stdin.readline()
img.lock_release()
img.close()
io.close()
cl.shutdown()
print("closed", flush=True)
"""


def write_error(h, fill, offset=0):
    """Writes a block of FILL at OFFSET through H and flushes it: None
    if both went through, else the nbd.Error that ended them."""
    try:
        h.pwrite(fill * 4096, offset)
        h.flush()
        return None
    except nbd.Error as e:
        return e


def stop_under_gdb(s):
    """Stops S, a server run under gdb: the server itself first (by its
    pid file, if it wrote one), then gdb."""
    try:
        with open(s.pid_file) as f:
            os.kill(int(f.read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    s.stop()


def holds_lock_after_write(h, image, fill):
    """Writes a block of FILL at 0 through H and flushes it, as a device's
    first write does; checks that its server then holds IMAGE's exclusive
    lock (Abort if not) and returns `rbd lock ls`'s list of holders."""
    h.pwrite(fill * 4096, 0)
    h.flush()
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec(image)))
    if not check("it holds the exclusive lock", len(held) == 1, repr(held)):
        raise Abort("no lock")
    return held


def section_lock_lost():
    c.create_image("regain", 8 * MiB)
    s = start("mloop-server", f"rbd:{c.spec('regain')}")
    h = s.connect()
    held = holds_lock_after_write(h, "regain", b"a")
    mine = held[0]["address"]
    procstop.sigstop(s.proc.pid)
    try:
        check("the stopped server's watch ends", watches_end("regain"))
        b = librbd_client(BREAKER, "regain")
        said = b.stdout.readline().strip()
        check("another client broke the lock, unblocklisted, and writes", said == "holding",
              said)
    finally:
        s.proc.send_signal(signal.SIGCONT)
    # The server's librbd re-establishes its watch and either finds its
    # lock gone (asks the other for it, is refused) or, its new watch's
    # handle equal to the old one, believes it still holds it.  Either
    # way the server compares the lock record with itself once the watch
    # is back, says the lock is lost, and leaves librbd without it.
    check("the server says its lock is lost", s.says("lock is lost", 4 * WATCH_TIMEOUT),
          s.stderr())
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("regain")))
    check("the other client still holds the lock", len(held) == 1
          and held[0]["address"] != mine, repr(held))
    b.stdin.write("\n")
    b.stdin.flush()
    said = b.stdout.readline().strip()
    b.wait(30)
    check("the other client released the lock", said == "closed", said)
    wrote = write_error(h, b"b")
    check("after the lock was lost, the server writes again", wrote is None, str(wrote))
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("regain")))
    check("it holds the exclusive lock again",
          len(held) == 1 and held[0]["address"] == mine, repr(held))
    check("it says it took the lock again", "taken again" in s.stderr(), s.stderr())
    h.shutdown()
    s.stop()
    check("the image has the write", export(c.spec("regain"))[:4096] == b"b" * 4096)


# Makes librbd, once {armed} exists, answer one write EROFS (the lock
# lost, as librbd says it) and then fail to say who owns the lock: the
# server, which still holds it in the cluster's record, finds its own
# address there with no other watch than its own.
FORGET_OWN_LOCK = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
python
import os
class Armed(gdb.Function):
    def __init__(self):
        super().__init__("armed")
    def invoke(self):
        return 1 if os.path.exists("{armed}") else 0
Armed()
end
set $forged = 0
break rbd_aio_get_return_value if $armed() && $forged == 0
commands 1
silent
set $forged = 1
return (long) -30
continue
end
break rbd_write if $armed() && $forged == 0
commands 2
silent
set $forged = 1
return (long) -30
continue
end
break rbd_is_exclusive_lock_owner if $armed()
commands 3
silent
return (int) -110
continue
end
run
"""


def blocklisted():
    return c.ceph("osd", "blocklist", "ls")


def section_own_lock_unknown():
    """librbd answers a write EROFS while the cluster still records this
    server as the lock's holder, and cannot say who owns it (gdb forges
    both answers).  The server's own watch is not counted among the
    live clients, so its own lock looked dead: it must not break it and
    blocklist itself; later writes go on under the lock it holds."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to forge librbd's answers")
        return
    c.create_image("own-lock", 8 * MiB)
    armed = c.path("test", "armed")
    script = c.path("test", "forget.gdb")
    with open(script, "w") as f:
        f.write(FORGET_OWN_LOCK.format(armed=armed))
    s = start("mloop-server under gdb", f"rbd:{c.spec('own-lock')}",
              wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    try:
        h = s.connect()
        held = holds_lock_after_write(h, "own-lock", b"a")
        mine = held[0]["address"]
        open(armed, "w").close()
        try:
            h.pwrite(b"b" * 4096, 0)
        except nbd.Error:
            pass                # the forged EROFS may fail it: not the point
        check("the server says the record names it",
              s.says("records this server", 10), s.stderr()[-600:])
        check("the server did not blocklist itself", mine not in blocklisted(),
              f"{mine} in {blocklisted()!r}")
        os.unlink(armed)
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("own-lock")))
        check("it still holds the exclusive lock",
              len(held) == 1 and held[0]["address"] == mine, repr(held))
        wrote = write_error(h, b"c", 4096)
        check("a later write goes through", wrote is None, str(wrote))
        h.shutdown()
    finally:
        stop_under_gdb(s)
    check("the image has the later write",
          export(c.spec("own-lock"))[4096:8192] == b"c" * 4096)



# Opens the image for writing (a watch on its header) and says "open";
# then, for each line on its stdin, writes 4 KiB at 64 KiB and says
# "wrote" or "refused: ERROR"; at the end of its stdin, "closed".
OPENER = r"""
import rados, rbd, sys
conf, client, pool, image = sys.argv[1:5]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image)
print("open", flush=True)
while sys.stdin.readline():
    try:
        img.write(b"w" * 4096, 65536)
        img.flush()
        print("wrote", flush=True)
    except Exception as e:
        print(f"refused: {type(e).__name__}: {e}", flush=True)
img.close()
io.close()
cl.shutdown()
print("closed", flush=True)
"""


def answer_within(p, limit):
    """P's next line (a librbd_client's), or "" when it says nothing in
    LIMIT seconds."""
    ready, _, _ = select.select([p.stdout], [], [], limit)
    return p.stdout.readline().strip() if ready else ""


def section_own_lock_unknown_live_client():
    """As 2p, with another client having the image open for writing: the
    server, which holds the lock (librbd only fails to say so), refuses
    to take it beside that client, and must not have let go of it
    before judging that client: the other client would then take the
    lock at its next write, and the device's writes fail."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to forge librbd's answers")
        return
    c.create_image("own-lock-live", 8 * MiB)
    armed = c.path("test", "armed-live")
    script = c.path("test", "forget-live.gdb")
    with open(script, "w") as f:
        f.write(FORGET_OWN_LOCK.format(armed=armed))
    s = start("mloop-server under gdb", f"rbd:{c.spec('own-lock-live')}",
              wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    o = None
    try:
        h = s.connect()
        held = holds_lock_after_write(h, "own-lock-live", b"a")
        mine = held[0]["address"]
        o = librbd_client(OPENER, "own-lock-live")
        said = answer_within(o, START_LIMIT)
        if not check("another client has the image open", said == "open", said):
            raise Abort("no other client")
        open(armed, "w").close()
        try:
            h.pwrite(b"b" * 4096, 0)
        except nbd.Error:
            pass                # the forged EROFS may fail it: not the point
        check("the server says librbd may hold the lock, not let go",
              s.says("may hold", 10), s.stderr()[-600:])
        os.unlink(armed)
        held = json.loads(c.rbd("lock", "ls", "--format", "json",
                                c.spec("own-lock-live")))
        check("the server still holds the exclusive lock",
              len(held) == 1 and held[0]["address"] == mine, repr(held))
        o.stdin.write("\n")
        o.stdin.flush()
        said = answer_within(o, 30)
        check("the other client's write is still refused",
              said.startswith("refused"), said)
        wrote = write_error(h, b"c", 4096)
        check("the server's later write goes through", wrote is None, str(wrote))
        h.shutdown()
    finally:
        if o is not None:
            o.stdin.close()
            o.wait(30)
        stop_under_gdb(s)

# Makes every rbd_lock_get_owners fail with ETIMEDOUT (an OSD slow past
# --io-timeout) while {armed} exists.
OWNERS_FAIL_ARMED = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
python
import os
class Armed(gdb.Function):
    def __init__(self):
        super().__init__("armed")
    def invoke(self):
        return 1 if os.path.exists("{armed}") else 0
Armed()
end
break rbd_lock_get_owners if $armed()
commands 1
silent
return (int) -110
continue
end
run
"""


def section_break_unseen_record_unread():
    """Another client breaks the server's lock without blocklisting it and
    takes it, the server's watch up all along: librbd, whom a break tells
    nothing, believes it still holds the lock.  The next change of the
    image's header reaches the server's update watch, whose check of the
    lock record would find the other client; here the record cannot be
    read (gdb forges a timeout).  Not knowing, the server must not go on
    writing beside that client; once the record reads again and the
    client lets the lock go, it writes again."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to forge librbd's answers")
        return
    c.create_image("unseen", 8 * MiB)
    armed = c.path("test", "unseen-armed")
    script = c.path("test", "unseen.gdb")
    with open(script, "w") as f:
        f.write(OWNERS_FAIL_ARMED.format(armed=armed))
    s = start("mloop-server under gdb", f"rbd:{c.spec('unseen')}",
              wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    b = None
    try:
        h = s.connect()
        held = holds_lock_after_write(h, "unseen", b"a")
        mine = held[0]["address"]
        open(armed, "w").close()
        # The other client, holding the lock, changes the header (a
        # snapshot), which tells the watchers: the server's update watch
        # checks the lock record.  (A change asked of the holder by a
        # third client finds two holders and fails.)
        b = librbd_client(STEALER_TOUCHING,
                          "unseen")
        said = b.stdout.readline().strip()
        if not check("another client broke the lock, unblocklisted, holds it and "
                     "takes a snapshot", said == "holding", said):
            raise Abort("no stealer")
        check("the server says it let the lock go",
              s.says("cannot be told", 5), s.stderr()[-600:])
        wrote = write_error(h, b"s")
        check("its write fails rather than land beside the lock's holder",
              wrote is not None, "the write succeeded")
        os.unlink(armed)
        check("the image does not have that write",
              export(c.spec("unseen"))[:4096] != b"s" * 4096)
        b.stdin.write("\n")
        b.stdin.flush()
        said = b.stdout.readline().strip()
        b.wait(30)
        b = None
        check("the other client let the lock go", said == "closed", said)
        time.sleep(1.1)     # past the server's pause between two tries
        wrote = write_error(h, b"t")
        check("once the lock is free, the server writes again", wrote is None,
              str(wrote))
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("unseen")))
        check("it holds the exclusive lock again",
              len(held) == 1 and held[0]["address"] == mine, repr(held))
        h.shutdown()
    finally:
        if os.path.exists(armed):
            os.unlink(armed)
        if b is not None:
            b.stdin.close()
            b.wait(30)
        stop_under_gdb(s)


# Holds mloop-server at its second rbd_lock_get_owners, the first after
# its rbd_lock_acquire (no lock record yet: the first is its look at who
# lives on the image), until {go} exists.
PAUSE_AFTER_ACQUIRE = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break rbd_lock_get_owners
ignore 1 1
commands 1
silent
shell touch {paused}
shell while [ ! -e {go} ]; do sleep 0.05; done
delete 1
continue
end
{more}run
"""

# With PAUSE_AFTER_ACQUIRE: the server's first rbd_is_exclusive_lock_owner,
# its look at whether it still holds the lock it read the owner of,
# fails with ETIMEDOUT (an OSD slow past --io-timeout).
OWNER_UNTOLD = """break rbd_is_exclusive_lock_owner
commands 2
silent
delete 2
return (int) -110
continue
end
"""

# Breaks the lock's holders without blocklisting them, takes the lock
# explicitly, says "holding", and lets it go when a line comes on stdin.
STEALER = r"""
import rados, rbd, sys
conf, client, pool, image = sys.argv[1:5]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.conf_set("rbd_blocklist_on_break_lock", "false")
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image)
for o in list(img.lock_get_owners()):
    img.lock_break(rbd.RBD_LOCK_MODE_EXCLUSIVE, o["owner"])
img.lock_acquire(rbd.RBD_LOCK_MODE_EXCLUSIVE)
print("holding", flush=True)
sys.stdin.readline()
img.lock_release()
img.close()
io.close()
cl.shutdown()
print("closed", flush=True)
"""

# STEALER, which then takes a snapshot: a change of the image's header,
# which librbd tells every watcher of (the server's update watch).
STEALER_TOUCHING = STEALER.replace('print("holding"',
                                   'img.create_snap("touched")\nprint("holding"')


def section_lock_stolen_at_start(untold=False):
    """Another client breaks the lock mloop-server has just taken, without
    blocklisting it, and takes it, before the server reads whose the
    lock is (gdb holds it there): the server must not take that client
    for itself, nor write it into the device's lock record as one of
    the device's servers (whose lock the next server breaks, and which
    it blocklists).  UNTOLD: librbd then fails to say whether it still
    holds the lock, and the server must not write all the same."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to hold the server after it took the lock")
        return
    name = "stolen-untold" if untold else "stolen"
    c.create_image(name, 8 * MiB)
    paused, go = c.path("test", f"{name}-paused"), c.path("test", f"{name}-go")
    record = c.path("test", f"{name}.lock")
    script = c.path("test", f"{name}.gdb")
    with open(script, "w") as f:
        f.write(PAUSE_AFTER_ACQUIRE.format(paused=paused, go=go,
                                           more=OWNER_UNTOLD if untold else ""))
    s = Server(f"rbd:{c.spec(name)}", args=["--lock-record=" + record],
               wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    b = None
    try:
        deadline = time.monotonic() + START_LIMIT
        while not os.path.exists(paused) and s.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        if not check("gdb holds mloop-server after it took the lock",
                     os.path.exists(paused), s.stderr().strip()[-500:]):
            raise Abort("no pause")
        b = librbd_client(STEALER, name)
        said = b.stdout.readline().strip()
        if not check("another client broke the lock, unblocklisted, and holds it",
                     said == "holding", said):
            raise Abort("no stealer")
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec(name)))
        theirs = held[0]["address"] if len(held) == 1 else None
        open(go, "w").close()
        s.ready()
        with open(record) as f:
            lines = f.read().split()
        check("the lock record does not name the other client as this device's",
              theirs is not None and theirs not in lines, f"{theirs!r} in {lines!r}")
        h = s.connect()
        wrote = write_error(h, b"s")
        check("its write fails rather than land beside the lock's holder",
              wrote is not None, "the write succeeded")
        check("the image does not have that write",
              export(c.spec(name))[:4096] != b"s" * 4096)
        check("the server says it let the lock go",
              s.says("cannot be told" if untold else "taken from this server", 10),
              s.stderr()[-600:])
        # It said a write takes the lock again once it is free: not only
        # the first write, which found the other client holding it.
        b.stdin.write("\n")
        b.stdin.flush()
        said = b.stdout.readline().strip()
        b.wait(30)
        b = None
        check("the other client let the lock go", said == "closed", said)
        time.sleep(1.1)     # past the server's pause between two tries
        wrote = write_error(h, b"t")
        check("once the lock is free, the server writes again", wrote is None,
              str(wrote))
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec(name)))
        check("it holds the exclusive lock again", len(held) == 1
              and held[0]["address"] != theirs, repr(held))
        check("the image has the write made once the lock was free",
              export(c.spec(name))[:4096] == b"t" * 4096)
        # The lock taken again, its holder is known: a client breaking
        # it unseen (the server's watch up) and changing the header is
        # found, as it is for a server that knew its address from the
        # start (2s).
        b = librbd_client(STEALER_TOUCHING,
                          name)
        said = b.stdout.readline().strip()
        if not check("a third client breaks the lock unseen, holds it and takes a "
                     "snapshot", said == "holding", said):
            raise Abort("no second stealer")
        check("the server says the lock is lost",
              s.says("exclusive lock is lost", 5), s.stderr()[-600:])
        wrote = write_error(h, b"u")
        check("its write fails rather than land beside that client",
              wrote is not None, "the write succeeded")
        h.shutdown()
    finally:
        if b is not None:
            b.stdin.close()
            b.wait(30)
        stop_under_gdb(s)


# Makes mloop-server's rbd_lock_get_owners after the {looks} before it
# (its look at who lives on the image, and with a lock record its look
# at whether a recorded server holds the lock), its read of the address
# it holds the lock it has just taken under, fail with ETIMEDOUT, and
# leaves librbd alone after.
HOLDER_UNREAD = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break rbd_lock_get_owners
ignore 1 {looks}
commands 1
silent
delete 1
return (int) -110
continue
end
run
"""


def section_holder_unread_at_start():
    """The server takes the lock, then cannot read the address it holds
    it under (gdb forges a timeout): not knowing it, it could never tell
    from the lock record that another client broke the lock unseen, and
    would write beside it.  It lets the lock go, a write takes it again
    and learns the address; then a client breaking the lock unseen (the
    server's watch up) and taking a snapshot has the server's next write
    fail rather than land beside it."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to forge librbd's answer")
        return
    c.create_image("holder-unread", 8 * MiB)
    script = c.path("test", "holder-unread.gdb")
    with open(script, "w") as f:
        f.write(HOLDER_UNREAD.format(looks=1))
    s = Server(f"rbd:{c.spec('holder-unread')}",
               wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    b = None
    try:
        if not check("the server starts", s.ready(), s.stderr().strip()[-500:]):
            raise Abort("no start")
        h = s.connect()
        holds_lock_after_write(h, "holder-unread", b"a")
        b = librbd_client(STEALER_TOUCHING,
                          "holder-unread")
        said = b.stdout.readline().strip()
        if not check("another client breaks the lock unseen, holds it and takes a "
                     "snapshot", said == "holding", said):
            raise Abort("no stealer")
        time.sleep(1)       # the server's check, woken by the snapshot
        wrote = write_error(h, b"b")
        check("its write fails rather than land beside that client",
              wrote is not None, "the write succeeded")
        check("the image does not have that write",
              export(c.spec("holder-unread"))[:4096] != b"b" * 4096)
        h.shutdown()
    finally:
        if b is not None:
            b.stdin.close()
            b.wait(30)
        stop_under_gdb(s)


# HOLDER_UNREAD, and the release that follows it never reaching the
# lock: the first write operation on the image's header after the forged
# timeout (librbd's unlock) goes to an object that does not exist, as an
# unlock lost on its way (an OSD restarted, a timeout) leaves the lock
# recorded.  librbd takes any failed unlock for done.
HOLDER_UNREAD_UNLOCK_LOST = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
python
class OnHeader(gdb.Function):
    def __init__(self):
        super().__init__("on_header")
    def invoke(self, oid):
        data = oid.cast(gdb.lookup_type("char").pointer().pointer()).dereference()
        return 1 if data.string(length=11) == "rbd_header." else 0
OnHeader()
end
set $lose = 0
break rbd_lock_get_owners
ignore 1 1
commands 1
silent
delete 1
set $lose = 1
return (int) -110
continue
end
break _ZN8librados7v14_2_05IoCtx11aio_operateERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEPNS0_13AioCompletionEPNS0_20ObjectWriteOperationE if $lose && $on_header($rsi)
commands 2
silent
set $lose = 0
set var **(char **) $rsi = 'X'
continue
end
run
"""


def section_holder_unread_unlock_lost():
    """As the lock's holder unread at the start, but the release that
    lets the lock go never reaches the cluster (gdb sends it astray):
    librbd, which takes any failed unlock for done, believes it holds
    nothing while the cluster still records this server as the holder.
    That lock is this very server's and no one else's, so it must not
    keep the server from writing: its first write takes the lock again
    and succeeds, the server neither blocklisted nor holding the lock
    twice."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to forge librbd's answer")
        return
    c.create_image("unlock-lost", 8 * MiB)
    script = c.path("test", "unlock-lost.gdb")
    with open(script, "w") as f:
        f.write(HOLDER_UNREAD_UNLOCK_LOST)
    s = Server(f"rbd:{c.spec('unlock-lost')}",
               wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    try:
        if not check("the server starts", s.ready(), s.stderr().strip()[-500:]):
            raise Abort("no start")
        check("it says it let the lock go", s.says("let go", 5),
              s.stderr()[-600:])
        held = json.loads(c.rbd("lock", "ls", "--format", "json",
                                c.spec("unlock-lost")))
        if not check("the cluster still records the server as the holder",
                     len(held) == 1, repr(held)):
            raise Abort("the unlock was not lost")
        mine = held[0]["address"]
        h = s.connect()
        for attempt in range(2):
            wrote = write_error(h, b"u")
            if wrote is None:
                break
            time.sleep(1.1)     # past the server's pause between two tries
        check("its write takes the lock again and succeeds", wrote is None,
              f"{wrote}: {s.stderr()[-600:]}")
        check("it says it let its own recorded lock go, not broken",
              "let go, not broken" in s.stderr(), s.stderr()[-600:])
        held = json.loads(c.rbd("lock", "ls", "--format", "json",
                                c.spec("unlock-lost")))
        check("it holds the exclusive lock, once",
              len(held) == 1 and held[0]["address"] == mine, repr(held))
        check("the server did not blocklist itself", mine not in blocklisted(),
              f"{mine} in {blocklisted()!r}")
        h.shutdown()
    finally:
        stop_under_gdb(s)
    check("the image has the write",
          export(c.spec("unlock-lost"))[:4096] == b"u" * 4096)


# Makes mloop-server's first rbd_lock_get_owners (its look at who holds
# the lock) fail with ETIMEDOUT, as an OSD slow past --io-timeout would
# answer it, and leaves librbd alone after.
OWNERS_UNREAD = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break rbd_lock_get_owners
commands 1
silent
delete 1
return (int) -110
continue
end
run
"""


def section_owners_unread():
    """The lock's owners cannot be read (gdb forges a timeout) while its
    holder, a server stopped (SIGSTOP) until the OSD dropped its watch,
    is on an image whose configuration turns librbd's blocklisting off.
    Not knowing who holds the lock, the new server must not ask librbd
    for it: librbd would break a holder it finds without a watch, not
    blocklisting it, and the holder, continued, would write beside the
    new server.  It is refused in one line, and the holder writes on."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to forge librbd's answer")
        return
    c.create_image("owners-unread", 8 * MiB)
    c.rbd("config", "image", "set", c.spec("owners-unread"),
          "rbd_blocklist_on_break_lock", "false")
    spec = f"rbd:{c.spec('owners-unread')}"
    old = start("a server holding the lock", spec)
    h_old = old.connect()
    held = holds_lock_after_write(h_old, "owners-unread", b"o")
    procstop.sigstop(old.proc.pid)
    try:
        check("the stopped server's watch ends", watches_end("owners-unread"))
        script = c.path("test", "owners-unread.gdb")
        with open(script, "w") as f:
            f.write(OWNERS_UNREAD)
        new = Server(spec, wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
        if new.ready(REFUSE_LIMIT):
            check("a server that cannot read the lock's owners is refused", False,
                  "it started: " + new.stderr().strip()[-500:])
            with open(new.pid_file) as f:
                os.kill(int(f.read()), signal.SIGTERM)
            new.stop()
        else:
            new.proc.wait(60)   # gdb's exit, not the server's: its line says
            said = [line for line in new.stderr().splitlines()
                    if line.startswith("mloop-server")]
            check("a server that cannot read the lock's owners is refused in one line",
                  len(said) == 1 and "who holds its exclusive lock" in said[0],
                  repr(said))
    finally:
        old.proc.send_signal(signal.SIGCONT)
    now = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("owners-unread")))
    check("the stopped server still holds the lock",
          [e["address"] for e in now] == [held[0]["address"]], f"{now!r}, was {held!r}")
    wrote = write_error(h_old, b"p")
    check("the continued server writes on", wrote is None, str(wrote))
    h_old.shutdown()
    old.stop()


# --- a device's successive servers -----------------------------------------

def section_successors():
    """A device's server SIGKILLed and started again (the supervisor's
    restart), twice: each successor finds the dead server's watch still
    up (Ceph's 30 s here), and the lock record (--lock-record) names it
    as the device's own, its lock to be broken, not a live client's."""
    c.create_image("successors", 8 * MiB)
    spec = f"rbd:{c.spec('successors')}"
    record = ["--lock-record=" + c.path("test", "successors.lock")]
    c.ceph("config", "set", "osd", "osd_client_watch_timeout",
           str(SUCCESSOR_WATCH_TIMEOUT))
    try:
        for n in range(3):
            if n > 0:
                # (The server killed before it was blocklisted when its lock
                # was broken, and the OSD drops a blocklisted client's watch.)
                check(f"the killed server's watch is up as server {n + 1} starts",
                      len(watchers("successors")) >= 1, repr(watchers("successors")))
            s = start(f"server {n + 1} of one device", spec, args=record)
            h = s.connect()
            for before in range(n):
                check(f"server {n + 1} reads server {before + 1}'s write",
                      h.pread(4096, before * 4096) == bytes([before + 1]) * 4096)
            h.pwrite(bytes([n + 1]) * 4096, n * 4096)
            h.flush()
            if n < 2:
                s.proc.kill()
                s.proc.wait()
                h = None   # closes the dead connection
        h.shutdown()
        s.stop()
    finally:
        c.ceph("config", "set", "osd", "osd_client_watch_timeout", str(WATCH_TIMEOUT))
    check("the image has every server's write",
          export(spec[len("rbd:"):])[:3 * 4096] == b"".join(bytes([n + 1]) * 4096
                                                             for n in range(3)))


# Runs the server until its first call of FUNCTION, then kills it
# (SIGKILL): a device's server killed mid-start.  {finish}: "finish",
# killed once that call has returned; "", as it is called.
KILL_AT = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break {function}
run
{finish}
shell touch {killed}
kill
quit
"""


def killed_at(function, spec, record, name, returned=True):
    """Starts a server of SPEC under gdb, killed once FUNCTION returns
    (RETURNED), or as it is called; waits for its end; whether it got
    there."""
    killed = c.path("test", f"killed-{name}")
    script = c.path("test", f"kill-{name}.gdb")
    with open(script, "w") as f:
        f.write(KILL_AT.format(function=function, killed=killed,
                               finish="finish" if returned else ""))
    s = Server(spec, args=record, wrap=[shutil.which("gdb"), "-q", "-batch", "-nx", "-x",
                                        script, "--args"])
    try:
        s.proc.wait(START_LIMIT)
    except subprocess.TimeoutExpired:
        s.stop()
    return os.path.exists(killed)


def section_killed_mid_start():
    """A device's servers killed mid-start (gdb stops each as a librbd
    call returns), their watches lingering (Ceph's 30 s here): one the
    moment it holds the lock (rbd_lock_acquire), before any later step;
    then its successor the moment it has broken that lock
    (rbd_lock_break), before it takes it.  The next server with the same
    lock record must still take each for the device's own dead server,
    break what lock it holds, and serve, as the supervisor's restart
    needs: the record must already name each."""
    if shutil.which("gdb") is None:
        print("# skipped: no gdb to kill the server mid-start")
        return
    c.create_image("cut-short", 8 * MiB)
    spec = f"rbd:{c.spec('cut-short')}"
    path = c.path("test", "cut-short.lock")
    record = ["--lock-record=" + path]
    c.ceph("config", "set", "osd", "osd_client_watch_timeout",
           str(SUCCESSOR_WATCH_TIMEOUT))
    try:
        held = []
        for n, function in enumerate(["rbd_lock_acquire", "rbd_lock_break"]):
            died = killed_at(function, spec, record, function)
            held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("cut-short")))
            if not check(f"server {n + 1} was killed as its {function} returned", died,
                         f"lock {held!r}"):
                raise Abort("not killed")
        check("the lock is free, the second server killed before taking it", held == [],
              repr(held))
        # (The first's is gone: the second blocklisted it, and the OSD
        # drops a blocklisted client's watch.)
        check("the second killed server's watch is up as the third starts",
              len(watchers("cut-short")) >= 1, repr(watchers("cut-short")))
        s = start("the third server", spec, args=record)
        h = s.connect()
        h.pwrite(b"n" * 4096, 0)
        h.flush()
        check("its write is in the image", h.pread(4096, 0) == b"n" * 4096)
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("cut-short")))
        with open(path) as f:
            lines = f.read().splitlines()
        check("the record names it, then the two servers killed",
              len(held) == 1 and len(lines) == 3 and lines[0] == held[0]["address"],
              f"{lines!r}, lock {held!r}")
        check("no temporary record is left", not os.path.exists(path + ".tmp"))
        h.shutdown()
        s.stop()
    finally:
        c.ceph("config", "set", "osd", "osd_client_watch_timeout", str(WATCH_TIMEOUT))


def section_retaken_after_killed():
    """A device's server killed as it calls rbd_lock_acquire: recorded,
    its watch up, but holding no lock, so its successor (the same lock
    record) blocklists nobody and the OSD keeps that watch for
    osd_client_watch_timeout (Ceph's 30 s here).  The successor, which
    cannot read the address it holds the lock it takes under (gdb forges
    a timeout), lets the lock go, and its first write must take the lock
    again as the start took it: the killed server's watch no sign of a
    live writer there either, and the write must succeed."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to kill the server mid-start")
        return
    c.create_image("retaken", 8 * MiB)
    spec = f"rbd:{c.spec('retaken')}"
    path = c.path("test", "retaken.lock")
    record = ["--lock-record=" + path]
    c.ceph("config", "set", "osd", "osd_client_watch_timeout",
           str(SUCCESSOR_WATCH_TIMEOUT))
    s = None
    try:
        died = killed_at("rbd_lock_acquire", spec, record, "retaken", returned=False)
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("retaken")))
        if not check("a server was killed as it called rbd_lock_acquire, holding no "
                     "lock", died and held == [], f"lock {held!r}"):
            raise Abort("not killed")
        with open(path) as f:
            dead = f.read().splitlines()
        script = c.path("test", "retaken.gdb")
        with open(script, "w") as f:
            f.write(HOLDER_UNREAD.format(looks=2))
        s = Server(spec, args=record,
                   wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
        if not check("its successor starts", s.ready(), s.stderr().strip()[-500:]):
            raise Abort("no start")
        check("it says it let the lock go", s.says("let go", 5), s.stderr()[-600:])
        up = [w["address"] for w in watchers("retaken")]
        if not check("the killed server's watch is up as its successor writes",
                     len(dead) == 1 and dead[0] in up, f"record {dead!r}, watchers {up!r}"):
            raise Abort("no lingering watch")
        h = s.connect()
        wrote = write_error(h, b"r")
        check("the successor's write takes the lock again and succeeds",
              wrote is None, f"{wrote}: {s.stderr().strip()[-600:]}")
        held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("retaken")))
        check("the successor holds the lock",
              len(held) == 1 and held[0]["address"] not in dead, repr(held))
        h.shutdown()
    finally:
        if s is not None:
            stop_under_gdb(s)
        c.ceph("config", "set", "osd", "osd_client_watch_timeout", str(WATCH_TIMEOUT))
    check("the image has the write", export(c.spec("retaken"))[:4096] == b"r" * 4096)


def section_foreign_record():
    """A lock record that another user could have written (theirs, or
    writable by them: a path in /tmp, say), naming a live writer as if
    it were one of the device's servers: the server refuses the record
    in one line instead of breaking the writer's lock, blocklisting it
    and ignoring its watch, and the writer keeps writing."""
    c.create_image("foreign-record", 8 * MiB)
    w = librbd_client(WRITER, "foreign-record")
    if not check("a librbd writer writes", w.stdout.readline().strip() == "writing"):
        raise Abort("no writer")
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("foreign-record")))
    if not check("the librbd writer holds the exclusive lock", len(held) == 1, repr(held)):
        raise Abort("no lock")
    path = c.path("test", "foreign.lock")
    with open(path, "w") as f:
        f.write(held[0]["address"] + "\n")
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)        # nobody's
    else:
        os.chmod(path, 0o666)               # anybody may write it
    refused_in_one_line("mloop-server given another user's lock record",
                        Server(f"rbd:{c.spec('foreign-record')}",
                               args=["--lock-record=" + path]),
                        [path, "no one else may write"])
    time.sleep(1)               # the writer's next writes, had it lost the lock
    w.stdin.close()
    out = w.stdout.read().strip()
    w.wait(30)
    check("the librbd writer kept writing without an error",
          w.returncode == 0 and out.startswith("wrote"), f"exit {w.returncode}: {out!r}")


def section_read_only_nbdkit():
    """`mloop serve --read-only --server nbdkit` (and so `mloop attach -r
    --server nbdkit`) of an image a live librbd writer holds: read-only,
    it must take no lock, as mloop-server -r takes none, so it serves
    beside the writer, which keeps its lock and writes on."""
    cli, plugin = os.environ.get("MLOOP_CLI"), harness.PLUGIN
    if shutil.which("nbdkit") is None or not cli or not os.path.exists(cli) \
            or not plugin or not os.path.exists(plugin):
        print("# skipped: no nbdkit, built plugin (MLOOP_PLUGIN) or mloop (MLOOP_CLI)")
        return
    c.create_image("read-only-nbdkit", 8 * MiB)
    w = librbd_client(WRITER, "read-only-nbdkit")
    if not check("a librbd writer writes", w.stdout.readline().strip() == "writing"):
        raise Abort("no writer")
    held = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("read-only-nbdkit")))
    sock = c.path("test", "read-only-nbdkit.sock")
    err_path = c.path("test", "read-only-nbdkit.err")
    with open(err_path, "wb") as err:
        p = subprocess.Popen([cli, "serve", "--read-only", "--server", "nbdkit",
                              "--listen", f"unix:{sock}", "--ceph-conf", c.conf,
                              "--ceph-id", c.client_id, f"rbd:{c.spec('read-only-nbdkit')}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=err, env=harness.nbdkit_env(),
                             preexec_fn=cluster._die_with(os.getpid()))
    others.append(p)
    h, deadline = None, time.monotonic() + START_LIMIT
    while h is None and p.poll() is None and time.monotonic() < deadline:
        try:
            h = nbd.NBD()
            h.connect_unix(sock)
            h.get_size()
        except nbd.Error:
            h = None
            time.sleep(0.2)
    try:
        with open(err_path, errors="replace") as f:
            said = f.read().strip()
        if not check("the read-only nbdkit serves beside the writer", h is not None,
                     f"exit {p.poll()}: {said!r}"):
            raise Abort("not serving")
        check("it is read-only", h.is_read_only())
        check("it reads the image", len(h.pread(4096, 0)) == 4096)
        now = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("read-only-nbdkit")))
        check("the writer keeps the exclusive lock",
              [e["address"] for e in now] == [e["address"] for e in held], f"{now!r}")
        h.shutdown()
    finally:
        p.terminate()
        p.wait(30)
    w.stdin.close()
    out = w.stdout.read().strip()
    w.wait(30)
    check("the librbd writer kept writing without an error",
          w.returncode == 0 and out.startswith("wrote"), f"exit {w.returncode}: {out!r}")


def section_unfenced_predecessor():
    """The image's own configuration turns librbd's blocklisting off
    (rbd_blocklist_on_break_lock false): a device's server stopped, not
    dead, and a successor started with the same lock record breaks its
    lock; the stopped server is fenced all the same, so that once
    continued its writes fail instead of landing over the successor's."""
    c.create_image("unfenced", 8 * MiB)
    c.rbd("config", "image", "set", c.spec("unfenced"), "rbd_blocklist_on_break_lock",
          "false")
    # A fence of a day, where the monitors' default is an hour.
    c.rbd("config", "image", "set", c.spec("unfenced"), "rbd_blocklist_expire_seconds",
          "86400")
    spec = f"rbd:{c.spec('unfenced')}"
    record = ["--lock-record=" + c.path("test", "unfenced.lock")]
    old = start("a device's server", spec, args=record)
    h_old = old.connect()
    held = holds_lock_after_write(h_old, "unfenced", b"o")
    procstop.sigstop(old.proc.pid)
    try:
        new = start("its successor, the first stopped", spec, args=record)
        h_new = new.connect()
        h_new.pwrite(b"n" * 4096, 0)
        h_new.flush()
        listed = c.ceph("osd", "blocklist", "ls")
        check("the stopped server is blocklisted", held[0]["address"] in listed,
              f"{held[0]['address']} not in {listed!r}")
        # (Its JSON shares stdout with "[]", the range blocklist's.)
        out = c.ceph("osd", "blocklist", "ls", "-f", "json")
        listed = json.JSONDecoder().raw_decode(out.lstrip())[0]
        entries = [e for e in listed if e.get("addr") == held[0]["address"]]
        until = [datetime.datetime.strptime(e["until"], "%Y-%m-%dT%H:%M:%S.%f%z")
                 for e in entries]
        left = [(u - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
                for u in until]
        check("for the day the image's rbd_blocklist_expire_seconds says",
              len(left) == 1 and 86400 - 600 < left[0] <= 86400,
              f"{entries!r}")
    finally:
        old.proc.send_signal(signal.SIGCONT)
    wrote = write_error(h_old, b"x")
    check("the continued server's write fails", wrote is not None, "it succeeded")
    check("the successor's write is intact", h_new.pread(4096, 0) == b"n" * 4096)
    h_new.shutdown()
    new.stop()
    old.stop()


def section_resize_open():
    """`mloop resize` opens a device's image with no lock (shared), by the
    name the device was attached by and with its lock record, beside the
    device's server, which holds the lock and is the newest server the
    record names; mloop-server --shared with that record opens it the
    same way.  A name saying :shared=off must not make that open take
    the lock: it would break the server's and blocklist it, and every
    later request of the device would fail."""
    c.create_image("resize-open", 8 * MiB)
    spec = f"rbd:{c.spec('resize-open')}:shared=off"
    record = ["--lock-record=" + c.path("test", "resize-open.lock")]
    s = start("a device's server on NAME:shared=off", spec, args=record)
    h = s.connect()
    held = holds_lock_after_write(h, "resize-open", b"s")
    opener = start("a shared open beside it with the device's lock record, as "
                   "mloop resize's", spec, args=["--shared", *record])
    now = json.loads(c.rbd("lock", "ls", "--format", "json", c.spec("resize-open")))
    check("the device's server keeps the exclusive lock",
          [e["address"] for e in now] == [held[0]["address"]], f"{now!r}, was {held!r}")
    listed = c.ceph("osd", "blocklist", "ls")
    check("the device's server is not blocklisted", held[0]["address"] not in listed,
          listed)
    try:
        h.pwrite(b"t" * 4096, 0)
        h.flush()
        wrote = h.pread(4096, 0) == b"t" * 4096
    except nbd.Error as e:
        wrote = e
    check("the device's server still writes", wrote is True, repr(wrote))
    opener.stop()
    h.shutdown()
    s.stop()


# Longer than librbd's RBD_MAX_IMAGE_NAME_SIZE (96), a bound of format 1.
MOVED = "moved-" + "x" * 120


def section_renamed():
    """A device's image renamed (`rbd mv`) while its server holds it, the
    server killed and another image given the old name: the device's
    next server (the same lock record) serves the image the device was
    attached to, not the newcomer, and says it was renamed; once that
    image is removed, it is refused in one line naming both images.  A
    snapshot's next server, its snapshot renamed and another given its
    name, serves the first, and is refused once that is removed."""
    c.create_image("moving", 8 * MiB)
    spec = f"rbd:{c.spec('moving')}"
    record = ["--lock-record=" + c.path("test", "moving.lock")]
    s = start("a device's first server", spec, args=record)
    h = s.connect()
    h.pwrite(b"a" * 4096, 0)
    h.flush()
    c.rbd("mv", c.spec("moving"), c.spec(MOVED))
    s.proc.kill()
    s.proc.wait()
    h = None   # closes the dead connection
    c.create_image("moving", 16 * MiB)
    s = start("its next server, the image renamed", spec, args=record)
    h = s.connect()
    check("it serves the image the device was attached to",
          h.get_size() == 8 * MiB and h.pread(4096, 0) == b"a" * 4096,
          f"{h.get_size()} bytes")
    h.pwrite(b"b" * 4096, 4096)
    h.flush()
    check("it says the image was renamed, naming it", MOVED in s.stderr(), s.stderr())
    h.shutdown()
    s.stop()
    check("the image now named as it was is untouched",
          export(c.spec("moving"))[:8192] == bytes(8192))
    check("the renamed image has both servers' writes",
          export(c.spec(MOVED))[:8192] == b"a" * 4096 + b"b" * 4096)
    c.rbd("rm", "--no-progress", c.spec(MOVED))
    refused_in_one_line("its next server, the image removed", Server(spec, args=record),
                        ["gone", "moving"])

    w = start("mloop-server of the image now named so", spec)
    h = w.connect()
    h.pwrite(b"s" * 4096, 0)
    h.flush()
    c.rbd("snap", "create", c.spec("moving", "first"))
    snap = f"rbd:{c.spec('moving', 'first')}"
    record = ["--lock-record=" + c.path("test", "first.lock")]
    s = start("a snapshot's first server", snap, args=record)
    s.stop()
    c.rbd("snap", "rename", c.spec("moving", "first"), c.spec("moving", "second"))
    h.pwrite(b"c" * 4096, 0)
    h.flush()
    c.rbd("snap", "create", c.spec("moving", "first"))
    s = start("its next server, the snapshot renamed and another given its name", snap,
              args=record)
    hs = s.connect()
    check("it serves the snapshot the device was attached to",
          hs.pread(4096, 0) == b"s" * 4096)
    hs.shutdown()
    s.stop()
    c.rbd("snap", "rm", c.spec("moving", "second"))
    refused_in_one_line("its next server, the snapshot removed", Server(snap, args=record),
                        ["snapshot", "gone"])
    h.shutdown()
    w.stop()

# A name another client of the cluster gives a device's image: a line
# break, then a line of its own, and an escape sequence (ESC [2J clears a
# terminal).
FORGED = "renamed\nmloop-server: forged line\x1b[2J"


def section_renamed_hostile():
    """A device's image renamed (`rbd mv`, by any client that may write
    the pool) to a name holding a line break and an escape sequence: the
    next server says it was renamed in one line, the name's control
    characters escaped, so that the cluster's client forges no line in
    the device's server.log and moves no cursor of whoever reads it."""
    c.create_image("renamed-hostile", 8 * MiB)
    spec = f"rbd:{c.spec('renamed-hostile')}"
    record = ["--lock-record=" + c.path("test", "renamed-hostile.lock")]
    start("a device's first server", spec, args=record).stop()
    r = subprocess.run([sys.executable, "-c", """
import rados, rbd, sys
conf, client, pool, src, dest = sys.argv[1:6]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.connect()
io = cl.open_ioctx(pool)
rbd.RBD().rename(io, src, dest)
io.close()
cl.shutdown()
""", c.conf, c.client_id, c.pool, "renamed-hostile", FORGED], capture_output=True,
                       text=True)
    if not check("another client renames the image", r.returncode == 0, r.stderr):
        raise Abort("not renamed")
    s = start("its next server, the image renamed", spec, args=record)
    err = s.stderr()
    s.stop()
    said = [line for line in err.splitlines() if "renamed" in line]
    check("it says the image was renamed", said != [], repr(err))
    check("no line of the log is the forged one",
          not any(line.startswith("mloop-server: forged line") for line in err.splitlines()),
          repr(err))
    check("the log holds no escape character", "\x1b" not in err, repr(err))


def section_long_snapshot_name():
    """A snapshot's device whose snapshot has a name of 5,000 characters
    (Ceph takes it): the record of which snapshot the device serves is
    as long, and the device's next server must read it and serve, not
    take it for no record at all and refuse every restart."""
    c.create_image("long-named", 8 * MiB)
    w = start("mloop-server writing the image", f"rbd:{c.spec('long-named')}")
    h = w.connect()
    h.pwrite(b"l" * 4096, 0)
    h.flush()
    h.shutdown()
    w.stop()
    snap = "s" * 5000
    c.rbd("snap", "create", c.spec("long-named", snap))
    spec = f"rbd:{c.spec('long-named', snap)}"
    record = ["--lock-record=" + c.path("test", "long-named.lock")]
    start("the snapshot's first server", spec, args=record).stop()
    s = start("its next server", spec, args=record)
    hs = s.connect()
    check("it serves the snapshot", hs.pread(4096, 0) == b"l" * 4096)
    hs.shutdown()
    s.stop()


def section_feature_off():
    """The exclusive-lock feature turned off while the server holds the
    lock (librbd has the holder perform it): any client may then write
    beside the server, and the server must say so."""
    c.create_image("unlocked", 8 * MiB)
    s = start("mloop-server", f"rbd:{c.spec('unlocked')}")
    h = s.connect()
    h.pwrite(b"s" * 4096, 0)
    h.flush()
    c.rbd("feature", "disable", c.spec("unlocked"), "fast-diff", "object-map",
          "exclusive-lock")
    check("the server says its image's exclusive-lock feature is off",
          s.says("exclusive-lock feature was turned off", REFUSE_LIMIT), s.stderr())
    h.shutdown()
    s.stop()


def check_read_fails(what, h):
    """Checks that a read of WHAT, 4 KiB at 0 through H, fails."""
    try:
        got = h.pread(4096, 0)
    except nbd.Error as e:
        got = e
    check(f"a read of {what} fails", isinstance(got, nbd.Error),
          f"read {bytes(got[:4])!r}" if not isinstance(got, nbd.Error) else "")


def section_snapshot_removed():
    """A snapshot removed while it is served: librbd's read-only open has
    no watch and would go on reading at the removed snapshot's id, which
    the OSD answers from the image as it is now; the server must fail
    the reads instead, and say why."""
    c.create_image("snapped", 8 * MiB)
    w = start("mloop-server of the image", f"rbd:{c.spec('snapped')}")
    h = w.connect()
    h.pwrite(b"1" * 4096, 0)
    h.flush()
    c.rbd("snap", "create", c.spec("snapped", "before"))
    s = start("mloop-server of its snapshot", f"rbd:{c.spec('snapped', 'before')}")
    hs = s.connect()
    check("the snapshot reads as it was", hs.pread(4096, 0) == b"1" * 4096)
    c.rbd("snap", "rm", c.spec("snapped", "before"))
    h.pwrite(b"2" * 4096, 0)
    h.flush()
    check("the server says the snapshot was removed",
          s.says("snapshot was removed", REFUSE_LIMIT), s.stderr())
    check_read_fails("the removed snapshot", hs)
    hs.shutdown()
    s.stop()
    h.shutdown()
    w.stop()

    # The check waiting for a cluster gone must not hold up a stop.
    c.rbd("snap", "create", c.spec("snapped", "kept"))
    s = start("mloop-server of another snapshot", f"rbd:{c.spec('snapped', 'kept')}")
    c.pause()
    try:
        time.sleep(3)           # a check under way, unanswered
        t = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(REFUSE_LIMIT)
        except subprocess.TimeoutExpired:
            pass
        check("the snapshot's server stops while the cluster is paused",
              s.proc.poll() is not None, f"running {time.monotonic() - t:.1f} s after SIGTERM")
    finally:
        c.resume()
        s.stop()

    # The image itself removed, its snapshots first, between two checks:
    # no header left to ask, and the snapshot gone with it.
    s = start("mloop-server of a snapshot", f"rbd:{c.spec('snapped', 'kept')}")
    hs = s.connect()
    c.rbd("snap", "purge", c.spec("snapped"))
    c.rbd("rm", "--no-progress", c.spec("snapped"))
    check("the server says the snapshot of a removed image was removed",
          s.says("snapshot was removed", REFUSE_LIMIT), s.stderr())
    check_read_fails("the removed image's snapshot", hs)
    hs.shutdown()
    s.stop()


def section_read_only_removed():
    """An image served read-only, then removed (`rbd rm`, which nothing
    stops: a read-only open sets no watch) or moved to the trash: its
    objects are gone or may go at any time, and reads would answer
    zeroes; the server must fail them instead, and say why."""
    # `rbd rm` moves the image to the trash first: either may be seen.
    for name, remove, words in [
            ("removed", ("rm", "--no-progress"), ("was removed", "moved to the trash")),
            ("trashed", ("trash", "mv"), ("moved to the trash",))]:
        c.create_image(name, 8 * MiB)
        w = start(f"mloop-server writing the image to be {name}", f"rbd:{c.spec(name)}")
        h = w.connect()
        h.pwrite(b"r" * 4096, 0)
        h.flush()
        h.shutdown()
        w.stop()
        s = start(f"a read-only mloop-server of the image to be {name}",
                  f"rbd:{c.spec(name)}", args=["--read-only"])
        hs = s.connect()
        check(f"the image to be {name} reads as written",
              hs.pread(4096, 0) == b"r" * 4096)
        c.rbd(*remove, c.spec(name))
        deadline = time.monotonic() + REFUSE_LIMIT
        while (not any(w in s.stderr() for w in words)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        check(f"the read-only server says its image {' or '.join(words)}",
              any(w in s.stderr() for w in words), s.stderr())
        check_read_fails(f"the image {name}", hs)
        hs.shutdown()
        s.stop()


# Adds N snapshots to IMAGE's header by cls_rbd's snapshot_add alone,
# in batches of one operation each: the header lists them as librbd's
# own, at a few ms each where `rbd snap create` takes 100 ms (each asks
# the monitors for a snapshot id).  Their ids are past any the pool
# gives; nothing writes the image after them.
MANY_SNAPS = r"""
import rados, rbd, struct, sys
conf, client, pool, image, n = sys.argv[1:6]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image, read_only=True)
header = f"rbd_header.{img.id()}"
img.close()
for first in range(0, int(n), 500):
    with rados.WriteOpCtx() as op:
        for i in range(first, min(first + 500, int(n))):
            name = f"many-{i}".encode()
            op.execute("rbd", "snapshot_add",
                       struct.pack("<I", len(name)) + name + struct.pack("<Q", (1 << 40) + i))
        io.operate_write_op(op, header)
io.close()
cl.shutdown()
print("added", flush=True)
"""


def asan_env():
    """The environment of a server whose overruns of its heap buffers,
    librados's copies into them included, must kill it: AddressSanitizer's
    allocator and memcpy, preloaded with the C++ library the RBD module
    needs (its exceptions), where GCC's libasan is installed; else none."""
    found = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                           text=True).stdout.strip() if shutil.which("gcc") else ""
    cxx = subprocess.run(["gcc", "-print-file-name=libstdc++.so.6"], capture_output=True,
                         text=True).stdout.strip() if found else ""
    if not (os.path.isabs(found) and os.path.isabs(cxx)):
        print("# no libasan: an overrun of the server's buffers may go unseen")
        return {}
    return {"LD_PRELOAD": f"{os.path.realpath(found)} {os.path.realpath(cxx)}",
            "ASAN_OPTIONS": "detect_leaks=0"}


def section_many_snapshots():
    """A snapshot of an image with 4,101 snapshots (a list of their ids,
    8 bytes each, is over 32 KiB), removed while served: the server must still say so and
    fail the reads, not overrun its buffer (AddressSanitizer watches,
    where installed) nor stop looking."""
    c.create_image("snapped-often", 8 * MiB)
    w = start("mloop-server writing the image", f"rbd:{c.spec('snapped-often')}")
    h = w.connect()
    h.pwrite(b"1" * 4096, 0)
    h.flush()
    h.shutdown()
    w.stop()
    c.rbd("snap", "create", c.spec("snapped-often", "oldest"))
    p = subprocess.run([sys.executable, "-c", MANY_SNAPS, c.conf, c.client_id, c.pool,
                        "snapped-often", "4100"], capture_output=True, text=True, timeout=120)
    listed = c.rbd("snap", "ls", "--format", "json", c.spec("snapped-often"))
    if not check("the image has 4,101 snapshots",
                 p.returncode == 0 and len(json.loads(listed)) == 4101,
                 f"{p.stdout!r} {p.stderr[-300:]!r}"):
        raise Abort("no snapshots")
    s = start("mloop-server of its oldest snapshot", f"rbd:{c.spec('snapped-often', 'oldest')}",
              env=asan_env())
    hs = s.connect()
    check("the snapshot reads as it was", hs.pread(4096, 0) == b"1" * 4096)
    c.rbd("snap", "rm", c.spec("snapped-often", "oldest"))
    check("the server says the snapshot was removed",
          s.says("snapshot was removed", REFUSE_LIMIT), s.stderr())
    check_read_fails("the removed snapshot among many", hs)
    check("the server is still running", s.proc.poll() is None,
          f"exit {s.proc.poll()}: {s.stderr()[-500:]!r}")
    hs.shutdown()
    s.stop()


def section_read_only_shrunk():
    """An image served read-only and shrunk by its writer (`rbd resize
    --allow-shrink`, which the writer, holding the lock, performs):
    librbd's read-only open learns nothing and would answer zeroes past
    the new end, where the image's data was; the server must serve the
    new size, fail reads past it, and say so."""
    c.create_image("shrinking", 16 * MiB)
    w = start("mloop-server writing the image", f"rbd:{c.spec('shrinking')}")
    h = w.connect()
    h.pwrite(b"k" * 4096, 0)
    h.pwrite(b"e" * 4096, 12 * MiB)
    h.flush()
    s = start("a read-only mloop-server of the image", f"rbd:{c.spec('shrinking')}",
              args=["--read-only"])
    hs = s.connect()
    check("the end of the image reads as written", hs.pread(4096, 12 * MiB) == b"e" * 4096)
    c.rbd("resize", "--no-progress", "--allow-shrink", "--size", f"{8 * MiB}B",
          c.spec("shrinking"))
    check("the read-only server says the image was shrunk",
          s.says("shrunk to 8388608 bytes", REFUSE_LIMIT), s.stderr())
    try:
        got = hs.pread(4096, 12 * MiB)
    except nbd.Error as e:
        got = e
    check("a read past the new end fails", isinstance(got, nbd.Error),
          "" if isinstance(got, nbd.Error) else f"read {bytes(got[:4])!r}")
    check("a read before it reads as written", hs.pread(4096, 0) == b"k" * 4096)
    h2 = s.connect()
    check("a new connection is given the new size", h2.get_size() == 8 * MiB,
          f"{h2.get_size()} bytes")
    h2.shutdown()
    # SIGHUP re-reads the size (`mloop resize` sends it): librbd's read-only
    # open still answers the size it opened with, which must not come back.
    s.proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    h2 = s.connect()
    check("after SIGHUP, a new connection is given the new size still",
          h2.get_size() == 8 * MiB, f"{h2.get_size()} bytes")
    h2.shutdown()
    hs.shutdown()
    s.stop()
    h.shutdown()
    w.stop()


def section_read_only_clone_regrown():
    """A clone served read-only, shrunk and grown back by a writer (`rbd
    resize`): the shrink cuts the clone's overlap with its parent, so
    the range past the shrink reads as zeroes once the image is grown
    back.  librbd's read-only open keeps the overlap it opened with and
    would read the parent's data there: the server must not serve that
    range as the image's."""
    c.create_image("regrown-parent", 16 * MiB)
    w = start("mloop-server writing the parent", f"rbd:{c.spec('regrown-parent')}")
    h = w.connect()
    h.pwrite(b"p" * 4096, 12 * MiB)
    h.flush()
    h.shutdown()
    w.stop()
    c.rbd("snap", "create", c.spec("regrown-parent", "base"))
    c.rbd("snap", "protect", c.spec("regrown-parent", "base"))
    c.rbd("clone", c.spec("regrown-parent", "base"), c.spec("regrown"))
    s = start("a read-only mloop-server of the clone", f"rbd:{c.spec('regrown')}",
              args=["--read-only"])
    hs = s.connect()
    check("the clone reads its parent's data", hs.pread(4096, 12 * MiB) == b"p" * 4096)
    c.rbd("resize", "--no-progress", "--allow-shrink", "--size", f"{8 * MiB}B",
          c.spec("regrown"))
    check("the read-only server says the clone was shrunk",
          s.says("shrunk to 8388608 bytes", REFUSE_LIMIT), s.stderr())
    c.rbd("resize", "--no-progress", "--size", f"{16 * MiB}B", c.spec("regrown"))
    time.sleep(3)       # two of the server's looks at the header
    theirs = export(c.spec("regrown"))[12 * MiB:12 * MiB + 4096]
    check("the clone, grown back, holds zeroes past the shrink",
          theirs == bytes(4096), f"{theirs[:4]!r}")
    try:
        got = hs.pread(4096, 12 * MiB)
    except nbd.Error as e:
        got = e
    check("the read-only server serves no data the clone does not hold",
          isinstance(got, nbd.Error) or got == theirs,
          "" if isinstance(got, nbd.Error) else f"read {bytes(got[:4])!r}")
    check("the read-only server says why it serves less than the clone's size",
          s.says("overlap with its parent was cut", REFUSE_LIMIT), s.stderr())
    check("a read before the cut reads as the clone holds it",
          hs.pread(4096, 0) == export(c.spec("regrown"))[:4096])
    hs.shutdown()
    s.stop()


# Discards LENGTH bytes at OFFSET of the image (librbd frees a whole
# object it covers, and a clone's parent no longer shows through once
# the image has none), then exits.
DISCARD = r"""
import rados, rbd, sys
conf, client, pool, image, offset, length = sys.argv[1:7]
cl = rados.Rados(conffile=conf, rados_id=client)
cl.connect()
io = cl.open_ioctx(pool)
img = rbd.Image(io, image)
img.discard(int(offset), int(length))
img.close()
io.close()
cl.shutdown()
"""


def flat_parent():
    """flat-parent@base, protected, to clone: 16 MiB, "p" at 12 MiB."""
    if json.loads(c.rbd("ls", "--format", "json", c.pool)).count("flat-parent"):
        return
    c.create_image("flat-parent", 16 * MiB)
    w = start("mloop-server writing the parent", f"rbd:{c.spec('flat-parent')}")
    h = w.connect()
    h.pwrite(b"p" * 4096, 12 * MiB)
    h.flush()
    h.shutdown()
    w.stop()
    c.rbd("snap", "create", c.spec("flat-parent", "base"))
    c.rbd("snap", "protect", c.spec("flat-parent", "base"))


def section_read_only_clone_flattened():
    """A clone served read-only, then flattened (`rbd flatten`): the
    image has no parent any more, but librbd's read-only open keeps the
    parent and overlap it opened with and reads the parent's data
    wherever the image has no object.  A discard of a whole object, or
    a shrink and a growth back, leaves the image reading zeroes there:
    the server must serve what the image holds, not its former
    parent's data."""
    flat_parent()
    for how in ("discarded", "regrown"):
        image = f"flat-{how}"
        c.rbd("clone", c.spec("flat-parent", "base"), c.spec(image))
        s = start(f"a read-only mloop-server of the clone to be {how}",
                  f"rbd:{c.spec(image)}", args=["--read-only"])
        hs = s.connect()
        check(f"{how}: the clone reads its parent's data",
              hs.pread(4096, 12 * MiB) == b"p" * 4096)
        c.rbd("flatten", "--no-progress", c.spec(image))
        check(f"{how}: the read-only server says it reopened the flattened clone",
              s.says("flattened", REFUSE_LIMIT), s.stderr())
        if how == "discarded":
            subprocess.run([sys.executable, "-c", DISCARD, c.conf, c.client_id,
                            c.pool, image, str(12 * MiB), str(4 * MiB)],
                           check=True, timeout=60)
        else:
            c.rbd("resize", "--no-progress", "--allow-shrink", "--size",
                  f"{8 * MiB}B", c.spec(image))
            check(f"{how}: the read-only server says the clone was shrunk",
                  s.says("shrunk to 8388608 bytes", REFUSE_LIMIT), s.stderr())
            c.rbd("resize", "--no-progress", "--size", f"{16 * MiB}B", c.spec(image))
            check(f"{how}: the read-only server says it has its size again",
                  s.says("has 16777216 bytes again", REFUSE_LIMIT), s.stderr())
        theirs = export(c.spec(image))[12 * MiB:12 * MiB + 4096]
        check(f"{how}: the flattened clone holds zeroes there",
              theirs == bytes(4096), f"{theirs[:4]!r}")
        try:
            got = hs.pread(4096, 12 * MiB)
        except nbd.Error as e:
            got = e
        check(f"{how}: the read-only server serves no data of the former parent",
              isinstance(got, nbd.Error) or got == theirs,
              "" if isinstance(got, nbd.Error) else f"read {bytes(got[:4])!r}")
        hs.shutdown()
        s.stop()


# Holds mloop-server at its first open of an image by id, read-only
# (the checker's reopen of a flattened clone; the server's own start
# opens by name), until {go} exists; then at exit, once main has
# returned, until {leave} exists: an inferior call, during which every
# other thread runs.  Writes how the server ended ("exit N" or "signal
# NAME") to {ended}.
PAUSE_REOPEN = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
break rbd_open_by_id_read_only
break rbd_aio_open_by_id_read_only
commands 1 2
silent
shell touch {paused}
shell while [ ! -e {go} ]; do sleep 0.05; done
delete 1 2
continue
end
python
import os
class Leave(gdb.Function):
    def __init__(self):
        super().__init__("leave")
    def invoke(self):
        return 1 if os.path.exists("{leave}") else 0
Leave()
end
break exit
commands 3
silent
shell touch {exiting}
while !$leave()
call (int) usleep(100000)
end
continue
end
run
python
code = gdb.convenience_variable("_exitcode")
sig = gdb.convenience_variable("_exitsignal")
with open("{ended}", "w") as f:
    f.write(f"exit {{code}}" if code is not None else f"signal {{sig}}")
end
"""


def threads(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def section_reopen_cluster_paused():
    """A clone served read-only and flattened: the server's check opens it
    again, and the cluster stops answering just as that open begins (gdb
    holds the server there while the cluster is paused).  A SIGTERM must
    stop the server all the same, as it does a check waiting for a paused
    cluster (2e): the open must not hold up the close until the cluster
    answers again.  Once the cluster answers, what the open left (its
    image, librados's threads) must end without the process ending (gdb
    holds it in exit, as mloopd goes on after closing an in-process
    server's store), and the server exit 0."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to hold the server as it opens the clone again")
        return
    flat_parent()
    c.rbd("clone", c.spec("flat-parent", "base"), c.spec("flat-paused"))
    files = {w: c.path("test", f"reopen-{w}")
             for w in ("paused", "go", "exiting", "leave", "ended")}
    script = c.path("test", "reopen.gdb")
    with open(script, "w") as f:
        f.write(PAUSE_REOPEN.format(**files))
    s = start("a read-only mloop-server of the clone under gdb",
              f"rbd:{c.spec('flat-paused')}", args=["--read-only"],
              wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    resumed = False
    try:
        c.rbd("flatten", "--no-progress", c.spec("flat-paused"))
        deadline = time.monotonic() + REFUSE_LIMIT
        while not os.path.exists(files["paused"]) and s.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        if not check("gdb holds the server as it opens the flattened clone again",
                     os.path.exists(files["paused"]), s.stderr().strip()[-500:]):
            raise Abort("no pause")
        c.pause()
        open(files["go"], "w").close()
        time.sleep(1)           # the open under way, unanswered
        with open(s.pid_file) as f:
            pid = int(f.read())
        t = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        deadline = t + REFUSE_LIMIT
        while not os.path.exists(files["exiting"]) and s.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.monotonic() - t
        if not check("the server stops while the cluster is paused mid-reopen",
                     os.path.exists(files["exiting"]),
                     f"running {took:.1f} s after SIGTERM"):
            raise Abort("no stop")
        print(f"# stopped {took:.1f} s after SIGTERM, {threads(pid)} threads left")
        c.resume()
        resumed = True
        deadline = time.monotonic() + START_LIMIT
        while threads(pid) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        check("once the cluster answers, only the exiting thread is left",
              threads(pid) == 1, f"{threads(pid)} threads")
        open(files["leave"], "w").close()
        s.proc.wait(60)
        with open(files["ended"]) as f:
            how = f.read()
        check("the server exits 0", how == "exit 0", how)
    finally:
        if not resumed:
            c.resume()
        open(files["leave"], "w").close()
        stop_under_gdb(s)


# Holds mloop-server's removal checker in its wait for the header's
# answer to parent_overlap_get (ask_cls sleeps with check_lock let go),
# once {armed} exists, until {go} exists: an inferior call, during which
# every other thread runs.  Writes how the server ended to {ended}.
PAUSE_OVERLAP = """set pagination off
set confirm off
set breakpoint pending on
handle all nostop noprint pass
python
import os
class Armed(gdb.Function):
    def __init__(self):
        super().__init__("armed")
    def invoke(self):
        return 1 if os.path.exists("{armed}") else 0
class Go(gdb.Function):
    def __init__(self):
        super().__init__("go")
    def invoke(self):
        return 1 if os.path.exists("{go}") else 0
Armed()
Go()
end
break nanosleep if $armed() && $_any_caller_matches("overlap_in_header", 4)
commands 1
silent
delete 1
shell touch {paused}
while !$go()
call (int) usleep(100000)
end
continue
end
run
python
code = gdb.convenience_variable("_exitcode")
sig = gdb.convenience_variable("_exitsignal")
with open("{ended}", "w") as f:
    f.write(f"exit {{code}}" if code is not None else f"signal {{sig}}")
end
"""


def section_close_during_overlap_check():
    """A clone served read-only and flattened: the server's check asks
    the header for the clone's overlap, and lets go of its lock while it
    waits for the answer.  A close then (SIGTERM) finds no open of the
    clone under way, so waits for the check to end; the answer says
    flattened.  The check must not open the clone again now: nothing
    would wait for that open, which is not done when its wait ends on
    the close, and what it leaves is no image (a crash), or a store
    freed under it.  gdb holds the check in its wait until the close
    waits for it; the server must exit 0."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print("# skipped: no gdb to hold the server's check of the overlap")
        return
    flat_parent()
    c.rbd("clone", c.spec("flat-parent", "base"), c.spec("flat-closing"))
    files = {w: c.path("test", f"overlap-{w}")
             for w in ("armed", "paused", "go", "ended")}
    script = c.path("test", "overlap.gdb")
    with open(script, "w") as f:
        f.write(PAUSE_OVERLAP.format(**files))
    s = start("a read-only mloop-server of the clone under gdb",
              f"rbd:{c.spec('flat-closing')}", args=["--read-only"],
              wrap=[gdb, "-q", "-batch", "-nx", "-x", script, "--args"])
    try:
        c.rbd("flatten", "--no-progress", c.spec("flat-closing"))
        open(files["armed"], "w").close()
        deadline = time.monotonic() + REFUSE_LIMIT
        while not os.path.exists(files["paused"]) and s.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        if not check("gdb holds the server's check waiting for the overlap",
                     os.path.exists(files["paused"]), s.stderr().strip()[-500:]):
            raise Abort("no pause")
        with open(s.pid_file) as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGTERM)
        time.sleep(1)           # the close waits for the check; the answer comes
        open(files["go"], "w").close()
        s.proc.wait(START_LIMIT)
        with open(files["ended"]) as f:
            how = f.read()
        check("the server closing mid-check exits 0, opening nothing",
              how == "exit 0", f"{how}; {s.stderr().strip()[-300:]}")
        check("the closing server does not say it reopened the clone",
              "reopened" not in s.stderr(), s.stderr().strip()[-300:])
    finally:
        open(files["go"], "w").close()
        stop_under_gdb(s)


def section_trashed_while_down():
    """A device's image moved to the trash (`rbd trash mv`) while its
    server is down: librbd opens an image in the trash by the id the
    device's record keeps, but its owner removed it and a purge may
    remove its objects at any time; the device's next server, and a
    snapshot's, must be refused in one line naming the trash."""
    c.create_image("binned", 8 * MiB)
    spec = f"rbd:{c.spec('binned')}"
    record = ["--lock-record=" + c.path("test", "binned.lock")]
    s = start("a device's server", spec, args=record)
    h = s.connect()
    h.pwrite(b"t" * 4096, 0)
    h.flush()
    h.shutdown()
    s.stop()
    c.rbd("snap", "create", c.spec("binned", "kept"))
    snap = f"rbd:{c.spec('binned', 'kept')}"
    snap_record = ["--lock-record=" + c.path("test", "binned-kept.lock")]
    start("a snapshot's server", snap, args=snap_record).stop()
    c.rbd("trash", "mv", c.spec("binned"))
    refused_in_one_line("its next server, the image in the trash",
                        Server(spec, args=record), ["trash", "binned"])
    refused_in_one_line("the snapshot's next server, the image in the trash",
                        Server(snap, args=snap_record), ["trash", "binned"])


# --- 3: the cache and partial trims, turned on by the cluster --------------

def section_settings():
    c.create_image("configured", 8 * MiB)
    for key, value in [("rbd_cache", "true"), ("rbd_cache_policy", "writeback"),
                       ("rbd_cache_writethrough_until_flush", "false"),
                       ("rbd_cache_max_dirty_age", "60"),
                       ("rbd_skip_partial_discard", "true")]:
        c.rbd("config", "image", "set", c.spec("configured"), key, value)
    s = start("mloop-server on an image with the cache on",
              f"rbd:{c.spec('configured')}")
    h = s.connect()
    h.pwrite(b"d" * MiB, 0)
    h.flush()
    h.trim(5000, 1000)
    got = h.pread(MiB, 0)
    check("a trim inside an object reads back as zeroes",
          got[1000:6000] == bytes(5000) and got[:1000] == b"d" * 1000
          and got[6000:] == b"d" * (MiB - 6000),
          f"{got[1000:6000].count(0)} of 5000 bytes zero")
    data = os.urandom(64 * 1024)
    h.pwrite(data, 2 * MiB, nbd.CMD_FLAG_FUA)
    # Zeroes that must stay allocated: written, not freed, so through
    # the cache; over data already flushed to the OSDs.
    h.pwrite(b"z" * (64 * 1024), 4 * MiB)
    h.flush()
    h.zero(64 * 1024, 4 * MiB, nbd.CMD_FLAG_FUA | nbd.CMD_FLAG_NO_HOLE)
    s.proc.kill()               # nothing flushed after the FUA requests
    s.proc.wait()
    del h
    image = export(c.spec("configured"))
    check("a FUA write acknowledged before a SIGKILL is in the image",
          image[2 * MiB:2 * MiB + len(data)] == data,
          f"{image[2 * MiB:2 * MiB + len(data)].count(0)} of {len(data)} bytes zero")
    zeroed = image[4 * MiB:4 * MiB + 64 * 1024]
    check("a FUA zero (no hole) acknowledged before a SIGKILL is in the image",
          zeroed == bytes(64 * 1024), f"{zeroed.count(0)} of {len(zeroed)} bytes zero")


# --- 3c: the cache turned on in another spelling -------------------------

def section_cache_spelled():
    """rbd_cache set on the image as "1" or "TRUE", which librbd reads as
    true (Ceph parses a boolean so) while its configuration list shows
    the value as set: a FUA write acknowledged before a SIGKILL must be
    in the image all the same."""
    for n, spelling in enumerate(["1", "TRUE"]):
        name = f"spelled{n}"
        c.create_image(name, 8 * MiB)
        for key, value in [("rbd_cache", spelling), ("rbd_cache_policy", "writeback"),
                           ("rbd_cache_writethrough_until_flush", "false"),
                           ("rbd_cache_max_dirty_age", "60")]:
            c.rbd("config", "image", "set", c.spec(name), key, value)
        s = start(f"mloop-server on an image with rbd_cache {spelling}",
                  f"rbd:{c.spec(name)}")
        h = s.connect()
        data = os.urandom(64 * 1024)
        h.pwrite(data, MiB, nbd.CMD_FLAG_FUA)
        s.proc.kill()           # nothing flushed after the FUA write
        s.proc.wait()
        del h
        check(f"the server says rbd_cache {spelling} turns the cache on",
              "cache on" in s.stderr(), s.stderr())
        got = export(c.spec(name))[MiB:MiB + len(data)]
        check(f"a FUA write acknowledged before a SIGKILL is in the image "
              f"(rbd_cache {spelling})", got == data,
              f"{got.count(0)} of {len(data)} bytes zero")


# --- 3b: partial trims turned on while served ----------------------------

def section_settings_changed():
    """rbd_skip_partial_discard set on the image while the server has
    it open: librbd applies an image's configuration again at each
    refresh, so a trim made after it must still read as zeroes."""
    c.create_image("reconfigured", 8 * MiB)
    s = start("mloop-server on an image reconfigured later",
              f"rbd:{c.spec('reconfigured')}")
    h = s.connect()
    h.pwrite(b"d" * MiB, 0)
    h.flush()
    c.rbd("config", "image", "set", c.spec("reconfigured"),
          "rbd_skip_partial_discard", "true")
    c.rbd("snap", "create", c.spec("reconfigured", "refresh"))
    h.pread(4096, 0)            # librbd refreshes the image at its next request
    h.trim(1000, 5000)
    h.trim(1000, 9000)
    got = h.pread(MiB, 0)
    check("a trim inside an object after the change reads back as zeroes",
          got[5000:6000] == bytes(1000) and got[9000:10000] == bytes(1000)
          and got[:5000] == b"d" * 5000 and got[6000:9000] == b"d" * 3000,
          f"{got[5000:6000].count(0)} and {got[9000:10000].count(0)} of 1000 "
          "bytes zero")
    h.shutdown()
    s.stop()


# --- 4: BLOCK_STATUS over a large sparse image -----------------------------

BIG = 8 * GiB
MOST_ASKED = 4 * GiB - 4096     # NBD's length is 32 bits
WRITTEN = [(i * 128 * MiB + (i % 7) * 4096, 4096) for i in range(64)]


def statuses(h, offset, length, flags=0):
    got = []

    def cb(metacontext, off, entries, err):
        if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
            got.extend(zip(entries[0::2], entries[1::2]))
    h.block_status(length, offset, cb, flags)
    return got


def walks(s):
    """The server's lines about its walks: [(callbacks, one)]."""
    out = []
    for line in s.stderr().splitlines():
        if ": extents of " in line and line.endswith(" callbacks"):
            out.append(int(line.rsplit(" ", 2)[1]))
    return out


def section_extents():
    c.create_image("big", BIG)
    s = start("mloop-server on a sparse 8 GiB image", f"rbd:{c.spec('big')}",
              env={"MLOOP_TEST_RBD_WALKS": "1"})
    h = s.connect()
    for off, n in WRITTEN:
        h.pwrite(b"x" * n, off)
    h.flush()
    whole = statuses(h, 0, MOST_ASKED)
    covered = sum(n for n, _ in whole)
    check("BLOCK_STATUS of the whole image covers at most 1 GiB",
          0 < covered <= GiB, f"{covered} bytes in {len(whole)} extents")
    kinds = [f & nbd.STATE_HOLE for _, f in whole]
    check("its neighbouring extents differ in kind (merged)",
          all(a != b for a, b in zip(kinds, kinds[1:])), repr(whole[:8]))
    before = len(walks(s))
    pos, data, requests = 0, [], 0
    while pos < BIG:
        got = statuses(h, pos, min(BIG - pos, MOST_ASKED), nbd.CMD_FLAG_REQ_ONE)
        requests += 1
        if not got or got[0][0] == 0:
            check("REQ_ONE makes progress", False, f"at {pos}: {got!r}")
            raise Abort("no progress")
        if not got[0][1] & nbd.STATE_HOLE:
            data.append((pos, got[0][0]))
        pos += got[0][0]
    counts = walks(s)[before:]
    print(f"# {requests} REQ_ONE requests; callbacks: most {max(counts, default=0)},"
          f" total {sum(counts)}")
    check("every REQ_ONE request costs librbd at most two callbacks",
          len(counts) == requests and max(counts) <= 2,
          f"{len(counts)} walks said for {requests} requests, most {max(counts, default=0)}")
    found = all(any(o <= off and off + n <= o + m for o, m in data) for off, n in WRITTEN)
    check("the walk finds every written extent", found, repr(data[:8]))
    qemu_img = shutil.which("qemu-img")
    if qemu_img and os.environ.get("MLOOP_RBD_TIMINGS"):
        t = time.monotonic()
        r = subprocess.run([qemu_img, "convert", "-O", "raw",
                            f"nbd+unix:///?socket={s.sock}", c.path("test", "convert")],
                           capture_output=True, text=True)
        convert = time.monotonic() - t
        if os.path.exists(c.path("test", "convert")):
            os.unlink(c.path("test", "convert"))
        t = time.monotonic()
        c.rbd("export", "--no-progress", c.spec("big"), c.path("test", "export"))
        exported = time.monotonic() - t
        os.unlink(c.path("test", "export"))
        print(f"# qemu-img convert over NBD: {convert:.1f} s (exit {r.returncode}); "
              f"rbd export: {exported:.1f} s")
    h.shutdown()
    s.stop()


# --- 5: a namespace ------------------------------------------------------------

def section_namespace():
    c.rbd("namespace", "create", f"{c.pool}/tenant")
    c.rbd("create", "--size", "8M", f"{c.pool}/tenant/disk")
    s = start("mloop-server on rbd:POOL/NAMESPACE/IMAGE", f"rbd:{c.pool}/tenant/disk")
    data = os.urandom(100000)
    h = s.connect()
    h.pwrite(data, 12345)
    h.flush()
    check("it serves the namespace's image", h.get_size() == 8 * MiB
          and h.pread(len(data), 12345) == data)
    h.shutdown()
    s.stop()
    check("rbd export of the namespace's image has the data",
          export(f"{c.pool}/tenant/disk")[12345:12345 + len(data)] == data)
    refused_in_one_line("a missing namespace", Server(f"rbd:{c.pool}/nowhere/disk"),
                        ["namespace"])


# --- 6: client_mount_timeout in ceph.conf ----------------------------------

def section_mount_timeout():
    with open(c.conf) as f:
        text = f.read()
    dead = f"127.0.0.1:{cluster._free_port()}"
    text = "\n".join(f"mon_host = {dead}" if line.startswith("mon_host") else line
                     for line in text.splitlines())
    text = text.replace("[global]\n", "[global]\nclient_mount_timeout = 2\n", 1)
    conf = c.path("test", "unreachable.conf")
    with open(conf, "w") as f:
        f.write(text + "\n")
    os.chmod(conf, 0o644)  # a server reads no one else's (any umask)
    refused_in_one_line("no monitor, client_mount_timeout = 2 in ceph.conf",
                        Server(f"rbd:{c.spec('nothing')}", conf=conf), ["monitor"])


# --- run ------------------------------------------------------------------


# MLOOP_RBD_SECTIONS="word,word": only the sections whose name has one
# of the words (the cluster's start and the final checks run all the same).
ONLY = [w for w in os.environ.get("MLOOP_RBD_SECTIONS", "").split(",") if w]


def section(name, fn):
    if ONLY and not any(w in name for w in ONLY):
        return
    t = time.monotonic()
    print(f"# {name}")
    try:
        fn()
    except Abort:
        pass
    except Exception as e:  # nbd.Error, a failed rbd command: this section ends
        check(f"{name}: runs to its end", False, f"{type(e).__name__}: {e}")
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
    c.ceph("config", "set", "osd", "osd_client_watch_timeout", str(WATCH_TIMEOUT))
    section("a live writer that is not mloop", section_live_writer)
    section("a live writer among many watchers", section_many_watchers)
    section("a dead holder beside a live client", section_dead_holder_live_client)
    section("a writer arriving while the server looks", section_writer_arriving)
    section("the lock lost without a blocklist", section_lock_lost)
    section("the cluster records this server, librbd says not",
            section_own_lock_unknown)
    section("the cluster records this server, librbd says not, a live client",
            section_own_lock_unknown_live_client)
    section("a break unseen, the lock record unread",
            section_break_unseen_record_unread)
    section("the lock taken from the server as it starts",
            section_lock_stolen_at_start)
    section("the lock taken from the server as it starts, librbd not saying",
            lambda: section_lock_stolen_at_start(untold=True))
    section("the lock's owners unread, a stopped holder, blocklisting off",
            section_owners_unread)
    section("the lock's holder unread as the server starts",
            section_holder_unread_at_start)
    section("the lock's holder unread as the server starts, its unlock lost",
            section_holder_unread_unlock_lost)
    section("a device's servers killed one after another", section_successors)
    section("a device's servers killed mid-start", section_killed_mid_start)
    section("a server killed before its lock, its successor's lock retaken",
            section_retaken_after_killed)
    section("a stopped server's successor, blocklisting off",
            section_unfenced_predecessor)
    section("a lock record another user could write", section_foreign_record)
    section("a read-only nbdkit beside a live writer", section_read_only_nbdkit)
    section("a shared open beside a device's server, the name shared=off",
            section_resize_open)
    section("a device's image renamed", section_renamed)
    section("a device's image renamed to a hostile name", section_renamed_hostile)
    section("a snapshot's device, the snapshot's name 5,000 long",
            section_long_snapshot_name)
    section("the exclusive-lock feature turned off", section_feature_off)
    section("a snapshot removed while served", section_snapshot_removed)
    section("a read-only server's image removed", section_read_only_removed)
    section("a snapshot removed among thousands", section_many_snapshots)
    section("a read-only server's image shrunk", section_read_only_shrunk)
    section("a read-only server's clone shrunk and grown back",
            section_read_only_clone_regrown)
    section("a read-only server's clone flattened",
            section_read_only_clone_flattened)
    section("a read-only server's clone reopened, the cluster paused",
            section_reopen_cluster_paused)
    section("a read-only server's clone flattened as it closes",
            section_close_during_overlap_check)
    section("an image trashed while its server is down", section_trashed_while_down)
    section("the cache and partial trims set by the cluster", section_settings)
    section("partial trims turned on while served", section_settings_changed)
    section("the cache turned on in another spelling", section_cache_spelled)
    section("BLOCK_STATUS over a large sparse image", section_extents)
    section("a namespace", section_namespace)
    section("client_mount_timeout in ceph.conf", section_mount_timeout)
finally:
    for p in servers:
        if p.proc.poll() is None:
            p.stop()
    for p in others:
        if p.poll() is None:
            p.kill()
            p.wait()
    c.stop()

print(f"# whole test {time.monotonic() - t0:.1f} s")
alive = [p.proc.pid for p in servers if p.proc.poll() is None]
alive += [p.pid for p in others if p.poll() is None]
check("no server or client is left running", alive == [], repr(alive))
alive = [pid for pid in daemon_pids if os.path.exists(f"/proc/{pid}")]
check("no Ceph daemon is left running", alive == [], repr(alive))
check("no file is left", cluster_dir is None or not os.path.exists(cluster_dir),
      cluster_dir)
harness.exit_if_failed()
