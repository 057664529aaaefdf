"""mloop-server on a TCP port of 127.0.0.1 (or a Unix socket) with any
options, for the hardening tests, and what /proc says about it.

Like harness.Server (whose cleanup, MLOOP_VALGRIND and MLOOP_STORE
handling it shares), but the command line is the test's own:
--export-name, --handshake-timeout, --max-handshakes, a low open-files
limit to start with.
"""
import os
import resource
import socket
import subprocess
import sys
import time

import harness

if harness.SERVER_KIND != "native":
    harness.skip("hardening tests are for mloop-server")


def free_port():
    """A port of 127.0.0.1 free a moment ago (the caller retries if taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_own_nofile(want):
    """Raises this process's open-files soft limit to WANT (or the hard
    limit); skips the test when the hard limit is below WANT."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        harness.skip(f"open-files hard limit {hard} < {want} needed")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class NetServer:
    """mloop-server IMAGE with ARGS, listening on tcp:127.0.0.1:PORT (or
    on a Unix socket if unix=True).  nofile: the soft open-files limit
    it starts with (it raises it to the hard limit itself), or a (soft,
    hard) pair."""

    def __init__(self, image, args=(), unix=False, nofile=None, valgrind=None,
                 valgrind_args=(), log_start=None):
        self.dir = harness.tmpdir()
        self.log = os.path.join(self.dir, "server.log")
        # LOG_START: what the log holds already, appended to as mloop
        # appends to a device's server.log.
        self.log_start = log_start
        self.valgrind = harness.VALGRIND if valgrind is None else valgrind
        self.valgrind_args = list(valgrind_args)
        self.logf = None
        self.image = image
        self.read_only = "--read-only" in args or "-r" in args
        harness.on_exit(self.kill)
        for attempt in range(5):
            if unix:
                self.sock = os.path.join(self.dir, "nbd.sock")
                self.addr = self.sock
                listen = f"unix:{self.sock}"
                self.uri = f"nbd+unix:///?socket={self.sock}"
            else:
                self.sock = None
                port = free_port()
                self.addr = ("127.0.0.1", port)
                listen = f"tcp:127.0.0.1:{port}"
                self.uri = f"nbd://127.0.0.1:{port}/"
            if self._start(image, [*args, "--listen", listen], nofile):
                return
            if unix or "Address already in use" not in self.log_text():
                raise RuntimeError(f"server exited at startup: {self.log_text()}")
        raise RuntimeError("no free port after 5 tries")

    def _start(self, image, args, nofile):
        ready = os.path.join(self.dir, "server.pid")
        cmd = []
        if self.valgrind:
            cmd += ["valgrind", "--quiet", "--error-exitcode=99",
                    "--leak-check=full", "--errors-for-leak-kinds=definite",
                    "--show-leak-kinds=definite",
                    f"--suppressions={os.path.dirname(os.path.dirname(__file__))}/valgrind.supp",
                    *self.valgrind_args]
        cmd += [harness.SERVER_BIN, "--pid-file", ready, *args,
                *harness.native_image_args(image)]

        def limit():
            if isinstance(nofile, tuple):
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
            elif nofile:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        if self.log_start is None:
            self.logf = open(self.log, "w")
        else:
            with open(self.log, "wb") as f:
                f.write(self.log_start)
            self.logf = open(self.log, "a")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT,
                                     preexec_fn=limit)
        self.pid = self.proc.pid
        deadline = time.time() + (60 if self.valgrind else 30 if harness.STORE == "rbd" else 10)
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                self.logf.close()
                return False
            if time.time() > deadline:
                raise RuntimeError("server did not start listening")
            time.sleep(0.02)
        return True

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def connect(self, name=None):
        import nbd
        h = nbd.NBD()
        if name is not None:
            h.set_export_name(name)
        if self.sock:
            h.connect_unix(self.sock)
        else:
            h.connect_tcp(*map(str, self.addr))
        return h

    def alive(self):
        return self.proc.poll() is None

    # What the kernel says about the server process.
    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self):
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def status_kib(self, field):
        """VmRSS, VmSize...: KiB, from /proc/PID/status."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise KeyError(field)

    def cpu_seconds(self):
        """User plus system CPU time the server has used."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def aio_contexts(self):
        """Kernel AIO contexts: each io_setup maps one "[aio]" ring."""
        with open(f"/proc/{self.pid}/maps") as f:
            return sum("/[aio]" in line for line in f)

    def settle(self, fds, threads, timeout=10):
        """Waits until the fd and thread counts are back to FDS and
        THREADS; fails the test saying what was left."""
        deadline = time.monotonic() + timeout
        while (self.fds(), self.threads()) != (fds, threads):
            assert self.alive(), f"server died: {self.log_text()}"
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not back to baseline after {timeout} s: fds {self.fds()} "
                    f"(baseline {fds}), threads {self.threads()} (baseline {threads})")
            time.sleep(0.05)

    def stop(self):
        """SIGTERM; fails the test unless it exits 0 (99: valgrind errors)."""
        if not harness.terminate(self.proc):
            raise AssertionError("server did not exit on SIGTERM")
        self.logf.close()
        if self.proc.returncode == 99 and self.valgrind:
            print(self.log_text(), file=sys.stderr)
            raise AssertionError("valgrind reported errors in the server (see above)")
        assert self.proc.returncode == 0, f"server exited {self.proc.returncode}: {self.log_text()}"
        assert self.sock is None or not os.path.exists(self.sock), "socket left behind"
        if not self.read_only:
            harness.image_served_last(self.image)

    def kill(self):
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.logf and not self.logf.closed:
            self.logf.close()


def disconnect(h):
    """Ends libnbd handle H's connection if it still has one (cleanup)."""
    import nbd
    try:
        h.shutdown()
    except nbd.Error:
        pass


def wait_eof(s, timeout):
    """Seconds until the peer closes socket S (reading and discarding what
    arrives); raises AssertionError if it stays open past TIMEOUT."""
    start = time.monotonic()
    s.settimeout(0.1)
    while True:
        try:
            if s.recv(65536) == b"":
                return time.monotonic() - start
        except socket.timeout:
            pass
        except ConnectionResetError:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"connection still open after {timeout} s")
