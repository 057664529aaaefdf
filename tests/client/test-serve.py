#!/usr/bin/python3
"""`mloop serve`: an image served to other machines, tested on 127.0.0.1
and Unix sockets only.  The native server by default (TLS too), nbdkit
with the plugin on request; a Unix socket is 0600 in a 0700 directory;
TCP listens on the address given and nowhere else; with --tls require, on
both servers, a plaintext client is refused, and libnbd clients (nbdinfo,
nbdcopy, fio's nbd engine) work with a pre-shared key and with
certificates."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import nbd

import harness
from harness import check

MLOOP = os.environ["MLOOP_CLI"]
procs = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args, ready):
    """Starts `mloop serve ARGS`; READY() says when it listens."""
    p = subprocess.Popen([MLOOP, "serve", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    procs.append(p)
    deadline = time.monotonic() + 20
    while not ready():
        if p.poll() is not None:
            raise AssertionError(f"mloop serve exited {p.returncode}: {p.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("mloop serve did not start listening")
        time.sleep(0.05)
    return p


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def tcp_ready(port):
    def ready():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    return ready


def listening_addresses(port):
    """Local addresses with a TCP socket listening on PORT."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, p = local.split(":")
                if state == "0A" and int(p, 16) == port:
                    found.add(addr)
    return found


