#!/usr/bin/python3
"""mloop-server's command line and lifecycle: --help, --version, bad
options with one clear line, a pid file that appears when listening and
goes on exit, an existing socket path left alone, a quick start, and on
SIGTERM in-flight requests finished, the socket removed, exit 0."""
import os
import signal
import subprocess
import time
import harness

if harness.SERVER_KIND != "native":
    harness.skip("mloop-server's own command line")
BIN = harness.SERVER_BIN

out = subprocess.run([BIN, "--help"], capture_output=True, text=True, check=True).stdout
for opt in ("--listen", "--threads", "--read-only", "--pid-file", "--direct", "--discard",
            "--export-name", "--handshake-timeout", "--max-handshakes"):
    assert opt in out, f"--help lacks {opt}"
out = subprocess.run([BIN, "--version"], capture_output=True, text=True, check=True).stdout
assert out.startswith("mloop-server "), out

d = harness.tmpdir()
image = harness.make_image(1 << 20, directory=d)
sock = os.path.join(d, "s.sock")
for args, message in [
    ([image], "--listen"),
    (["--listen", f"unix:{sock}"], "expected one IMAGE"),
    (["--listen", f"unix:{sock}", os.path.join(d, "missing.img")], "No such file"),
    (["--listen", f"unix:{sock}", d], "is a directory"),
    (["--listen", f"unix:{sock}", "--threads", "0", image], "threads=0"),
    (["--listen", f"unix:{sock}", "--direct", "maybe", image], "--direct=maybe"),
    (["--listen", f"unix:{sock}", "--handshake-timeout", "0", image], "--handshake-timeout=0"),
    (["--listen", f"unix:{sock}", "--max-handshakes", "0", image], "--max-handshakes=0"),
    (["--listen", "carrier-pigeon", image], "expected unix:PATH or tcp:HOST:PORT"),
    # Never a port other than the one asked for (99999 would be 34463, 0
    # any port nobody is told of).
    (["--listen", "tcp:127.0.0.1:99999", image], "port 99999 is out of range (1-65535)"),
    (["--listen", "tcp:127.0.0.1:65536", image], "port 65536 is out of range (1-65535)"),
    (["--listen", "tcp:127.0.0.1:0", image], "port 0 is out of range (1-65535)"),
    (["--listen", "tcp:[::1]:123456789012", image], "out of range (1-65535)"),
]:
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=10)
    assert p.returncode == 1, f"{args}: exit {p.returncode}"
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], f"{args}: {p.stderr!r}"
assert not os.path.exists(os.path.join(d, "missing.img"))

# A pid file that cannot be written: refused after the socket is bound,
# which must not stay behind with nobody serving it.
p = subprocess.run([BIN, "--listen", f"unix:{sock}", "--pid-file",
                    os.path.join(d, "no-such-dir", "pid"), image],
                   capture_output=True, text=True, timeout=10)
lines = [l for l in p.stderr.splitlines() if "PR_SET_IO_FLUSHER" not in l]
assert p.returncode == 1 and len(lines) == 1 and "--pid-file" in lines[0] \
    and "No such file" in lines[0], p.stderr
assert not os.path.exists(sock), "a refused start left its socket behind"

# An existing file at the socket path is not replaced.
with open(sock, "w") as f:
    f.write("not a socket")
p = subprocess.run([BIN, "--listen", f"unix:{sock}", image], capture_output=True, text=True, timeout=10)
assert p.returncode == 1 and "Address already in use" in p.stderr, p.stderr
assert open(sock).read() == "not a socket"
os.unlink(sock)



