"""Power cut at every flush: what an fsync() promised is on disk.

The image is a dm-log-writes device (data and log on two loop devices over
scratch files), so every write that reaches it is logged in the order it
became stable.  The kind attaches it; ext4 on the attached device takes a
workload of several writers that create, replace (rename over), overwrite
in place and delete files, with fsync and fdatasync, buffered and O_DIRECT,
recording each sync that returned.  Every so often a MARK goes into the log
naming how many syncs had returned by then.

Afterwards logwrites.py rebuilds the image at FLUSH and FUA entries, which
is exactly what a disk losing power right after that entry would hold.  At
each: the filesystem recovers (mount replays its journal), fsck -fn finds it
clean, and every file whose sync returned before the last mark preceding
that entry holds a version it may hold (see check_point).

Time: the workload makes about 350 flush/FUA entries; checking one takes
about 0.6 s under TCG (all of them: 220 s for the whole test), so only
MLOOP_POWER_CUT_POINTS of them (default 100, about 75 s in all) are
checked, spread evenly over the log, the last always among them.
"""
import hashlib
import mmap
import os
import random
import threading
import time

import dmtarget
import kfix
import logwrites
from kfix import mount, run, tmpdir

DATA_SIZE = 64 << 20
# Sparse; the log holds every block written plus one header block per
# entry, far less than this for the workload below.
LOG_SIZE = 1 << 30
WRITERS = 3
OPS_PER_WRITER = 60
MARK_INTERVAL = 0.5  # seconds between marks
POINTS = max(1, int(os.environ.get("MLOOP_POWER_CUT_POINTS", "100")))


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
    try:
        rng = random.Random(100 + w)
        d = os.path.join(mnt, f"w{w}")
        os.mkdir(d)
        fsync_dir(mnt)
        live = {}  # name -> current content
        for n in range(OPS_PER_WRITER):
            choice = rng.random()
            if not live or choice < 0.4:  # create
                name = f"f{n}"
                data = rng.randbytes(4096 * rng.randrange(1, 17))
                path = os.path.join(d, name)
                op = rec.begin(path, "put", hashlib.sha256(data).hexdigest())
                write_file(path, data, rng.random() < 0.5, rng.random() < 0.5)
                # The new name is only durable once its directory is.
                fsync_dir(d)
                rec.done(op)
                live[name] = data
            elif choice < 0.65:  # replace: write aside, sync, rename over
                name = rng.choice(sorted(live))
                data = rng.randbytes(4096 * rng.randrange(1, 17))
                tmp = os.path.join(d, f"tmp{n}")
                write_file(tmp, data, rng.random() < 0.5, False)
                op = rec.begin(os.path.join(d, name), "put",
                               hashlib.sha256(data).hexdigest())
                os.rename(tmp, os.path.join(d, name))
                fsync_dir(d)
                rec.done(op)
                live[name] = data
            elif choice < 0.85:  # overwrite a block in place, fdatasync
                name = rng.choice(sorted(live))
                data = bytearray(live[name])
                block = rng.randrange(len(data) // 4096)
                new = rng.randbytes(4096)
                data[block * 4096:(block + 1) * 4096] = new
                path = os.path.join(d, name)
                op = rec.begin(path, "inplace", hashlib.sha256(data).hexdigest())
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, new, block * 4096)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                rec.done(op)
                live[name] = bytes(data)
            else:  # delete
                name = rng.choice(sorted(live))
                op = rec.begin(os.path.join(d, name), "delete")
                os.unlink(os.path.join(d, name))
                fsync_dir(d)
                rec.done(op)
                del live[name]
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


def check_point(mnt, seq, ops):
    """Checks the files of MNT (OPS is keyed by paths relative to it) (the image rebuilt at some point and recovered) as
    promised by the syncs counted up to SEQ.  For each path, the last
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


def run_test(kind, cl):
    dmtarget.load("log-writes")
    d = tmpdir(cl)
    data, log, base = (os.path.join(d, n) for n in ("data.img", "log.img", "base.img"))
    for path, size in ((data, DATA_SIZE), (log, LOG_SIZE)):
        with open(path, "wb") as f:
            f.truncate(size)
    # The filesystem is made before logging starts, so the replay starts
    # from a copy of it.  Inode tables and journal are initialised now so
    # no background zeroing writes the log full after the mount; nodiscard
    # keeps mkfs quick on the sparse file.
    run(["mkfs.ext4", "-q", "-F", "-b", "4096",
         "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", data])
    run(["cp", "--sparse=always", data, base])
    data_dev, log_dev = dmtarget.losetup(cl, data), dmtarget.losetup(cl, log)
    dm = dmtarget.Dm.create(cl, "log-writes", f"0 {dmtarget.sectors(data_dev)} "
                            f"log-writes {data_dev} {log_dev}")

    att = kind.attach(cl, dm.path)
    mnt = mount(cl, att.device)
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
    paths = {os.path.relpath(p, mnt): o for p, o in rec.ops.items()}
    run(["umount", mnt])
    att.detach()
    # Removing the target logs a final mark and brings the super block's
    # entry count up to date (logwrites.py).
    dm.remove()

    with logwrites.Log(log) as lw:
        entries = list(lw.entries())
        points = [e for e in entries if e.flags & (logwrites.FLUSH | logwrites.FUA)]
        assert len(points) >= 100, f"only {len(points)} flush/FUA entries in the log"
        step = max(1, len(points) // POINTS)
        chosen = points[::step][:POINTS - 1]
        if chosen[-1] is not points[-1]:
            chosen.append(points[-1])
        work = os.path.join(d, "work.img")
        run(["cp", "--sparse=always", base, work])
        snap = os.path.join(d, "snap.img")
        done, seq, nmarks = -1, -1, 0
        checked = 0
        spent = {"replay": 0.0, "copy": 0.0, "mount+check": 0.0, "fsck": 0.0}
        clock = [time.monotonic()]

        def lap(what):
            now = time.monotonic()
            spent[what] += now - clock[0]
            clock[0] = now
        for p in chosen:
            clock[0] = time.monotonic()
            lw.replay(work, p.index, start=done + 1, entries=entries)
            lap("replay")
            for e in entries[done + 1:p.index]:
                if e.mark and e.mark.startswith("seq"):
                    seq, nmarks = int(e.mark[3:]), nmarks + 1
            done = p.index
            run(["cp", "--sparse=always", work, snap])
            lap("copy")
            # Recovery first, as after a real power cut: the mount replays
            # the journal and clears orphans; then fsck must find nothing.
            with kfix.Cleanup() as pcl:
                m = mount(pcl, snap, "loop")
                problems = check_point(m, seq, paths)
            lap("mount+check")
            fsck = run(["fsck.ext4", "-fn", snap], check=False)
            lap("fsck")
            assert fsck.returncode == 0, \
                f"entry {p!r}: fsck -fn exit {fsck.returncode}: {fsck.stdout[-2000:]}"
            assert not problems, f"entry {p!r} (syncs up to {seq}): {problems[:10]}"
            checked += 1
        os.unlink(snap)
    print(f"# power-cut: {len(entries)} log entries, {len(points)} flush/FUA, "
          f"{checked} checked, {rec.seq} syncs; seconds spent: "
          + ", ".join(f"{k} {v:.1f}" for k, v in spent.items()), flush=True)
