"""Shared fixture for mloop's protocol tests.

Starts the real server under test (nbdkit with the built mloop plugin,
or the built mloop-server) on a private Unix socket, hands out libnbd connections, and removes every process, socket
and temporary file on exit, whether the test passed, failed or crashed.
A missing tool makes the test SKIP (exit 77) with its reason.

Run a test by hand from the repository root:
  MLOOP_PLUGIN=build/plugin/nbdkit-mloop-plugin.so PYTHONPATH=tests \
      /usr/bin/python3 tests/protocol/test-rw-patterns.py

Environment (set by tests/meson.build):
  MLOOP_SERVER     "nbdkit" (default): nbdkit with the built plugin;
                   "native": the built mloop-server (the names of
                   `mloop attach --server`).  The same tests run
                   against both; parameters are written the plugin's way
                   (threads=4, discard=off, nbdkit -r) and translated.
  MLOOP_PLUGIN     path of the built nbdkit-mloop-plugin.so
  MLOOP_SERVER_BIN path of the built mloop-server
  MLOOP_VALGRIND   if set, the server runs under valgrind and any valgrind
                   error fails the test
  MLOOP_ASAN_PRELOAD  set by tests/asan-run (meson test --setup=asan): the
                   ASan runtime and tests/helpers/asan-first.so, preloaded
                   into nbdkit (see nbdkit_env)
  MLOOP_STORE      "file" (default) or "rbd": each image file a test
                   serves is copied into an RBD image of a running Ceph
                   cluster, and the server serves that (mloop-server
                   rbd:POOL/NAME, the plugin's rbd=POOL/NAME) with
                   MLOOP_CEPH_CONF, MLOOP_CEPH_ID and MLOOP_RBD_POOL
                   (set by tests/ceph/run-suites-over-rbd).  When a
                   writable server stops, the image is copied back into
                   the file, so a test reads what was written there as
                   it does on a file; read_image() and
                   image_data_ranges() read the image while it is
                   served.  A test that only makes sense on a file is a
                   SKIP with its reason (RBD_SKIPS); the file-only parts
                   of others are left out (file_only()).
"""
import atexit
import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


try:
    import nbd  # python3-libnbd
except ImportError:
    skip("python3-libnbd (module nbd) is not installed")

SERVER_KIND = os.environ.get("MLOOP_SERVER", "nbdkit")
PLUGIN = os.environ.get("MLOOP_PLUGIN")
SERVER_BIN = os.environ.get("MLOOP_SERVER_BIN")
if SERVER_KIND == "nbdkit":
    if shutil.which("nbdkit") is None:
        skip("nbdkit is not installed")
    if not PLUGIN or not os.path.exists(PLUGIN):
        skip("MLOOP_PLUGIN does not name the built plugin")
elif SERVER_KIND == "native":
    if not SERVER_BIN or not os.path.exists(SERVER_BIN):
        skip("MLOOP_SERVER_BIN does not name the built mloop-server")
else:
    raise SystemExit(f"MLOOP_SERVER={SERVER_KIND}: expected nbdkit or native")


STORE = os.environ.get("MLOOP_STORE", "file")
if STORE not in ("file", "rbd"):
    raise SystemExit(f"MLOOP_STORE={STORE}: expected file or rbd")

# The tests that cannot make sense on an RBD image, and why: what they
# test is the file (or block device) under the server.
RBD_SKIPS = {
    "test-aio-limit.py": "kernel AIO contexts are the file store's (librbd has its own threads)",
    "test-direct-io.py": "O_DIRECT and the host page cache are a file's",
    "test-odd-tail-race.py": "the race it guards is a file's last page between the page "
                             "cache and O_DIRECT",
    "test-io-errors.py": "a full filesystem and a file shrunk under the server are a file's",
    "test-blockdev.py": "it serves block devices",
    "test-unlinked-image.py": "a file unlinked or truncated under the server is a file's",
    "test-sparse-copy.py": "it counts the bytes read from the backing file (/proc/PID/io)",
    "test-offset-window.py": "an offset=/sizelimit= window is a file's (refused for RBD)",
    "test-overlay.py": "its base and overlay are files",
    "test-sighup-size.py": "it resizes the file under the server (an RBD image's size "
                           "follows rbd resize through librbd's update watch)",
    "test-log-limit.py": "its failed reads come from a file shrunk under the server",
    "test-meta-context.py": "its descriptors are a file's exact map; RBD reports each "
                            "object's allocation from the object's start",
    "test-idle-connections.py": "it counts the workers' kernel AIO contexts, a file's",
    "test-tls.py": "it reads and resets the image file under the server (TLS is the "
                   "transport's, whatever the store)",
}
if STORE == "rbd" and os.path.basename(sys.argv[0]) in RBD_SKIPS:
    skip(f"on an RBD image: {RBD_SKIPS[os.path.basename(sys.argv[0])]}")


