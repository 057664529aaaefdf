#!/usr/bin/python3
"""mloop-server --tls: NBD_OPT_STARTTLS and TLS with a pre-shared key and
with X.509 certificates.

Clients: nbdinfo, nbdcopy (round trip, exact), qemu-img (tls-creds-psk
and tls-creds-x509 objects, convert and compare), fio's nbd engine (a
short verify job; certificates only, see below).  Refusals: a plaintext
client under --tls require (libnbd names TLS), a wrong key, a client
that does not trust the CA, a client without a certificate under
--tls-verify-peer; --tls on serves plaintext and TLS clients alike.  At
the byte level: under require every option before STARTTLS but ABORT
gets NBD_REP_ERR_TLS_REQD and EXPORT_NAME is closed on; STARTTLS with a
payload or a second time is NBD_REP_ERR_INVALID; --tls off answers
NBD_REP_ERR_UNSUP; options agreed before TLS are forgotten.  A client
that sends STARTTLS and stalls, before or inside the TLS handshake, is
dropped at the handshake deadline; a client that goes away at any byte
of its ClientHello leaves the server serving others, with its
descriptors and threads back to their baseline.  Bad credentials stop
the server at startup with one line naming the file.
With MLOOP_VALGRIND set, the servers run under valgrind."""
import os
import shutil
import socket
import ssl
import struct
import subprocess
import time

import harness
from harness import check
import netserver
import nbdwire as nw

OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS = 1, 2, 3, 5
OPT_STRUCTURED_REPLY = 8
REP_ACK, REP_SERVER = 1, 2
ERR_UNSUP, ERR_INVALID, ERR_TLS_REQD = 0x80000001, 0x80000003, 0x80000005
CMD_READ, CMD_WRITE = 0, 1

SIZE = 16 << 20
TIMEOUT = 2                     # --handshake-timeout of the stall test
LATE = 3.0 if harness.VALGRIND else 1.0



def run(*cmd, env=None):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=300, env=env)


work = harness.tmpdir()
image = harness.make_image(SIZE, directory=work)
src = os.path.join(work, "src.img")
with open(src, "wb") as f:
    f.write(harness.pattern(SIZE, 14))

# A PSK directory as qemu wants it (DIR/keys.psk), a key for the same
# user that is not the server's, certificates with a client's, and a
# second CA the server's certificate is not signed by.
pskdir = os.path.join(work, "psk")
os.mkdir(pskdir)
psk = harness.make_psk_file(os.path.join(pskdir, "keys.psk"))
wrong_psk = harness.make_psk_file(os.path.join(work, "wrong.psk"))
certs = os.path.join(work, "pki")
os.mkdir(certs)
harness.make_certificates(certs, client=True)
trusting, with_cert = harness.make_client_pki(certs, work)
other = os.path.join(work, "other-pki")
os.mkdir(other)
harness.make_certificates(other)
untrusting = os.path.join(work, "client-other-ca")
os.mkdir(untrusting)
shutil.copy(os.path.join(other, "ca-cert.pem"), untrusting)


def psk_uri(srv, key=psk):
    return f"nbds://alice@{srv.addr[0]}:{srv.addr[1]}/?tls-psk-file={key}"


def cert_uri(srv, client_dir):
    return f"nbds://{srv.addr[0]}:{srv.addr[1]}/?tls-certificates={client_dir}"


def nbdinfo_size(uri):
    r = run("nbdinfo", "--size", uri)
    return r.stdout.strip() == str(SIZE) and r.returncode == 0, r


def nbdcopy_round_trip(uri, name):
    back = os.path.join(work, "back.img")
    r1 = run("nbdcopy", "--connections=4", src, uri)
    r2 = run("nbdcopy", "--connections=4", uri, back)
    same = r1.returncode == 0 and r2.returncode == 0 and \
        subprocess.run(["cmp", src, back]).returncode == 0 and \
        subprocess.run(["cmp", src, image]).returncode == 0
    check(f"{name}: nbdcopy in and out, both copies exact", same,
          r1.stderr + r2.stderr)
    if os.path.exists(back):
        os.unlink(back)