def serves_then_says(img, what, while_up=lambda: None):
    """Starts the server on SOCK with IMG, runs WHILE_UP once it listens,
    stops it, and returns its stderr; WHAT names the case when it dies."""
    pidfile = os.path.join(d, "case.pid")
    proc = subprocess.Popen([BIN, "--listen", f"unix:{sock}", "--pid-file", pidfile, img],
                            stderr=subprocess.PIPE, text=True)
    harness.on_exit(lambda: proc.poll() is None and proc.kill())
    while not os.path.exists(pidfile):
        assert proc.poll() is None, f"server died on {what}: {proc.stderr.read()!r}"
        time.sleep(0.01)
    while_up()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    return proc.stderr.read()


# A 0-byte image is served (an empty export is valid NBD) with a warning.
empty = os.path.join(d, "empty.img")
open(empty, "w").close()
err = serves_then_says(empty, "an empty image")
assert "empty.img: the export is 0 bytes" in err, err
print("ok: a 0-byte image is served with a warning")

# A socket nobody listens on (left by a server that was killed) is
# replaced, so a restart comes back; a live one is never touched.
import socket
stale = socket.socket(socket.AF_UNIX)
stale.bind(sock)
stale.close()


def connects():
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(sock)
    probe.close()


err = serves_then_says(image, "a stale socket", connects)
assert "replaced a stale socket" in err, err
live = socket.socket(socket.AF_UNIX)
live.bind(sock)
live.listen()
harness.on_exit(live.close)
p = subprocess.run([BIN, "--listen", f"unix:{sock}", image], capture_output=True, text=True,
                   timeout=10)
lines = p.stderr.strip().splitlines()
assert p.returncode == 1 and len(lines) == 1 and "Address already in use" in lines[0], p.stderr
connects()                      # the live socket still there, still listening
live.close()
os.unlink(sock)
print("ok: a stale socket is replaced, a live one and a file are not")

# Pid file, quick start, SIGTERM with requests in flight.
pidfile = os.path.join(d, "pid")
start = time.monotonic()
proc = subprocess.Popen([BIN, "--listen", f"unix:{sock}", "--pid-file", pidfile, image])
harness.on_exit(lambda: proc.poll() is None and proc.kill())
while not os.path.exists(pidfile):
    assert proc.poll() is None, "server died"
    time.sleep(0.01)
started = time.monotonic() - start
assert started < 1.0, f"took {started:.2f} s to listen"
assert int(open(pidfile).read()) == proc.pid
import nbd
h = nbd.NBD()
h.connect_uri(f"nbd+unix:///?socket={sock}")
cookies = [h.aio_pwrite(bytes([i]) * 65536, i * 65536) for i in range(16)]
proc.send_signal(signal.SIGTERM)
assert proc.wait(timeout=30) == 0, "exit status after SIGTERM"
done = 0
for c in cookies:
    try:
        while not h.aio_command_completed(c):
            h.poll(-1)
        done += 1
    except nbd.Error as e:
        # Refused as received after the signal, or never received at all
        # (still in flight when the server closed).
        assert e.errno in ("ESHUTDOWN", "ENOTCONN", "ECONNRESET"), f"unexpected: {e}"
assert not os.path.exists(sock), "socket left behind"
assert not os.path.exists(pidfile), "pid file left behind"
print(f"ok: CLI, pid file, listening in {started * 1000:.0f} ms, SIGTERM clean ({done}/16 writes finished)")

# TCP on the loopback address (never anything else).
import socket
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
pidfile = os.path.join(d, "tcp.pid")
proc = subprocess.Popen([BIN, "--listen", f"tcp:127.0.0.1:{port}", "--pid-file", pidfile, image])
harness.on_exit(lambda: proc.poll() is None and proc.kill())
while not os.path.exists(pidfile):
    assert proc.poll() is None, "server died"
    time.sleep(0.01)
h = nbd.NBD()
h.connect_tcp("127.0.0.1", str(port))
h.pwrite(b"t" * 4096, 0)
assert h.pread(4096, 0) == b"t" * 4096
h.shutdown()
proc.send_signal(signal.SIGTERM)
assert proc.wait(timeout=30) == 0
print("ok: tcp:127.0.0.1 listener")