def file_only(what):
    """Whether to run a part of a test that only a file can do (WHAT);
    in RBD mode says it is left out and returns False."""
    if STORE == "file":
        return True
    print(f"note: {what}: a file's, left out on an RBD image")
    return False


def nbdkit_only(reason):
    """Skips a test that exercises nbdkit itself, when testing mloop-server."""
    if SERVER_KIND != "nbdkit":
        skip(f"nbdkit plugin only: {reason}")


def _native_args(params, nbdkit_args):
    """mloop-server options for plugin-style PARAMS and nbdkit ARGS."""
    out = []
    for p in params:
        if "=" not in p:
            out.append(f"--{p}")        # a flag: the plugin's key=on
            continue
        key, value = p.split("=", 1)
        # The plugin's stats= is mloop-server's --stats-file (like --pid-file).
        key = "stats-file" if key == "stats" else key
        out.append(f"--{key}={value}")
    for a in nbdkit_args:
        if a in ("-r", "--readonly", "--read-only"):
            out.append("--read-only")
        else:
            raise ValueError(f"no mloop-server equivalent for nbdkit {a}")
    return out

VALGRIND = bool(os.environ.get("MLOOP_VALGRIND"))
# The standard tier's valgrind pass leaves out its slowest tests, stress
# tests that run the same server code many times over (docs/testing.md):
# the ASan+UBSan pass runs them in that tier all the same, and the full
# tier's valgrind pass runs them too.
VALGRIND_FULL_TIER_ONLY = {
    "test-odd-tail-race.py": "2,000 racing rounds, 300 under valgrind (55 s)",
    "test-idle-connections.py": "1,000 idle connections' threads (57 s)",
    "test-tls.py": "its handshakes' crypto (34 s)",
    "test-overlay-base.py": "its many server starts (16-29 s)",
    "test-offset-window.py": "every window's server start (16 s)",
}
if (VALGRIND and os.environ.get("MLOOP_TEST_TIER") != "full"
        and os.path.basename(sys.argv[0]) in VALGRIND_FULL_TIER_ONLY):
    skip("under valgrind in the full tier only (MLOOP_TEST_TIER=full): "
         + VALGRIND_FULL_TIER_ONLY[os.path.basename(sys.argv[0])]
         + "; the ASan+UBSan pass runs it")
ASAN_PRELOAD = os.environ.get("MLOOP_ASAN_PRELOAD")
# The servers under test are built with ASan+UBSan (meson test --setup=asan).
SANITIZED = bool(ASAN_PRELOAD)


def nbdkit_env():
    """The environment for an nbdkit that loads the built plugin.  Under
    the asan setup the plugin is built with ASan and nbdkit is not: the
    runtime must be loaded first, before nbdkit's own libraries, and
    initialized before their constructors (tests/helpers/asan-first.c)."""
    env = dict(os.environ)
    if ASAN_PRELOAD:
        # The plugin too: nbdkit unloads it at exit, before LeakSanitizer
        # reports, and a preloaded copy stays mapped so its frames keep
        # their names.
        env["LD_PRELOAD"] = ASAN_PRELOAD + (f":{PLUGIN}" if PLUGIN else "")
        # Allocation stacks of one frame (the caller of malloc), so that
        # tests/lsan.supp can forgive what nbdkit itself leaks and only
        # that, as tests/valgrind.supp does; the plugin's leaks are still
        # reported.
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":malloc_context_size=2"
    return env

def traced_env(env):
    """ENV for a server run under strace or gdb.  LeakSanitizer cannot
    work in a traced process: at exit it dies with a fatal error instead
    of a report.  Leaks are still checked in every untraced run of the
    same server; the other sanitizer checks stay on here."""
    env = dict(env)
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    return env