def qemu_round_trip(srv, obj, name):
    """qemu-img convert into the export and compare it with SRC, through
    the tls-creds object OBJ."""
    if shutil.which("qemu-img") is None:
        print(f"skip {name}: qemu-img is not installed")
        return
    nbd_opts = (f"driver=nbd,server.type=inet,server.host={srv.addr[0]},"
                f"server.port={srv.addr[1]},tls-creds=tls0")
    with open(image, "r+b") as f:     # so the compare cannot pass by chance
        f.truncate(0)
        f.truncate(SIZE)
    r = run("qemu-img", "convert", "-n", "-f", "raw", "--object", obj,
            "--target-image-opts", src, nbd_opts)
    check(f"{name}: qemu-img convert into the export", r.returncode == 0, r.stderr)
    r = run("qemu-img", "compare", "--object", obj, "--image-opts",
            nbd_opts, f"driver=raw,file.driver=file,file.filename={src}")
    check(f"{name}: qemu-img compare finds the export identical",
          r.returncode == 0 and "identical" in r.stdout, r.stdout + r.stderr)


def start_tls(w):
    """STARTTLS on wire W; returns the reply type."""
    w.option(OPT_STARTTLS)
    opt, rtype, _ = w.reply()
    assert opt == OPT_STARTTLS
    return rtype


def wrap(w):
    """The TLS handshake over W's socket, trusting our CA."""
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca-cert.pem"))
    w.s = ctx.wrap_socket(w.s, server_hostname="127.0.0.1")


def closed(w, timeout=10):
    try:
        netserver.wait_eof(w.s, timeout)
        return True
    except AssertionError:
        return False


# ------------------------------------------------------- pre-shared key
srv = netserver.NetServer(image, ["--tls", "require", "--tls-psk", psk])
ok, r = nbdinfo_size(psk_uri(srv))
check("psk: nbdinfo reads the size over TLS", ok, r.stderr)
r = run("nbdinfo", "--size", srv.uri)
check("psk require: a plaintext client is refused, libnbd says TLS",
      r.returncode != 0 and "TLS" in r.stderr, r.stderr)
ok, r = nbdinfo_size(psk_uri(srv, wrong_psk))
check("psk: a client with the wrong key is refused", not ok and r.returncode != 0)
check("psk: the failed authentication is logged with the client's address",
      "TLS handshake with 127.0.0.1 failed" in srv.log_text(), srv.log_text()[-500:])
nbdcopy_round_trip(psk_uri(srv), "psk")
qemu_round_trip(srv, f"tls-creds-psk,id=tls0,endpoint=client,dir={pskdir},username=alice",
                "psk")

# Under require, before STARTTLS: every option but ABORT is refused with
# TLS_REQD, STARTTLS must have no payload, EXPORT_NAME closes.
w = nw.Wire(srv.addr)
harness.on_exit(w.close)
w.greeting()
replies = []
for opt, data in ((OPT_LIST, b""), (OPT_STRUCTURED_REPLY, b""),
                  (nw.OPT_GO, struct.pack(">IH", 0, 0)), (99, b"xyz")):
    w.option(opt, data)
    replies.append(w.reply()[:2])
check("require: LIST, STRUCTURED_REPLY, GO, unknown get TLS_REQD before STARTTLS",
      replies == [(o, ERR_TLS_REQD) for o in (OPT_LIST, OPT_STRUCTURED_REPLY, nw.OPT_GO, 99)],
      replies)
w.option(OPT_STARTTLS, b"x")
check("STARTTLS with a payload: ERR_INVALID", w.reply()[:2] == (OPT_STARTTLS, ERR_INVALID))
w.option(OPT_EXPORT_NAME, b"")
check("require: EXPORT_NAME before STARTTLS closes the connection", closed(w))
w = nw.Wire(srv.addr)
harness.on_exit(w.close)
w.greeting()
w.option(OPT_ABORT)
check("require: ABORT before STARTTLS is acknowledged",
      w.reply()[:2] == (OPT_ABORT, REP_ACK) and closed(w))
