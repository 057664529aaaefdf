"""A power cut at any flush, and what an fsync() promised after it.

The image is a dm-log-writes device (data and log on two loop devices over
scratch files, dmtarget.py), so every write that reaches it is logged, in
the order it became stable.  A kind attaches it; ext4 on the attached
device takes a workload of several writers, each in its own directories,
that create, replace (rename over), overwrite in place and delete files,
with fsync and fdatasync, buffered and O_DIRECT, recording each sync that
returned.  Every MARK_INTERVAL a MARK goes into the log naming how many
syncs had returned by then.

Afterwards logwrites.py rebuilds the image at FLUSH and FUA entries, which
is exactly what a disk losing power right after that entry would hold.  At
each: the filesystem recovers (mount replays its journal), fsck -fn finds it
clean, and every file whose sync returned before the last mark preceding
that entry holds a version it may hold (see check_point).

Used by test-power-cut.py (for every kind) and test-power-cut-early-ack.py
(a server broken on purpose must fail it).  The full tier
(MLOOP_TEST_TIER=full) checks every point; the standard tier a
deterministic sample (choose): every point where a sync's promise is first
checkable, and an evenly spread set, placed by a seed that is printed.
"""
import hashlib
import mmap
import os
import random
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import dmtarget
import kfix
import logwrites
from kfix import mount, run

DATA_SIZE = 64 << 20
# Sparse; the log holds every block written plus one header block per
# entry, far less than this for the workload below.
LOG_SIZE = 1 << 30
WRITERS = 3
DIRS_PER_WRITER = 4
OPS_PER_WRITER = 60
# Seconds between marks.  A point's promise is the syncs counted by the
# last mark before it, so finer marks check a sync sooner after it
# returned; the whole workload takes only a few seconds under TCG, and
# each mark is a dmsetup process.
MARK_INTERVAL = 0.2
# Checks run two at a time: the VM has 4 vCPUs on the host's 2 cores, and
# one check is mostly one process at a time (cp, mount, fsck).
CHECKERS = 2


class Record:
    """What the writers did, shared with the marker: SEQ counts returned
    syncs; OPS[path] lists that path's operations in order, each a dict
    with kind (put, inplace, delete), sha (of the whole file after it) and
    durable (the SEQ its sync returned at, None until then)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seq = 0
        self.ops = {}

    def begin(self, path, kind, sha=None):
        op = {"kind": kind, "sha": sha, "durable": None}
        with self.lock:
            self.ops.setdefault(path, []).append(op)
        return op

    def done(self, op):
        with self.lock:
            self.seq += 1
            op["durable"] = self.seq


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path, data, direct, datasync):
    """Writes DATA to a new PATH and syncs it; O_DIRECT needs an aligned
    buffer and length, which an mmap and 4096-multiple sizes give."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o644)
    try:
        if direct:
            buf = mmap.mmap(-1, len(data))
            buf.write(data)
            assert os.write(fd, buf) == len(data)
            buf.close()
        else:
            assert os.write(fd, data) == len(data)
        (os.fdatasync if datasync else os.fsync)(fd)
    finally:
        os.close(fd)


def writer(mnt, w, rec, errors):
    """Writer W's workload, in DIRS_PER_WRITER directories of its own."""
    try:
        rng = random.Random(100 + w)
        top = os.path.join(mnt, f"w{w}")
        os.mkdir(top)
        dirs = [os.path.join(top, f"d{k}") for k in range(DIRS_PER_WRITER)]
        for d in dirs:
            os.mkdir(d)
        for d in [top, mnt]:
            fsync_dir(d)
        live = {}  # path -> current content
        for n in range(OPS_PER_WRITER):
            choice = rng.random()
            if not live or choice < 0.4:  # create
                d = rng.choice(dirs)
                path = os.path.join(d, f"f{n}")
                data = rng.randbytes(4096 * rng.randrange(1, 17))
                op = rec.begin(path, "put", hashlib.sha256(data).hexdigest())
                write_file(path, data, rng.random() < 0.5, rng.random() < 0.5)
                # The new name is only durable once its directory is.
                fsync_dir(d)
                rec.done(op)
                live[path] = data
            elif choice < 0.65:  # replace: write aside, sync, rename over
                path = rng.choice(sorted(live))
                d = os.path.dirname(path)
                data = rng.randbytes(4096 * rng.randrange(1, 17))
                tmp = os.path.join(d, f"tmp{n}")
                write_file(tmp, data, rng.random() < 0.5, False)
                op = rec.begin(path, "put", hashlib.sha256(data).hexdigest())
                os.rename(tmp, path)
                fsync_dir(d)
                rec.done(op)
                live[path] = data
            elif choice < 0.85:  # overwrite a block in place, fdatasync
                path = rng.choice(sorted(live))
                data = bytearray(live[path])
                block = rng.randrange(len(data) // 4096)
                new = rng.randbytes(4096)
                data[block * 4096:(block + 1) * 4096] = new
                op = rec.begin(path, "inplace", hashlib.sha256(data).hexdigest())
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, new, block * 4096)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                rec.done(op)
                live[path] = bytes(data)
            else:  # delete
                path = rng.choice(sorted(live))
                op = rec.begin(path, "delete")
                os.unlink(path)
                fsync_dir(os.path.dirname(path))
                rec.done(op)
                del live[path]
    except Exception as e:  # reported by the main thread
        errors.append(f"writer {w}: {e!r}")