_cleanups = []
_rbd_images = None      # the RBD images standing in for files (MLOOP_STORE=rbd)


_failed_checks = []


def check(name, ok, detail=""):
    """A named check that lets the test go on: prints "ok   NAME", or
    "FAIL NAME: DETAIL" and remembers it for exit_if_failed()."""
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""),
          flush=True)
    if not ok:
        _failed_checks.append(name)
    return ok


def exit_if_failed():
    """At a test's end: fails it, naming them, if any check() failed."""
    if _failed_checks:
        sys.exit(f"{len(_failed_checks)} check(s) failed: {', '.join(_failed_checks)}")


def on_exit(fn):
    """Registers FN to run at exit, most recent first."""
    _cleanups.append(fn)


def kill_at_exit(proc):
    """Kills PROC (a Popen) at exit if it still runs, and reaps it: a
    test that fails half-way leaves no process of its own."""
    on_exit(lambda: proc.poll() is None and (proc.kill(), proc.wait()))


@atexit.register
def _run_cleanups():
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # cleanup must go on
            print(f"cleanup: {e}", file=sys.stderr)
    # Last: the RBD images, once every server using them has stopped.
    if _rbd_images is not None:
        _rbd_images.close()


def _sigterm(signum, frame):
    sys.exit(1)  # runs the atexit cleanups


signal.signal(signal.SIGTERM, _sigterm)


def tmpdir():
    """A private directory removed at exit."""
    d = tempfile.mkdtemp(prefix="mloop-test-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def mount_tmpfs(size, why):
    """A private tmpfs of SIZE (e.g. "4m"), unmounted at exit; skips the
    test (saying WHY it wanted one) when not root or mounting fails."""
    if os.geteuid() != 0:
        skip(f"{why} needs root to mount a tmpfs")
    mnt = tmpdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "mloop-test", mnt]).returncode != 0:
        skip(f"{why}: cannot mount a tmpfs")
    on_exit(lambda: subprocess.run(["umount", "-l", mnt]))
    return mnt


def make_image(size, data=None, directory=None):
    """A sparse image of SIZE bytes, optionally starting with DATA."""
    d = directory or tmpdir()
    path = os.path.join(d, "disk.img")
    with open(path, "wb") as f:
        if data:
            f.write(data)
        f.truncate(size)
    return path


def make_patterned_image(size, regions):
    """A sparse image of SIZE bytes holding pattern(N, OFF) at each (OFF, N)
    of REGIONS, and holes elsewhere."""
    path = make_image(size)
    with open(path, "r+b") as f:
        for off, n in regions:
            f.seek(off)
            f.write(pattern(n, off))
    return path


def file_data_ranges(path, start, end):
    """The data ranges of bytes [START, END) of PATH, as the filesystem
    reports them (SEEK_DATA/SEEK_HOLE), relative to START."""
    fd = os.open(path, os.O_RDONLY)
    out, pos = [], start
    try:
        while pos < end:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            if data >= end:
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            out.append((data - start, min(hole, end) - start))
            pos = hole
    finally:
        os.close(fd)
    return out


def _merged(ranges):
    out = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def files_equal(a, b):
    """Whether files A and B hold the same bytes, read only where either
    has data: where both have holes both read as zeroes.  cmp reads every
    byte, 16 GiB of zeroes for two 8 GiB sparse images (a minute of a
    test's time here)."""
    size = os.path.getsize(a)
    if os.path.getsize(b) != size:
        return False
    ranges = _merged(file_data_ranges(a, 0, size) + file_data_ranges(b, 0, size))
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for start, end in ranges:
            fa.seek(start)
            fb.seek(start)
            pos = start
            while pos < end:
                n = min(end - pos, 1 << 20)
                if fa.read(n) != fb.read(n):
                    return False
                pos += n
    return True


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def terminate(proc, timeout=60):
    """SIGTERMs PROC and waits; kills it after TIMEOUT seconds.  Returns
    whether it exited on SIGTERM (True if it had already exited)."""
    if proc.poll() is not None:
        return True
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def make_certificates(d, client=False):
    """A CA and a server certificate for 127.0.0.1 in directory D, as
    nbdkit, qemu-nbd and mloop-server read them (ca-cert.pem,
    server-cert.pem, server-key.pem; ca-key.pem stays there too).  With
    CLIENT, also client-cert.pem and client-key.pem signed by the same
    CA, where libnbd looks for them.  Skips the test without openssl."""
    if shutil.which("openssl") is None:
        skip("openssl is not installed (needed to make test certificates)")

    def ossl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)

    def signed(name, cn, ext):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
             "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        with open(os.path.join(d, "ext.cnf"), "w") as f:
            f.write(ext)
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca-cert.pem",
             "-CAkey", "ca-key.pem", "-CAcreateserial", "-days", "2",
             "-extfile", "ext.cnf", "-out", f"{name}-cert.pem")
        for junk in (f"{name}.csr", "ext.cnf", "ca-cert.srl"):
            os.unlink(os.path.join(d, junk))

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=mloop test CA", "-keyout", "ca-key.pem", "-out", "ca-cert.pem")
    signed("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
           "extendedKeyUsage=serverAuth\n")
    if client:
        signed("client", "mloop test client", "extendedKeyUsage=clientAuth\n")