srv.stop()

# --tls on: plaintext and TLS clients alike.
srv = netserver.NetServer(image, ["--tls", "on", "--tls-psk", psk])
ok, r = nbdinfo_size(srv.uri)
check("psk on: a plaintext client is served", ok, r.stderr)
ok, r = nbdinfo_size(psk_uri(srv))
check("psk on: a TLS client is served", ok, r.stderr)
srv.stop()

# --tls off (the default): STARTTLS is not supported.
srv = netserver.NetServer(image, ["--tls", "off"])
w = nw.Wire(srv.addr)
harness.on_exit(w.close)
w.greeting()
check("tls off: STARTTLS gets ERR_UNSUP", start_tls(w) == ERR_UNSUP)
w.close()
srv.stop()

# --------------------------------------------------------- certificates
srv = netserver.NetServer(image, ["--tls", "require", "--tls-certificates", certs])
ok, r = nbdinfo_size(cert_uri(srv, trusting))
check("x509: nbdinfo reads the size over TLS", ok, r.stderr)
ok, r = nbdinfo_size(cert_uri(srv, untrusting))
check("x509: a client that does not trust the CA is refused", not ok and r.returncode != 0)
r = run("nbdinfo", "--size", srv.uri)
check("x509 require: a plaintext client is refused, libnbd says TLS",
      r.returncode != 0 and "TLS" in r.stderr, r.stderr)
nbdcopy_round_trip(cert_uri(srv, trusting), "x509")
qemu_round_trip(srv, f"tls-creds-x509,id=tls0,endpoint=client,dir={trusting}", "x509")
# fio's nbd engine cannot pass tls-certificates= or tls-psk-file= (libnbd
# refuses local files in a URI unless the program allows them, and fio
# 3.33 does not): it finds the CA where libnbd looks by default.
if shutil.which("fio"):
    home = os.path.join(work, "home")
    os.makedirs(os.path.join(home, ".pki", "libnbd"))
    shutil.copy(os.path.join(certs, "ca-cert.pem"), os.path.join(home, ".pki", "libnbd"))
    r = run("fio", "--name=tls", "--ioengine=nbd",
            f"--uri=nbds://{srv.addr[0]}:{srv.addr[1]}/", "--rw=randwrite",
            "--bs=4k", "--size=4m", "--iodepth=8", "--verify=crc32c",
            "--verify_fatal=1", "--verify_state_save=0", f"--directory={work}",
            env=dict(os.environ, HOME=home))
    check("x509: fio's nbd engine writes and verifies",
          r.returncode == 0 and "err= 0" in r.stdout, r.stdout[-500:] + r.stderr[-500:])
else:
    print("skip fio: not installed")

# Over TLS: options agreed in plaintext are forgotten (none can be here,
# under require), a second STARTTLS is invalid, and GO and a READ work.
w = nw.Wire(srv.addr)
harness.on_exit(w.close)
w.greeting()
check("x509: STARTTLS is acknowledged", start_tls(w) == REP_ACK)
wrap(w)
check("over TLS: a second STARTTLS gets ERR_INVALID", start_tls(w) == ERR_INVALID)
w.option(OPT_LIST)
check("over TLS: LIST is answered", [w.reply()[1], w.reply()[1]] == [REP_SERVER, REP_ACK])
check("over TLS: GO enters transmission", w.go()[-1][1] == REP_ACK)
w.request(CMD_READ, offset=4096, length=65536, cookie=7)
error, cookie, data = w.simple_reply(65536)
with open(image, "rb") as f:
    f.seek(4096)
    want = f.read(65536)
check("over TLS: a READ returns the image's bytes", (error, cookie, data) == (0, 7, want))

