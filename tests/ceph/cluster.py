"""A real one-node Ceph cluster for tests, on loopback only.

    import cluster
    reason = cluster.missing_reason()
    if reason:
        print(f"SKIP: {reason}"); sys.exit(77)
    with cluster.Cluster() as c:
        c.create_image("disk", 64 << 20)
        subprocess.run(["rbd", *c.client_args(), "info", c.spec("disk")])

What it starts, in a private directory under $TMPDIR (or /var/tmp):

- one monitor, mon.a, on 127.0.0.1 with msgr v2 and v1 on two free
  ports (mon_host names both, so clients of either protocol connect);
- one manager, mgr.x (optional: with_mgr=False).  IO needs only the
  monitor and the OSD: PGs are created by the monitor, and clients talk
  to the OSD directly.  The manager serves `ceph pg stat`, `ceph -s`'s
  PG summary, the rbd_support module (`rbd trash purge schedule`, `rbd
  task add`, `rbd perf image`) and the autoscaler; without it the
  cluster warns "no active mgr" after two minutes, which blocks no IO;
- one OSD, osd.0, BlueStore on a sparse 10 GiB file (bluestore_block_
  create): the object store real clusters run, with its own allocator,
  checksums and WAL, where MemStore would keep every object in the
  OSD's memory and hide BlueStore's latency.  The file is sparse, so it
  costs only what is written (about 40 MiB for a fresh cluster);
  BlueStore opens it O_DIRECT, so TMPDIR's filesystem must take that
  (ext4 and xfs do);
- cephx on everywhere, with client.admin and client.mloop (caps of
  `profile rbd` on the test pool only), and a pool with the rbd
  application, initialised by `rbd pool init`;
- memory: about 45 MiB for the monitor, 50-70 MiB for the OSD
  (osd_memory_target is set to its minimum, 896 MiB, a cap its caches
  never reach here), 300 MiB for the manager (its Python modules).

Every address is 127.0.0.1: mon_host, public_addr and cluster_addr
(the OSD and the manager bind there, never to every address), and IPv6
binding is off.

Every daemon runs in the foreground (-f) in a process group of its own,
and dies with this process (PR_SET_PDEATHSIG) even if it is SIGKILLed.
stop() (also run at exit, by __exit__ and on SIGTERM when the caller
uses harness-style handling) kills every group and removes the
directory; a directory left by a process that died without running it
is removed by the next Cluster started.  MLOOP_CEPH_KEEP=1 keeps the
directory (logs, data) and prints its path.

Each stage is bounded in time (timeout_factor scales the limits); a
daemon that does not come up fails start() with its name and its log's
tail.

Measured on the project machine (2 cores): start 5-7 s (most of it the
OSD's mkfs and boot; the manager comes up meanwhile), 10 s while other
tests load both cores; stop 0.1 s.
"""
import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

# tests/procstop.py, one directory up (standard library only).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import procstop  # noqa: E402

# Debian 12 package of each program the cluster needs.
TOOLS = {
    "ceph-mon": "ceph-mon",
    "ceph-osd": "ceph-osd",
    "ceph-mgr": "ceph-mgr",
    "ceph": "ceph-common",
    "rbd": "ceph-common",
    "ceph-authtool": "ceph-common",
    "monmaptool": "ceph-common",
}

PREFIX = "mloop-ceph-"
GiB = 1 << 30


def missing_reason(with_mgr=True):
    """None if a cluster can be started here, else one line saying why
    not (for a test to print with SKIP and exit 77)."""
    for tool, package in TOOLS.items():
        if tool == "ceph-mgr" and not with_mgr:
            continue
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package})"
    return None


class StartError(RuntimeError):
    """A daemon did not come up, or a command got no answer, in time."""