def make_psk_file(path, user="alice"):
    """A pre-shared key file at PATH in the nbdkit/qemu format
    ("user:hexkey"), 0600, with a fresh random key."""
    with open(path, "w") as f:
        f.write(f"{user}:{os.urandom(32).hex()}\n")
    os.chmod(path, 0o600)
    return path


def make_client_pki(certs, parent):
    """Two client certificate directories in PARENT from the CA in CERTS
    (made by make_certificates(..., client=True)), as libnbd's
    tls-certificates= reads them: one with the CA only, one with the CA
    and the client certificate.  Returns (ca_only, with_cert)."""
    ca_only = os.path.join(parent, "client-ca")
    with_cert = os.path.join(parent, "client-cert")
    os.mkdir(ca_only)
    os.mkdir(with_cert)
    shutil.copy(os.path.join(certs, "ca-cert.pem"), ca_only)
    for name in ("ca-cert.pem", "client-cert.pem", "client-key.pem"):
        shutil.copy(os.path.join(certs, name), with_cert)
    return ca_only, with_cert


class _RbdImages:
    """The RBD images standing in for image files (MLOOP_STORE=rbd), in
    the pool MLOOP_RBD_POOL, reached with python3-rbd as MLOOP_CEPH_ID;
    removed at exit."""

    CHUNK = 1 << 20

    def __init__(self):
        try:
            import rados
            import rbd
        except ImportError:
            skip("MLOOP_STORE=rbd: python3-rbd and python3-rados are not installed")
        self.rbd = rbd
        try:
            self.conf = os.environ["MLOOP_CEPH_CONF"]
            self.id = os.environ["MLOOP_CEPH_ID"]
            self.pool = os.environ["MLOOP_RBD_POOL"]
        except KeyError as e:
            raise SystemExit(f"MLOOP_STORE=rbd needs {e.args[0]} (the running cluster)")
        self.cluster = rados.Rados(conffile=self.conf, rados_id=self.id)
        self.cluster.connect(timeout=60)
        self.ioctx = self.cluster.open_ioctx(self.pool)
        self.names = {}      # real path of the file -> its image's name
        self.synced = {}     # real path -> the file's stat when it last equalled its image
        self.made = []

    def close(self):
        """Removes the images made (at exit, after every cleanup)."""
        for name in self.made:
            try:
                self.rbd.RBD().remove(self.ioctx, name)
            except Exception as e:
                print(f"cleanup: rbd remove {self.pool}/{name}: {e}", file=sys.stderr)
        self.made = []
        self.ioctx.close()
        self.cluster.shutdown()

    @staticmethod
    def _stat(path):
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def served(self, path):
        """The image holding what the file at PATH holds: the one made for
        it before if neither changed since, else a new one, copied from
        the file (its data regions, skipping zeroes)."""
        path = os.path.realpath(path)
        if path in self.names and self.synced.get(path) == self._stat(path):
            return self.names[path]
        test = "".join(ch for ch in os.path.basename(sys.argv[0]) if ch.isalnum() or ch in ".-_")
        name = f"mloop-{test}-{os.getpid()}-{len(self.made)}"
        size = os.path.getsize(path)
        self.rbd.RBD().create(self.ioctx, name, size)
        self.made.append(name)
        with self.rbd.Image(self.ioctx, name) as img, open(path, "rb") as f:
            for start, end in file_data_ranges(path, 0, size):
                for off in range(start, end, self.CHUNK):
                    data = os.pread(f.fileno(), min(self.CHUNK, end - off), off)
                    if data.count(0) != len(data):
                        img.write(data, off)
            img.flush()
        self.names[path] = name
        self.synced[path] = self._stat(path)
        return name

    def spec(self, path):
        return f"{self.pool}/{self.served(path)}"

    def _open(self, path):
        name = self.names.get(os.path.realpath(path))
        if name is None:
            raise AssertionError(f"{path} was not served from an RBD image")
        return self.rbd.Image(self.ioctx, name, read_only=True)

    def export(self, path):
        """Copies the image of PATH back into the file: its size, and its
        allocated regions (zeroes left as holes)."""
        path = os.path.realpath(path)
        with self._open(path) as img, open(path, "r+b") as f:
            size = img.size()
            f.truncate(0)
            f.truncate(size)
            for start, end in self._ranges(img, 0, size, whole_object=True):
                for off in range(start, end, self.CHUNK):
                    data = img.read(off, min(self.CHUNK, end - off))
                    if data.count(0) != len(data):
                        os.pwrite(f.fileno(), data, off)
        self.synced[path] = self._stat(path)

    def read(self, path, offset, length):
        with self._open(path) as img:
            return img.read(offset, length)

    @staticmethod
    def _ranges(img, start, end, whole_object=False):
        out = []

        def cb(offset, length, exists):
            if exists:
                if out and out[-1][1] == offset:
                    out[-1] = (out[-1][0], offset + length)
                else:
                    out.append((offset, offset + length))
            return 0
        img.diff_iterate(start, end - start, None, cb, include_parent=True,
                         whole_object=whole_object)
        return out

    def data_ranges(self, path, start, end):
        with self._open(path) as img:
            return [(max(a, start) - start, min(b, end) - start)
                    for a, b in self._ranges(img, start, end)]