# Pipelined past the connection's 128 request slots, so reading pauses
# and resumes with TLS records still buffered: every request answered.
# All is sent before any reply is read (one thread: Python's TLS socket
# must not be used by two at once); the replies fit in the socket
# buffers meanwhile, and the requests the server has not read wait in
# them.
N, BS = 1000, 4096
blocks = [harness.pattern(BS, 100 + i) for i in range(N)]
w.s.sendall(b"".join(
    struct.pack(">IHHQQI", nw.REQ_MAGIC, 0, CMD_WRITE, 1000 + i, i * BS, BS) + blocks[i]
    for i in range(N)))
acks = [w.simple_reply() for _ in range(N)]
check(f"over TLS: {N} pipelined 4 KiB WRITEs all acknowledged",
      sorted(c for e, c, _ in acks if e == 0) == list(range(1000, 1000 + N)))
w.s.sendall(b"".join(
    struct.pack(">IHHQQI", nw.REQ_MAGIC, 0, CMD_READ, 5000 + i, i * BS, BS)
    for i in range(N)))
got = {}
for _ in range(N):
    error, cookie, data = w.simple_reply(BS)
    got[cookie] = (error, data)
check(f"over TLS: {N} pipelined 4 KiB READs return what was written",
      all(got.get(5000 + i) == (0, blocks[i]) for i in range(N)))
w.close()


def in_one_record(srv, option, option_data, requests):
    """STARTTLS, then OPTION and REQUESTS sent in one TLS record (one
    write under 16 KiB), as a client pipelining its first requests does:
    the server decodes them with the option, and must not wait for the
    socket to say they are there.  Returns the wire, the option answered."""
    w = nw.Wire(srv.addr, timeout=5)
    harness.on_exit(w.close)
    w.greeting()
    start_tls(w)
    wrap(w)
    w.s.sendall(struct.pack(">QII", nw.IHAVEOPT, option, len(option_data)) +
                option_data + requests)
    return w


def read_request(cookie, offset, length):
    return struct.pack(">IHHQQI", nw.REQ_MAGIC, 0, CMD_READ, cookie, offset, length)


def answered(w, length):
    """The READ reply's (error, cookie, data), or the exception."""
    try:
        return w.simple_reply(length)
    except (OSError, EOFError) as e:
        return repr(e)


with open(image, "rb") as f:
    f.seek(8192)
    want = f.read(4096)
go_data = struct.pack(">IH", 0, 0)
w = in_one_record(srv, nw.OPT_GO, go_data, read_request(21, 8192, 4096))
while w.reply()[1] == nw.REP_INFO:
    pass
check("TLS: a READ in the same record as GO is answered at once",
      answered(w, 4096) == (0, 21, want))
w.close()
w = in_one_record(srv, nw.OPT_EXPORT_NAME, b"", read_request(22, 8192, 4096))
w.recv_exact(10)  # size and flags (NO_ZEROES was agreed)
check("TLS: a READ in the same record as EXPORT_NAME is answered at once",
      answered(w, 4096) == (0, 22, want))
w.close()
w = in_one_record(srv, nw.OPT_GO, go_data,
                  struct.pack(">IHHQQI", nw.REQ_MAGIC, 0, nw.CMD_DISC, 23, 0, 0))
while w.reply()[1] == nw.REP_INFO:
    pass
try:
    gone = closed(w, 5)
except OSError:                 # TLS without close_notify: closed as well
    gone = True
check("TLS: a DISC in the same record as GO closes the connection", gone)
w.close()
srv.stop()

# --tls on: what was negotiated in plaintext is forgotten when TLS starts.
srv = netserver.NetServer(image, ["--tls", "on", "--tls-certificates", certs])
check("--tls on: a warning at start that plaintext clients are served",
      "--tls on serves plaintext clients too" in srv.log_text(), srv.log_text())