def connect_when_admitted(uri, timeout=10):
    """A libnbd handle on URI, once the server lets it in (the readiness
    probe's connection may still count for a moment), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = nbd.NBD()
        try:
            h.connect_uri(uri)
            return h
        except nbd.Error:
            time.sleep(0.1)
    return None


def refused(uri):
    """Whether a libnbd client is refused at URI (it connects, else)."""
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)   # tls-certificates=
    try:
        h.connect_uri(uri)
    except nbd.Error:
        return True
    h.shutdown()
    return False


def roundtrip(uri, image, name):
    """Writes through URI with libnbd, reads back, compares with the file."""
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)   # tls-psk-file=, tls-certificates=
    h.connect_uri(uri)
    data = os.urandom(65536)
    h.pwrite(data, 1 << 20)
    h.flush()
    back = h.pread(65536, 1 << 20)
    h.shutdown()
    with open(image, "rb") as f:
        f.seek(1 << 20)
        on_disk = f.read(65536)
    check(f"{name}: data written, read back and in the file",
          back == data and on_disk == data)


work = tempfile.mkdtemp(prefix="mloop-serve-", dir="/var/tmp")
try:
    image = os.path.join(work, "disk.img")
    with open(image, "wb") as f:
        f.truncate(64 << 20)

    # Unix socket, native server: 0600 socket in a fresh 0700 directory.
    sock = os.path.join(work, "private", "nbd.sock")
    p = serve(image, "--listen", f"unix:{sock}", ready=lambda: os.path.exists(sock))
    check("unix: socket is 0600", os.stat(sock).st_mode & 0o777 == 0o600,
          oct(os.stat(sock).st_mode))
    check("unix: its directory was made 0700",
          os.stat(os.path.dirname(sock)).st_mode & 0o777 == 0o700)
    roundtrip(f"nbd+unix:///?socket={sock}", image, "unix native")
    stop(p)
    check("unix: SIGTERM stops the server and removes the socket",
          p.returncode == 0 and not os.path.exists(sock), f"exit {p.returncode}")

    # TCP on 127.0.0.1, both servers: listens there and nowhere else.
    for kind in ("native", "nbdkit"):
        port = free_port()
        p = serve(image, "--listen", f"tcp:127.0.0.1:{port}", "--server", kind,
                  ready=tcp_ready(port))
        addrs = listening_addresses(port)
        check(f"tcp {kind}: listens only on 127.0.0.1", addrs == {"0100007F"}, addrs)
        roundtrip(f"nbd://127.0.0.1:{port}/", image, f"tcp {kind}")
        stop(p)

    # --keepalive reaches the native server (serve execs it: same pid);
    # what the server does with it is tests/native/test-limits.py's.
    port = free_port()
    p = serve(image, "--listen", f"tcp:127.0.0.1:{port}", "--keepalive", "7:3:2",
              ready=tcp_ready(port))
    with open(f"/proc/{p.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    check("--keepalive 7:3:2 is passed to mloop-server", b"--keepalive=7:3:2" in argv, argv)
    stop(p)

    # --max-connections, both servers (nbdkit: its limit filter).
    for kind in ("native", "nbdkit"):
        port = free_port()
        p = serve(image, "--listen", f"tcp:127.0.0.1:{port}", "--server", kind,
                  "--max-connections", "1", ready=tcp_ready(port))
        first = connect_when_admitted(f"nbd://127.0.0.1:{port}/")
        check(f"--max-connections 1, {kind}: a second client is refused",
              first is not None and refused(f"nbd://127.0.0.1:{port}/"))
        if first:
            first.shutdown()
        stop(p)

    # TLS, both servers: the native one by default, nbdkit on request.
    psk = harness.make_psk_file(os.path.join(work, "keys.psk"))
    certs = os.path.join(work, "pki")
    os.mkdir(certs)
    harness.make_certificates(certs, client=True)
    client, client_cert = harness.make_client_pki(certs, work)
    for kind in ("native", "nbdkit"):
        server = [] if kind == "native" else ["--server", "nbdkit"]

        # With a pre-shared key (nbdkit's PSK file format: user:hexkey).
        port = free_port()
        p = serve(image, "--listen", f"tcp:127.0.0.1:{port}", "--tls", "require",
                  "--tls-psk", psk, *server, ready=tcp_ready(port))
        uri = f"nbds://alice@127.0.0.1:{port}/?tls-psk-file={psk}"
        # mloop serve execs the server: which one is it?
        exe = os.path.basename(os.readlink(f"/proc/{p.pid}/exe"))
        check(f"tls psk {kind}: served by {kind}",
              exe == ("mloop-server" if kind == "native" else "nbdkit"), exe)
        r = subprocess.run(["nbdinfo", "--size", f"nbd://127.0.0.1:{port}/"],
                           capture_output=True, text=True)
        check(f"tls psk {kind}: a plaintext client is refused",
              r.returncode != 0 and "TLS" in r.stderr, r.stderr)
        r = subprocess.run(["nbdinfo", "--size", uri], capture_output=True, text=True)
        check(f"tls psk {kind}: nbdinfo",
              r.returncode == 0 and r.stdout.strip() == str(64 << 20), r.stderr)
        roundtrip(uri, image, f"tls psk {kind} libnbd")
        copy = os.path.join(work, "copy.img")
        r = subprocess.run(["nbdcopy", uri, copy], capture_output=True, text=True)
        check(f"tls psk {kind}: nbdcopy copies the image exactly",
              r.returncode == 0 and open(copy, "rb").read() == open(image, "rb").read(),
              r.stderr)
        os.unlink(copy)
        stop(p)

        # With certificates.
        port = free_port()
        p = serve(image, "--listen", f"tcp:127.0.0.1:{port}", "--tls", "require",
                  "--tls-certificates", certs, *server, ready=tcp_ready(port))
        roundtrip(f"nbds://127.0.0.1:{port}/?tls-certificates={client}", image,
                  f"tls certificates {kind} libnbd")
        # fio's nbd engine cannot pass tls-certificates= or tls-psk-file=
        # (libnbd refuses local files in a URI unless the program allows
        # them, and fio 3.33 does not), so it finds the CA where libnbd
        # looks by default.
        if shutil.which("fio"):
            home = os.path.join(work, "home")
            os.makedirs(os.path.join(home, ".pki", "libnbd"), exist_ok=True)
            shutil.copy(os.path.join(certs, "ca-cert.pem"), os.path.join(home, ".pki", "libnbd"))
            r = subprocess.run(["fio", "--name=tls", "--ioengine=nbd",
                                f"--uri=nbds://127.0.0.1:{port}/", "--rw=randwrite",
                                "--bs=4k", "--size=4m", "--iodepth=8", "--verify=crc32c",
                                "--verify_fatal=1"],
                               capture_output=True, text=True, cwd=work,
                               env=dict(os.environ, HOME=home))
            check(f"tls certificates {kind}: fio nbd engine writes and verifies",
                  r.returncode == 0 and "err= 0" in r.stdout, r.stderr[-500:])
        r = subprocess.run(["nbdinfo", "--size", f"nbd://127.0.0.1:{port}/"],
                           capture_output=True, text=True)
        check(f"tls certificates {kind}: a plaintext client is refused",
              r.returncode != 0, r.stderr)
        stop(p)

        # --tls-verify-peer reaches the server: a client needs a
        # certificate the CA signed.
        port = free_port()
        p = serve(image, "--listen", f"tcp:127.0.0.1:{port}", "--tls", "require",
                  "--tls-certificates", certs, "--tls-verify-peer", *server,
                  ready=tcp_ready(port))
        check(f"tls-verify-peer {kind}: a client without a certificate is refused",
              refused(f"nbds://127.0.0.1:{port}/?tls-certificates={client}"))
        roundtrip(f"nbds://127.0.0.1:{port}/?tls-certificates={client_cert}", image,
                  f"tls-verify-peer {kind}: a client with a certificate")
        stop(p)

    # Refusals: one line, non-zero, nothing started.
    for args, expect in [
            ([image], "--listen"),
            ([image, "--listen", "tcp:127.0.0.1"], "expected unix:PATH or tcp:HOST:PORT"),
            ([image, "--listen", "tcp:127.0.0.1:65536"], "port 65536 is out of range"),
            ([image, "--listen", "unix:/x", "--tls", "require"], "--tls needs"),
            ([image, "--listen", "unix:/x", "--tls", "require", "--tls-psk", psk,
              "--tls-verify-peer"], "--tls-verify-peer needs --tls-certificates"),
            ([image, "--listen", "unix:/x", "--tls", "maybe"], "--tls maybe"),
            ([image, "--listen", "unix:/x", "--tls", "on", "--tls-psk",
              os.path.join(work, "none.psk")], "none.psk"),
            ([os.path.join(work, "none.img"), "--listen", "unix:/x"], "No such file"),
            ([image, "--listen", "unix:/x", "--max-connections-per-client", "2",
              "--server", "nbdkit"], "the nbdkit server has no per-client cap"),
            ([image, "--listen", "unix:/x", "--keepalive", "off", "--server", "nbdkit"],
             "the nbdkit server takes no keepalive settings"),
            ([image, "--listen", "unix:/x", "--max-connections", "-1"],
             "--max-connections -1")]:
        r = subprocess.run([MLOOP, "serve", *args], capture_output=True, text=True, timeout=30)
        lines = r.stderr.strip().splitlines()
        check(f"refused: {' '.join(args[1:]) or 'no --listen'}",
              r.returncode != 0 and len(lines) == 1 and expect in lines[0], r.stderr)
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(work, ignore_errors=True)

harness.exit_if_failed()