def _free_port():
    """A port free on 127.0.0.1 now.  The kernel picks it from the
    ephemeral range, which Ceph's own daemons (6800-7300) do not use."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with(parent):
    """preexec_fn: the daemon gets SIGKILL when its parent dies, so a test
    killed outright (meson's timeout ends with SIGKILL) leaves no daemon."""
    def fn():
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(1)
    return fn


def _exit_on_sigterm():
    """Makes SIGTERM (meson's timeout, a killed test) exit through atexit,
    which stops the cluster, unless the caller handles SIGTERM itself
    (tests/harness.py does the same)."""
    if (signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def _tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({path}: {e.strerror})\n"


def _remove_stale(root):
    """Removes the directories of clusters whose owner process is gone:
    their daemons died with it (PR_SET_PDEATHSIG), their files did not."""
    for name in os.listdir(root):
        m = re.match(re.escape(PREFIX) + r"(\d+)-", name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


class Daemon:
    """One Ceph daemon in the foreground, in its own process group."""

    def __init__(self, cluster, name, cmd):
        self.cluster = cluster
        self.name = name  # mon.a, mgr.x, osd.0
        self.cmd = cmd
        self.proc = None
        self.log = os.path.join(cluster.dir, "log", f"{name}.log")
        # What the daemon prints before its log is open (bad options, a
        # failed config fetch) goes here.
        self.output = os.path.join(cluster.dir, "log", f"{name}.out")

    def start(self):
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True, preexec_fn=_die_with(os.getpid()))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig):
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signals the daemon's group and waits for it; SIGKILL after
        TIMEOUT.  Returns the exit status (None if it was not running)."""
        if self.proc is None:
            return None
        self.send(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            self.proc.wait()
        # Anything the daemon forked (it forks nothing in the foreground)
        # goes with the group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.proc.returncode

    def tail(self, lines=30):
        return (f"--- {self.log} (last {lines} lines)\n{_tail(self.log, lines)}"
                f"--- {self.output}\n{_tail(self.output, lines)}")


class Cluster:
    """A one-node Ceph cluster: see the module's docstring.

    Attributes once started: conf (ceph.conf path), fsid, pool,
    client_id ("mloop"), client_name ("client.mloop"), client_keyring,
    admin_keyring, dir, mon_addrs, and daemons by name (mon, mgr, osd).
    """

    def __init__(self, pool="mloop", with_mgr=True, osd_size=10 * GiB,
                 pg_num=8, timeout_factor=1.0):
        self.pool = pool
        self.with_mgr = with_mgr
        self.osd_size = osd_size
        self.pg_num = pg_num
        # A factor on every time limit, for slow machines.
        self.scale = timeout_factor
        self.client_id = "mloop"
        self.client_name = f"client.{self.client_id}"
        self.fsid = str(uuid.uuid4())
        self.dir = None
        self.daemons = {}
        self.keep = bool(os.environ.get("MLOOP_CEPH_KEEP"))
        self.times = {}  # stage -> seconds, for the caller to report

    # --- paths and commands -------------------------------------------

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def client_args(self):
        """Arguments that make rbd, rados or ceph act as the test client."""
        return ["-c", self.conf, "--id", self.client_id]

    def admin_args(self):
        return ["-c", self.conf, "--id", "admin"]

    def env(self):
        """An environment in which Ceph's tools (rbd, rados, ceph) and
        librados programs that call rados_conf_parse_env() find this
        cluster as the test client, with no options: CEPH_CONF and
        CEPH_ARGS."""
        env = dict(os.environ)
        env["CEPH_CONF"] = self.conf
        env["CEPH_ARGS"] = f"--id {self.client_id}"
        return env

    def spec(self, image, snap=None):
        """pool/image[@snap], as rbd names an image."""
        return f"{self.pool}/{image}" + (f"@{snap}" if snap else "")

    def _run(self, cmd, timeout=60, input=None, what=None):
        """Runs CMD in a process group of its own; raises with its output
        when it fails, or with the daemons' logs when it times out.  The
        group is killed afterwards: a crashing tool may leave children."""
        limit = timeout * self.scale
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE if input else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_die_with(os.getpid()))
        try:
            out, err = p.communicate(input, timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise StartError(f"{what or cmd[0]}: no answer in {limit:.0f} s: "
                             f"{' '.join(cmd)}\n{self._tails()}")
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.returncode != 0:
            err = "".join(err.splitlines(True)[-20:])
            raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {err.strip()}")
        return out

    def ceph(self, *args, timeout=60):
        """Runs `ceph ARGS` as client.admin; returns its stdout."""
        return self._run(["ceph", *self.admin_args(), "--connect-timeout",
                          str(int(timeout * self.scale)), *args], timeout=timeout)

    def ceph_json(self, *args, timeout=60):
        return json.loads(self.ceph(*args, "-f", "json", timeout=timeout))

    def rbd(self, *args, timeout=60):
        """Runs `rbd ARGS` as the test client; returns its stdout."""
        return self._run(["rbd", *self.client_args(), *args], timeout=timeout)

    # --- images --------------------------------------------------------

    def create_image(self, name, size, *extra):
        """An image of SIZE bytes in the pool (rbd create --size SIZE B,
        Pacific's default features: layering, exclusive-lock,
        object-map, fast-diff, deep-flatten)."""
        self.rbd("create", "--size", f"{size}B", *extra, self.spec(name))
        return self.spec(name)

    def remove_image(self, name):
        """Removes an image and its snapshots (unprotected first)."""
        snaps = json.loads(self.rbd("snap", "ls", "--format", "json", self.spec(name)))
        for s in snaps:
            if s.get("protected") == "true":
                self.rbd("snap", "unprotect", self.spec(name, s["name"]))
        if snaps:
            self.rbd("snap", "purge", "--no-progress", self.spec(name))
        self.rbd("rm", "--no-progress", self.spec(name))

    def images(self):
        return json.loads(self.rbd("ls", "--format", "json", self.pool))

    # --- the OSD, for tests of a cluster that stops answering -----------

    def stop_osd(self, sig=signal.SIGTERM, wait_down=True):
        """Stops osd.0.  SIGTERM: it tells the monitor it is going down
        (osd_fast_shutdown_notify_mon) and is marked down at once; with
        WAIT_DOWN this waits for that.  SIGKILL: a crash; with no other
        OSD to report it the monitor keeps it up for mon_osd_report_
        timeout (900 s), and clients' requests wait for it either way."""
        self.daemons["osd"].stop(sig)
        if sig == signal.SIGTERM and wait_down:
            self._wait("osd.0 marked down", lambda: not self._osd_up(), 30,
                       self.daemons["mon"])

    def start_osd(self):
        """Restarts osd.0 on its data and waits until this new instance is
        up and in.  After a SIGKILL the monitor still has the old one up:
        the new one's boot has it marked down and up again, in a later
        map epoch (up_from) than the old one's."""
        osd = self.daemons["osd"]
        if osd.alive():
            raise RuntimeError("osd.0 is running")
        before = self._osd()["up_from"]
        osd.start()
        self._wait("osd.0 up", lambda: self._osd_up(after=before), 60, osd)

    # --- the whole cluster, for tests of one that is gone ----------------

    def pause(self):
        """SIGSTOP to every daemon: the cluster stops answering at once,
        its connections left open, as behind a network that drops
        everything.  resume() undoes it; stop() works on paused daemons.
        Returns once every thread of every daemon is stopped, so that a
        request sent afterwards cannot be answered (procstop.py: why)."""
        for d in self.daemons.values():
            d.send(signal.SIGSTOP)
        procstop.wait_stopped([d.proc.pid for d in self.daemons.values() if d.alive()])

    def resume(self):
        for d in self.daemons.values():
            d.send(signal.SIGCONT)

    def stop_daemons(self):
        """Stops every daemon with SIGTERM, the OSD first (the monitor
        marks it down at once), keeping their data: the cluster is shut
        down, not lost.  0.3-1.5 s."""
        self.stop_osd()
        for name in ("mgr", "mon"):
            if name in self.daemons:
                self.daemons[name].stop()

    def start_daemons(self):
        """Starts what stop_daemons() stopped, on the same data, and waits
        until the monitor has quorum and osd.0 is up and in: 3-7 s, most
        of it the OSD's boot."""
        mon = self.daemons["mon"]
        mon.start()
        self._wait("quorum", lambda: self.ceph_json("mon", "stat", timeout=10)["quorum"],
                   30, mon)
        if "mgr" in self.daemons:
            self.daemons["mgr"].start()
        self.start_osd()

    def _osd(self):
        """osd.0's entry in the OSD map (up, in, up_from, addresses)."""
        d = self.ceph_json("osd", "dump", timeout=20)
        return next(o for o in d["osds"] if o["osd"] == 0)

    def _osd_up(self, after=-1):
        o = self._osd()
        return bool(o["up"] and o["in"] and o["up_from"] > after)

    # --- start and stop -------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def _tails(self):
        return "".join(d.tail() for d in self.daemons.values())

    def _wait(self, what, ready, timeout, daemon):
        """Polls READY until it is true; fails naming DAEMON, with its
        log's tail, if it exits or TIMEOUT (scaled) passes first."""
        deadline = time.monotonic() + timeout * self.scale
        while True:
            if not daemon.alive():
                raise StartError(f"{daemon.name} exited ({daemon.proc.returncode}) "
                                 f"waiting for {what}\n{daemon.tail()}")
            try:
                if ready():
                    return
            except (RuntimeError, ValueError, KeyError, StopIteration):
                pass  # not up yet: the monitor refuses or answers partially
            if time.monotonic() > deadline:
                raise StartError(f"{daemon.name}: {what} not within "
                                 f"{timeout * self.scale:.0f} s\n{daemon.tail()}")
            time.sleep(0.25)

    def _stage(self, name, fn):
        t = time.monotonic()
        fn()
        self.times[name] = time.monotonic() - t

    def start(self):
        """Starts the cluster; on any failure stops what it started and
        raises StartError (or RuntimeError from a failed command)."""
        root = os.environ.get("TMPDIR", "/var/tmp")
        _remove_stale(root)
        self.dir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)
        atexit.register(self.stop)
        _exit_on_sigterm()
        t = time.monotonic()
        try:
            for d in ("run", "log", "crash", "mon", "mgr", "osd"):
                os.mkdir(self.path(d))
            self._stage("config", self._write_config)
            self._stage("mon", self._start_mon)
            if self.with_mgr:
                self._start_mgr()  # comes up while the OSD is made
            self._stage("osd", self._start_osd)
            self._stage("pool", self._make_pool)
            if self.with_mgr:
                self._stage("mgr", lambda: self._wait(
                    "mgr.x available",
                    lambda: self.ceph_json("mgr", "stat", timeout=20)["available"],
                    60, self.daemons["mgr"]))
        except BaseException:
            self.stop()
            raise
        self.times["start"] = time.monotonic() - t

    def _write_config(self):
        v2, v1 = _free_port(), _free_port()
        self.mon_addrs = f"[v2:127.0.0.1:{v2},v1:127.0.0.1:{v1}]"
        self.conf = self.path("ceph.conf")
        self.admin_keyring = self.path("client.admin.keyring")
        self.client_keyring = self.path(f"{self.client_name}.keyring")
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(f"""\
[global]
fsid = {self.fsid}
mon_host = {self.mon_addrs}
# Loopback only: daemons bind where public_addr and cluster_addr say,
# and with neither they would bind to every address.
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv4 = true
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
# Pacific's fix for CVE-2021-20288: refuse old clients' global_id
# reclaim, so the monitor has no warning to raise about it.
auth_allow_insecure_global_id_reclaim = false
run_dir = {d}/run
crash_dir = {d}/crash
# One OSD: one copy, and the initial CRUSH rule picks OSDs, not hosts.
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
# Pools keep the PG count they are made with: no autoscaler splitting
# PGs (and pausing IO to peer them) under a test.
osd_pool_default_pg_autoscale_mode = off
# The monitor warns below 30 % free on its disk's filesystem and stops
# below 5 %; its store here is a few MiB on a shared disk.
mon_data_avail_warn = 1
mon_data_avail_crit = 0
# Maps change once a second at most by default: an OSD's boot and a
# pool's creation take a few changes each, and wait for each.
paxos_propose_interval = 0.1

[mon]
mon_data = {d}/mon/$id
keyring = {d}/mon/keyring
log_file = {d}/log/$name.log
mon_cluster_log_file = {d}/log/cluster.log

[mgr]
mgr_data = {d}/mgr/$id
keyring = {d}/mgr/$id/keyring
log_file = {d}/log/$name.log

[osd]
osd_data = {d}/osd/$id
keyring = {d}/osd/$id/keyring
log_file = {d}/log/$name.log
osd_objectstore = bluestore
# Where the OSD puts itself in CRUSH, named here: by default the host's
# name, which a test VM may not have (the OSD then exits at boot, "unable
# to update_crush_location").
crush_location = root=default host=mloop-test
bluestore_block_create = true
bluestore_block_size = {self.osd_size}
# mkfs checks the store it has just made: half a second of nothing to find.
bluestore_fsck_on_mkfs = false
# 4 GiB by default, 896 MiB at least; caches shrink to fit.
osd_memory_target = 939524096
# Two cores: fewer op queue shards than a rotational device's 5 (the
# file reads as one).
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 1

[client.admin]
keyring = {self.admin_keyring}

[{self.client_name}]
keyring = {self.client_keyring}
""")
        # A server reads only a configuration no one else may write,
        # whatever the umask the tests run under.
        os.chmod(self.conf, 0o644)
        # Every key is made here and handed to the monitor at mkfs, so no
        # `ceph auth` round trip is needed once it runs.
        auth = [
            ("mon.", self.path("mon", "keyring"), ["mon", "allow *"]),
            ("client.admin", self.admin_keyring,
             ["mon", "allow *", "osd", "allow *", "mgr", "allow *", "mds", "allow *"]),
            ("mgr.x", None, ["mon", "allow profile mgr", "osd", "allow *", "mds", "allow *"]),
            ("osd.0", None, ["mon", "allow profile osd", "mgr", "allow profile osd",
                             "osd", "allow *"]),
            (self.client_name, self.client_keyring,
             ["mon", "profile rbd", "osd", f"profile rbd pool={self.pool}",
              "mgr", f"profile rbd pool={self.pool}"]),
        ]
        os.makedirs(self.path("mgr", "x"))
        os.makedirs(self.path("osd", "0"))
        for name, keyring, caps in auth:
            if keyring is None:
                keyring = self.path(name.split(".")[0], name.split(".")[1], "keyring")
            cmd = ["ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", name]
            for kind, cap in zip(caps[::2], caps[1::2]):
                cmd += ["--cap", kind, cap]
            self._run(cmd)
            if name != "mon.":
                self._run(["ceph-authtool", self.path("mon", "keyring"),
                           "--import-keyring", keyring])

    def _start_mon(self):
        monmap = self.path("mon", "monmap")
        self._run(["monmaptool", "--create", "--fsid", self.fsid,
                   "--addv", "a", self.mon_addrs, monmap])
        self._run(["ceph-mon", "-c", self.conf, "-i", "a", "--mkfs",
                   "--monmap", monmap, "--keyring", self.path("mon", "keyring")])
        mon = self.daemons["mon"] = Daemon(
            self, "mon.a", ["ceph-mon", "-f", "-c", self.conf, "-i", "a"])
        mon.start()
        self._wait("quorum", lambda: self.ceph_json("mon", "stat", timeout=10)["quorum"],
                   30, mon)

    def _start_mgr(self):
        mgr = self.daemons["mgr"] = Daemon(
            self, "mgr.x", ["ceph-mgr", "-f", "-c", self.conf, "-i", "x"])
        mgr.start()

    def _start_osd(self):
        osd_uuid = str(uuid.uuid4())
        # Registers osd.0 in the OSD map (its key is already known).
        self.ceph("osd", "new", osd_uuid, "0")
        self._run(["ceph-osd", "-c", self.conf, "-i", "0", "--mkfs",
                   "--osd-uuid", osd_uuid], timeout=120, what="osd.0 mkfs")
        osd = self.daemons["osd"] = Daemon(
            self, "osd.0", ["ceph-osd", "-f", "-c", self.conf, "-i", "0"])
        osd.start()
        self._wait("osd.0 up", self._osd_up, 60, osd)

    def _make_pool(self):
        self.ceph("osd", "pool", "create", self.pool, str(self.pg_num),
                  str(self.pg_num), "replicated")
        # As client.admin: `profile rbd` may not enable an application,
        # and rbd pool init then leaves the pool without one, silently.
        # It writes the pool's rbd_info object, so it returns once a PG is
        # active; the others peer with it, and IO to one still peering
        # waits for it rather than fail.
        self._run(["rbd", *self.admin_args(), "pool", "init", self.pool],
                  timeout=60, what="rbd pool init")

    def stop(self):
        """Kills every daemon (SIGKILL: the cluster is thrown away, there
        is nothing to flush) and removes the directory.  Safe to call
        twice; also runs at exit."""
        if self.dir is None:
            return
        t = time.monotonic()
        for d in self.daemons.values():
            d.stop(signal.SIGKILL)
        if self.keep:
            print(f"MLOOP_CEPH_KEEP: cluster files kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        self.times["stop"] = time.monotonic() - t