w = nw.Wire(srv.addr)
harness.on_exit(w.close)
w.greeting()
w.option(OPT_STRUCTURED_REPLY)
w.reply()
start_tls(w)
wrap(w)
w.go()
w.request(CMD_READ, offset=0, length=512, cookie=9)
magic = struct.unpack(">I", w.recv_exact(4))[0]
check("structured replies agreed before STARTTLS are forgotten after it",
      magic == nw.REPLY_MAGIC, hex(magic))
w.close()
srv.stop()

# --tls-verify-peer: a client certificate signed by the CA is required.
srv = netserver.NetServer(image, ["--tls", "require", "--tls-certificates", certs,
                                  "--tls-verify-peer"])
ok, r = nbdinfo_size(cert_uri(srv, trusting))
check("verify-peer: a client without a certificate is refused", not ok and r.returncode != 0)
check("verify-peer: the refusal is logged with the client's address",
      "TLS handshake with 127.0.0.1 failed" in srv.log_text(), srv.log_text()[-500:])
ok, r = nbdinfo_size(cert_uri(srv, with_cert))
check("verify-peer: a client with a certificate the CA signed is served", ok, r.stderr)
srv.stop()

# ------------------------------------------- stalls and EOF mid-handshake
# The ClientHello a TLS client sends, captured without a server.
ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca-cert.pem"))
incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
try:
    tls.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = outgoing.read()
assert len(hello) > 100, len(hello)

srv = netserver.NetServer(image, ["--tls", "require", "--tls-certificates", certs,
                                  "--handshake-timeout", str(TIMEOUT)])
t0 = time.monotonic()
stalled = []
for prefix in (0, 10):
    w = nw.Wire(srv.addr, timeout=TIMEOUT + LATE + 5)
    harness.on_exit(w.close)
    w.greeting()
    start_tls(w)
    w.s.sendall(hello[:prefix])
    stalled.append(w)
ok, r = nbdinfo_size(cert_uri(srv, trusting))
check("while two clients stall mid-handshake, another is served", ok, r.stderr)
for i, w in enumerate(stalled):
    ok = closed(w, TIMEOUT + LATE + 2)
    took = time.monotonic() - t0
    check(f"STARTTLS then a stall ({'no' if i == 0 else 'part of a'} ClientHello) "
          f"is dropped at the handshake deadline", ok and TIMEOUT - 0.2 <= took <= TIMEOUT + LATE,
          f"{took:.2f} s")
    w.close()
srv.stop()

srv = netserver.NetServer(image, ["--tls", "require", "--tls-certificates", certs])
# The baseline once a client has come and gone, and steady: the server
# (under valgrind, valgrind too) opens some descriptors lazily.
nbdinfo_size(cert_uri(srv, trusting))
fds, threads = None, None
while (fds, threads) != (srv.fds(), srv.threads()):
    fds, threads = srv.fds(), srv.threads()
    time.sleep(1)
# Every byte; under valgrind (slow connections) every 16th and the ends.
step = 16 if harness.VALGRIND else 1
lengths = sorted(set(range(0, len(hello) + 1, step)) | {1, len(hello) - 1, len(hello)})
hung = []
for n in lengths:
    w = nw.Wire(srv.addr)
    try:
        w.greeting()
        assert start_tls(w) == REP_ACK
        w.s.sendall(hello[:n])
        w.s.shutdown(socket.SHUT_WR)
        if not closed(w, 10):
            hung.append(n)
    finally:
        w.close()
check(f"EOF at each of {len(lengths)} offsets of a {len(hello)}-byte ClientHello: "
      f"the server closes", not hung and srv.alive(), hung[:10])
try:
    srv.settle(fds, threads)
    check("after those: descriptors and threads back to their baseline", True)
except AssertionError as e:
    check("after those: descriptors and threads back to their baseline", False, str(e))
ok, r = nbdinfo_size(cert_uri(srv, trusting))
check("after those: a TLS client is served", ok, r.stderr)
srv.stop()