def mark(dm, rec):
    """Logs a mark naming the syncs returned so far: any sync counted in it
    returned before the mark entered the log."""
    with rec.lock:
        seq = rec.seq
    dm.message("mark", f"seq{seq}")


def marker(dm, rec, stop, errors):
    try:
        while not stop.wait(MARK_INTERVAL):
            mark(dm, rec)
    except Exception as e:
        errors.append(f"marker: {e!r}")


def check_files(mnt, seq, ops):
    """Checks the files of MNT, the image rebuilt at some point and
    recovered, (OPS is keyed by paths relative to it) as promised by the
    syncs counted up to SEQ.  For each path, the last
    operation whose sync returned by then sets what it may hold; an
    operation not yet synced may or may not have reached the disk: a later
    replace adds the version it brings (written and synced aside, so whole),
    a later in-place overwrite leaves the content open (any mix of blocks),
    a later delete allows the file to be gone.  Returns the problems found."""
    problems = []
    for path, path_ops in ops.items():
        done = [i for i, o in enumerate(path_ops)
                if o["durable"] is not None and o["durable"] <= seq]
        if not done:
            continue
        last = path_ops[done[-1]]
        if last["kind"] == "delete":
            continue  # names are never reused: nothing more is promised
        later = path_ops[done[-1] + 1:]
        want = {last["sha"]} | {o["sha"] for o in later if o["kind"] == "put"}
        got_path = os.path.join(mnt, path)
        if not os.path.exists(got_path):
            if not any(o["kind"] == "delete" for o in later):
                problems.append(f"{path} missing")
            continue
        if any(o["kind"] == "inplace" for o in later):
            continue
        with open(got_path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        if sha not in want:
            problems.append(f"{path} holds data no synced version had")
    return problems




def run_workload(kind, d, attach=None, data_size=DATA_SIZE):
    """Makes the logged image in directory D (DATA_SIZE bytes, ext4),
    attaches it with KIND, runs the writers on ext4 over it and tears
    everything down (so the log is complete).  ATTACH(cleanup, logged
    device), when given, attaches instead and returns the attachment
    (test-power-cut-overlay.py: the logged filesystem holds an overlay).
    Returns (log path, base image path, Record, ops keyed by paths
    relative to the filesystem's root)."""
    dmtarget.load("log-writes")
    data, log, base = (os.path.join(d, n) for n in ("data.img", "log.img", "base.img"))
    for path, size in ((data, data_size), (log, LOG_SIZE)):
        with open(path, "wb") as f:
            f.truncate(size)
    # The filesystem is made before logging starts, so the replay starts
    # from a copy of it.  Inode tables and journal are initialised now so
    # no background zeroing writes the log full after the mount; nodiscard
    # keeps mkfs quick on the sparse file.
    run(["mkfs.ext4", "-q", "-F", "-b", "4096",
         "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", data])
    run(["cp", "--sparse=always", data, base])
    with kfix.Cleanup() as wcl:
        data_dev, log_dev = dmtarget.losetup(wcl, data), dmtarget.losetup(wcl, log)
        dm = dmtarget.Dm.create(wcl, "log-writes", f"0 {dmtarget.sectors(data_dev)} "
                                f"log-writes {data_dev} {log_dev}")
        att = attach(wcl, dm.path) if attach else kind.attach(wcl, dm.path)
        mnt = mount(wcl, att.device)
        rec, errors, stop = Record(), [], threading.Event()
        mk = threading.Thread(target=marker, args=(dm, rec, stop, errors))
        mk.start()
        writers = [threading.Thread(target=writer, args=(mnt, w, rec, errors))
                   for w in range(WRITERS)]
        try:
            for t in writers:
                t.start()
        finally:
            for t in writers:
                t.join()
            stop.set()
            mk.join()
        assert not errors, "; ".join(errors)
        mark(dm, rec)
        ops = {os.path.relpath(p, mnt): o for p, o in rec.ops.items()}
        run(["umount", mnt])
        att.detach()
        # Removing the target logs a final mark and brings the super
        # block's entry count up to date (logwrites.py).
        dm.remove()
    return log, base, rec, ops


def check_image(snap, seq, ops):
    """Recovers the rebuilt image SNAP as after a real power cut (the mount
    replays the journal and clears orphans), checks its files against the
    syncs up to SEQ, then fsck -fn must find nothing.  Returns problems."""
    with kfix.Cleanup() as cl:
        problems = check_files(mount(cl, snap, "loop"), seq, ops)
    fsck = run(["fsck.ext4", "-fn", snap], check=False)
    if fsck.returncode != 0:
        problems.append(f"fsck -fn exit {fsck.returncode}: {fsck.stdout[-1500:]}")
    os.unlink(snap)
    return problems


def changes_data(e):
    return not e.flags & logwrites.MARK and e.nr_sectors > 0


class Candidate:
    """A replay point leaving an image of its own: POINT is the log entry
    (the last FLUSH/FUA of a run that leaves one image: the one with the
    most syncs returned, which promises the most, so a check that passes
    there passes at the earlier ones), SEQ the syncs returned by the last
    mark before it, FRESH whether a sync returned since the previous
    candidate (its promise is checked here first)."""

    __slots__ = ("point", "seq", "fresh")

    def __init__(self, point, seq, fresh):
        self.point, self.seq, self.fresh = point, seq, fresh


def candidates(entries):
    """(the number of FLUSH/FUA points, the Candidates) of ENTRIES."""
    points = [e for e in entries if e.flags & (logwrites.FLUSH | logwrites.FUA)]
    follows = dict(zip([p.index for p in points], points[1:]))
    out, seq, last_seq, pos = [], -1, -1, 0
    for p in points:
        for e in entries[pos:p.index + 1]:
            if e.mark and e.mark.startswith("seq"):
                seq = int(e.mark[3:])
        pos = p.index + 1
        nxt = follows.get(p.index)
        if nxt and not any(changes_data(e) for e in entries[p.index + 1:nxt.index + 1]):
            continue  # the next point leaves this same image
        out.append(Candidate(p, seq, seq > last_seq))
        last_seq = seq
    return len(points), out


def tier_seed():
    """The seed placing the standard tier's sample (choose), from
    MLOOP_POWERCUT_SEED, default 1; None in the full tier
    (MLOOP_TEST_TIER=full), which checks every point."""
    if os.environ.get("MLOOP_TEST_TIER") == "full":
        return None
    return int(os.environ.get("MLOOP_POWERCUT_SEED", "1"))


# Points the sample adds to the fresh ones, spread evenly over the log:
# they check states between syncs (a journal mid-commit) wherever they are.
SPREAD = 24


def choose(cands, seed, spread=SPREAD):
    """The candidates a sample checks: every fresh one (each sync's
    promise at the first image after it returned) and SPREAD more, evenly
    spaced, the first placed by SEED.  SEED None: all of them."""
    if seed is None:
        return list(cands)
    rest = [c for c in cands if not c.fresh]
    picked = set()
    if rest:
        stride = max(1.0, len(rest) / spread)
        offset = random.Random(seed).random() * stride
        k = 0
        while offset + k * stride < len(rest) and k < spread:
            picked.add(rest[int(offset + k * stride)].point.index)
            k += 1
    return [c for c in cands if c.fresh or c.point.index in picked]


def check_points(d, log, base, ops, seed=None, report=print, check=check_image,
                 spread=SPREAD):
    """Rebuilds the image at FLUSH and FUA entries of LOG in turn and checks
    each (CHECK, check_image by default, which must remove the copy it is
    given), CHECKERS at a time: every candidate (see
    candidates) when SEED is None, else the sample choose() makes with it,
    whose seed and entries REPORT is told (so a failure can be found
    again).  Returns (the number of points, the number of candidates, the
    number checked, the first failure as "entry ...: problems" or None);
    stops at the first failure."""
    with logwrites.Log(log) as lw:
        entries = list(lw.entries())
        points, cands = candidates(entries)
        chosen = choose(cands, seed, spread)
        if seed is not None:
            report(f"# power-cut sample, seed {seed} (MLOOP_POWERCUT_SEED): "
                   f"{len(chosen)} of {len(cands)} distinct images, at entries "
                   + " ".join(str(c.point.index) for c in chosen))
        work = os.path.join(d, "work.img")
        run(["cp", "--sparse=always", base, work])
        # The copies each check recovers go to /tmp, a tmpfs in the VM.
        snaps = tempfile.mkdtemp(prefix="mloop-ktest-snap-")
        done, checked, failure = -1, 0, None
        pending = []  # (candidate, future), oldest first

        def settle(limit):
            nonlocal checked, failure
            while len(pending) > limit:
                c, fut = pending.pop(0)
                problems = fut.result()
                checked += 1
                if problems and failure is None:
                    failure = f"entry {c.point!r} (syncs up to {c.seq}): {problems[:10]}"
        try:
            with ThreadPoolExecutor(CHECKERS) as pool:
                for c in chosen:
                    lw.replay(work, c.point.index, start=done + 1, entries=entries)
                    done = c.point.index
                    snap = os.path.join(snaps, f"snap{c.point.index}.img")
                    run(["cp", "--sparse=always", work, snap])
                    pending.append((c, pool.submit(check, snap, c.seq, ops)))
                    settle(CHECKERS)
                    if failure:
                        break
                settle(0)
        finally:
            shutil.rmtree(snaps, True)
    return points, len(cands), checked, failure