def _rbd():
    global _rbd_images
    if _rbd_images is None:
        _rbd_images = _RbdImages()
    return _rbd_images


def native_image_args(image):
    """mloop-server's arguments naming IMAGE: the file, or (MLOOP_STORE=rbd)
    its RBD image with the options that reach the cluster."""
    if STORE == "file":
        return [image]
    r = _rbd()
    return [f"--ceph-conf={r.conf}", f"--ceph-id={r.id}", f"rbd:{r.spec(image)}"]


def nbdkit_image_params(image):
    """The plugin's parameters naming IMAGE, as native_image_args."""
    if STORE == "file":
        return [f"file={image}"]
    r = _rbd()
    return [f"rbd={r.spec(image)}", f"ceph-conf={r.conf}", f"ceph-id={r.id}"]


def image_served_last(image):
    """After a writable server of IMAGE stopped: in RBD mode, copies the
    image back into the file, so the test reads there what was written."""
    if STORE == "rbd":
        _rbd().export(image)


def read_image(image, offset, length):
    """LENGTH bytes of IMAGE at OFFSET as its store holds them, beneath
    the server while it serves: the file's (not the page cache's), or its
    RBD image's."""
    if STORE == "rbd":
        return _rbd().read(image, offset, length)
    fd = os.open(image, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def allocated_bytes(image):
    """What IMAGE has allocated: the file's blocks, or the bytes of its
    RBD image's objects (image_data_ranges)."""
    if STORE == "rbd":
        return sum(b - a for a, b in image_data_ranges(image, 0, os.path.getsize(image)))
    return os.stat(image).st_blocks * 512


def image_data_ranges(image, start, end):
    """The data ranges of bytes [START, END) of IMAGE as its store reports
    them, relative to START: the file's SEEK_DATA/SEEK_HOLE map, or the
    RBD image's allocation (rbd_diff_iterate2, each object from its start
    to its end)."""
    if STORE == "rbd":
        return _rbd().data_ranges(image, start, end)
    return file_data_ranges(image, start, end)


class Server:
    """The server under test (nbdkit + plugin, or mloop-server) in the
    foreground on a private Unix socket (on IMAGE's RBD image in RBD
    mode)."""

    def __init__(self, image, params=(), nbdkit_args=(), preexec_fn=None, pass_fds=()):
        self.dir = tmpdir()
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.log = os.path.join(self.dir, "server.log")
        cmd = []
        if VALGRIND:
            cmd += ["valgrind", "--quiet", "--error-exitcode=99",
                    "--leak-check=full", "--errors-for-leak-kinds=definite",
                    "--show-leak-kinds=definite",
                    f"--suppressions={os.path.dirname(__file__)}/valgrind.supp"]
        # Ready means listening.  A Unix socket file appears at bind(), a
        # moment before listen() (under valgrind, a long moment), so wait
        # for the pid file both servers write once they listen.
        ready = os.path.join(self.dir, "server.pid")
        self.image = image
        self.read_only = any(a in ("-r", "--readonly", "--read-only") for a in nbdkit_args)
        if SERVER_KIND == "native":
            cmd += [SERVER_BIN, "--listen", f"unix:{self.sock}",
                    "--pid-file", ready,
                    *_native_args(params, nbdkit_args), *native_image_args(image)]
        else:
            cmd += ["nbdkit", "-f", "-U", self.sock, "-P", ready, *nbdkit_args,
                    PLUGIN, *nbdkit_image_params(image), *params]
        env = nbdkit_env() if SERVER_KIND == "nbdkit" else dict(os.environ)
        if VALGRIND:
            env["NBDKIT_VALGRIND"] = "1"  # nbdkit keeps the plugin mapped
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT,
                                     env=env, preexec_fn=preexec_fn, pass_fds=pass_fds)
        on_exit(self.stop)
        # An RBD image is opened before listening, up to seconds on a busy cluster.
        deadline = time.time() + (60 if VALGRIND else 30 if STORE == "rbd" else 10)
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited at startup: {self.log_text()}")
            if time.time() > deadline:
                raise RuntimeError("server did not create its socket")
            time.sleep(0.05)
        self.uri = f"nbd+unix:///?socket={self.sock}"

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def connect(self, strict=True):
        h = nbd.NBD()
        if not strict:
            # Let unaligned requests reach the server: it must serve them.
            h.set_strict_mode(0)
        h.connect_uri(self.uri)
        on_exit(lambda: _disconnect(h))
        return h

    def stop(self):
        """Stops the server; fails the test if valgrind found errors.

        Call it at the end of a test so a valgrind error fails the test;
        the exit-time cleanup calls it too, for tests that fail early.
        """
        if self.logf.closed:
            return
        if not terminate(self.proc):
            raise RuntimeError("server did not exit on SIGTERM")
        self.logf.close()
        if os.path.exists(self.sock):
            if SERVER_KIND == "native":
                raise AssertionError("mloop-server left its socket behind")
            os.unlink(self.sock)  # nbdkit leaves -U sockets behind
        if VALGRIND and self.proc.returncode == 99:
            print(self.log_text(), file=sys.stderr)
            raise SystemExit("valgrind reported errors in the server (see above)")
        if SERVER_KIND == "native" and self.proc.returncode != 0:
            raise AssertionError(f"mloop-server exited with {self.proc.returncode}")
        if not self.read_only:
            image_served_last(self.image)


