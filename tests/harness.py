"""Shared fixture for mloop's protocol tests.

Starts a real nbdkit serving the built mloop plugin on a private Unix
socket, hands out libnbd connections, and removes every process, socket
and temporary file on exit, whether the test passed, failed or crashed.
A missing tool makes the test SKIP (exit 77) with its reason.

Run a test by hand from the repository root:
  MLOOP_PLUGIN=build/plugin/nbdkit-mloop-plugin.so PYTHONPATH=tests \
      /usr/bin/python3 tests/protocol/test-rw-patterns.py

Environment (set by tests/meson.build):
  MLOOP_PLUGIN     path of the built nbdkit-mloop-plugin.so
  MLOOP_VALGRIND   if set, nbdkit runs under valgrind and any valgrind
                   error fails the test
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

if shutil.which("nbdkit") is None:
    skip("nbdkit is not installed")

PLUGIN = os.environ.get("MLOOP_PLUGIN")
if not PLUGIN or not os.path.exists(PLUGIN):
    skip("MLOOP_PLUGIN does not name the built plugin")

VALGRIND = bool(os.environ.get("MLOOP_VALGRIND"))

_cleanups = []


def on_exit(fn):
    """Registers FN to run at exit, most recent first."""
    _cleanups.append(fn)


@atexit.register
def _run_cleanups():
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # cleanup must go on
            print(f"cleanup: {e}", file=sys.stderr)


def _sigterm(signum, frame):
    sys.exit(1)  # runs the atexit cleanups


signal.signal(signal.SIGTERM, _sigterm)


def tmpdir():
    """A private directory removed at exit."""
    d = tempfile.mkdtemp(prefix="mloop-test-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    on_exit(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def make_image(size, data=None, directory=None):
    """A sparse image of SIZE bytes, optionally starting with DATA."""
    d = directory or tmpdir()
    path = os.path.join(d, "disk.img")
    with open(path, "wb") as f:
        if data:
            f.write(data)
        f.truncate(size)
    return path


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Server:
    """nbdkit running the mloop plugin in the foreground."""

    def __init__(self, image, params=(), nbdkit_args=()):
        self.dir = tmpdir()
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.log = os.path.join(self.dir, "nbdkit.log")
        cmd = []
        if VALGRIND:
            cmd += ["valgrind", "--quiet", "--error-exitcode=99",
                    "--leak-check=full", "--errors-for-leak-kinds=definite",
                    "--show-leak-kinds=definite",
                    f"--suppressions={os.path.dirname(__file__)}/valgrind.supp"]
        cmd += ["nbdkit", "-f", "-U", self.sock, *nbdkit_args,
                PLUGIN, f"file={image}", *params]
        env = dict(os.environ)
        if VALGRIND:
            env["NBDKIT_VALGRIND"] = "1"  # nbdkit keeps the plugin mapped
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        on_exit(self.stop)
        deadline = time.time() + (60 if VALGRIND else 10)
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nbdkit exited at startup: {self.log_text()}")
            if time.time() > deadline:
                raise RuntimeError("nbdkit did not create its socket")
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
        """Stops nbdkit; fails the test if valgrind found errors.

        Call it at the end of a test so a valgrind error fails the test;
        the exit-time cleanup calls it too, for tests that fail early.
        """
        if self.logf.closed:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("nbdkit did not exit on SIGTERM")
        self.logf.close()
        if os.path.exists(self.sock):
            os.unlink(self.sock)  # nbdkit leaves -U sockets behind
        if VALGRIND and self.proc.returncode == 99:
            print(self.log_text(), file=sys.stderr)
            raise SystemExit("valgrind reported errors in nbdkit (see above)")


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