# ------------------------------------------------------ startup refusals
def broken(name, **files):
    """A certificates directory like ours, with FILES replaced (None:
    removed)."""
    d = os.path.join(work, name)
    shutil.copytree(certs, d)
    for f, content in files.items():
        path = os.path.join(d, f.replace("_", "-") + ".pem")
        if content is None:
            os.unlink(path)
        else:
            with open(path, "w") as out:
                out.write(content)
    return d


# An expired server certificate: the server runs (a client may not check
# dates) but says so at start.
expired = broken("expired")
subprocess.run(["openssl", "req", "-new", "-key", "server-key.pem", "-subj", "/CN=127.0.0.1",
                "-out", "server.csr"], cwd=expired, check=True, capture_output=True)
subprocess.run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem",
                "-CAkey", "ca-key.pem", "-CAcreateserial", "-days", "-1",
                "-out", "server-cert.pem"], cwd=expired, check=True, capture_output=True)
srv = netserver.NetServer(image, ["--tls", "require", "--tls-certificates", expired])
check("an expired server certificate: a warning at start naming it",
      "server-cert.pem: expired on" in srv.log_text(), srv.log_text())
srv.stop()

bad_psk = os.path.join(work, "bad.psk")
with open(bad_psk, "w") as f:
    f.write("alice:not-hex\n")
with open(os.path.join(other, "server-key.pem")) as f:
    other_key = f.read()
sock = os.path.join(work, "refused.sock")
for args, expect in [
        (["--tls", "on"], "--tls=on needs --tls-psk FILE or --tls-certificates DIR"),
        (["--tls", "maybe", "--tls-psk", psk], "--tls=maybe"),
        (["--tls-psk", psk], "need --tls on or require"),
        (["--tls", "on", "--tls-psk", psk, "--tls-certificates", certs], "exclude each other"),
        (["--tls", "on", "--tls-psk", os.path.join(work, "none.psk")],
         "none.psk: No such file"),
        (["--tls", "on", "--tls-psk", bad_psk], "bad.psk: line 1"),
        (["--tls", "on", "--tls-certificates", broken("nocert", server_cert=None)],
         "nocert/server-cert.pem: No such file"),
        (["--tls", "on", "--tls-certificates", broken("nokey", server_key=None)],
         "nokey/server-key.pem: No such file"),
        (["--tls", "on", "--tls-certificates", broken("badcert", server_cert="junk\n")],
         "badcert/server-cert.pem: not a PEM certificate"),
        (["--tls", "on", "--tls-certificates", broken("badkey", server_key="junk\n")],
         "badkey/server-key.pem: not a PEM private key"),
        (["--tls", "on", "--tls-certificates", broken("mismatch", server_key=other_key)],
         "do not match"),
        (["--tls", "on", "--tls-certificates", broken("noca", ca_cert=None),
          "--tls-verify-peer"], "noca/ca-cert.pem: No such file")]:
    r = run(harness.SERVER_BIN, "--listen", f"unix:{sock}", *args, image)
    lines = r.stderr.strip().splitlines()
    check(f"refused at startup: {expect}",
          r.returncode != 0 and len(lines) == 1 and expect in lines[0]
          and not os.path.exists(sock), r.stderr)

# TLS is a module the server loads for --tls only: without it, one line
# naming it; without --tls the server never needs it.
no_module = dict(os.environ, MLOOP_SERVER_TLS_MODULE=os.path.join(work, "none.so"))
r = run(harness.SERVER_BIN, "--listen", f"unix:{sock}", "--tls", "on", "--tls-psk", psk,
        image, env=no_module)
lines = r.stderr.strip().splitlines()
check("refused at startup: the TLS module missing, named",
      r.returncode != 0 and len(lines) == 1 and "none.so, which did not load" in lines[0]
      and not os.path.exists(sock), r.stderr)
srv = netserver.NetServer(image)
with open(f"/proc/{srv.pid}/maps") as f:
    maps = f.read()
check("without --tls neither the TLS module nor GnuTLS is loaded",
      "mloop-server-tls" not in maps and "libgnutls" not in maps)
srv.stop()

harness.exit_if_failed()