def _disconnect(h):
    try:
        h.shutdown()
    except nbd.Error:
        pass  # already disconnected (the server went away)


def expect_error(errno_value, fn, *args):
    """Asserts that FN(*ARGS) fails with nbd.Error carrying ERRNO_VALUE."""
    try:
        fn(*args)
    except nbd.Error as e:
        # libnbd's Python binding gives the errno as its symbolic name.
        want = errno.errorcode[errno_value]
        assert e.errno == want, f"expected {want}, got {e.errno}: {e}"
        return e
    raise AssertionError(f"{fn.__name__} succeeded; expected errno {errno_value}")


def pattern(size, seed):
    """Deterministic, position-dependent bytes: misplaced data can't match."""
    import random
    return random.Random(seed).randbytes(size)


def nbdcopy_round_trip(srv, src, target):
    """Copies SRC into SRV's export (the image TARGET) and back out with
    nbdcopy over 4 connections, stops SRV, and checks that TARGET and the
    copy out both equal SRC."""
    back = target + ".back"
    for args in ([src, srv.uri], [srv.uri, back]):
        subprocess.run(["nbdcopy", "--connections=4", *args], check=True, timeout=300)
    srv.stop()
    for copy in (target, back):
        assert files_equal(src, copy), f"{copy} differs from {src}"
