#!/usr/bin/python3
"""mloopd --serve=in-process serves every native device inside itself:
no process per device, the same socket and handshake as mloop-server.

On the host, with no kernel NBD client: mloopd keeps DEVICES directories
under its own runtime directory, asked over its control socket as mloop
asks it.  Each keep is answered with mloopd's own pid and in-process=1,
and no child process is started; a keep asking for connections (as
`mloop attach` does) brings them, in transmission with no handshake,
and the export's numbers; more than one answer can bring are refused; each export reads back its image
through libnbd, and a write through one reads back through another
connection.  A planned restart (what `mloop resize` asks) makes a grown
image's new size what the next handshake announces.  A drop removes the
socket.  mloopd killed with SIGKILL takes its servers with it; the next
mloopd, started without --serve, serves every recorded device inside
itself again (the record says where), and what was written before the
kill reads back.  A bad --serve is refused in one line.

Root (mloopd answers root only).  About 2 s (standard tier, client
suite)."""
import os
import signal
import socket
import struct
import subprocess

import nbd

import harness
import mloopd_control
from harness import check

MLOOPD = os.environ["MLOOPD_BIN"]
DEVICES = 6
SIZE = 4 << 20

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
env = dict(os.environ, MLOOP_RUNTIME_DIR=run)
log = os.path.join(d, "mloopd.log")


def start(*options):
    p = mloopd_control.start([MLOOPD, *options], env, log, control)
    harness.kill_at_exit(p)
    return p


def ask(**fields):
    return mloopd_control.ask(control, **fields)


def device_dir(i):
    return os.path.join(run, f"dev-{i}")


def export(i):
    h = nbd.NBD()
    h.connect_unix(os.path.join(device_dir(i), "sock"))
    return h


def reads_back(i, data):
    try:
        h = export(i)
        ok = h.pread(SIZE, 0) == data
        h.shutdown()
        return ok
    except nbd.Error:
        return False


def keep_with_connections(directory, image, n):
    """op=keep asking for N connections: the answer's fields and the
    descriptors it brought."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(60)
        s.connect(control)
        s.send(b"".join(f"{k}={v}".encode() + b"\0" for k, v in
                        dict(op="keep", dir=directory, server="native", image=image,
                             threads=1, connections=n).items()))
        data, fds, _, _ = socket.recv_fds(s, 70000, 32)
    return dict(f.decode().split("=", 1) for f in data.split(b"\0") if f), fds


def nbd_read(fd, offset, length, handle):
    """One NBD_CMD_READ on a connection in transmission already: the
    data, or an AssertionError naming the reply's error."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        sock.settimeout(10)
        sock.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, handle, offset, length))
        reply = b""
        while len(reply) < 16 + length:
            chunk = sock.recv(16 + length - len(reply))
            assert chunk, "the connection closed before the reply"
            reply += chunk
        magic, error, got = struct.unpack(">IIQ", reply[:16])
        assert magic == 0x67446698 and error == 0 and got == handle, (magic, error, got)
        return reply[16:]
    finally:
        sock.close()


def children(pid):
    return subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                          text=True).stdout.split()


bad = subprocess.run([MLOOPD, "--serve=elsewhere"], env=env, capture_output=True,
                     text=True, timeout=30)
check("a bad --serve is refused in one line",
      bad.returncode != 0 and "--serve=elsewhere" in bad.stderr and
      bad.stderr.count("\n") == 1, bad.stderr)

mloopd = start("--serve=in-process")
images, datas, attaches = [], [], []
for i in range(DEVICES):
    datas.append(harness.pattern(SIZE, 60 + i))
    images.append(harness.make_image(SIZE, datas[i]))
    attaches.append(mloopd_control.attaching(device_dir(i)))
    a = ask(op="keep", dir=device_dir(i), server="native", image=images[i],
            threads=1)
    check(f"device {i} kept inside mloopd",
          a.get("ok") == "1" and a.get("server-pid") == str(mloopd.pid) and
          a.get("in-process") == "1", a)
# As `mloop attach` asks: the keep's answer brings the connections the
# kernel is to have, in transmission already, and the export's numbers.
given_dir = os.path.join(run, "dev-given")
given_data = harness.pattern(SIZE, 77)
given_image = harness.make_image(SIZE, given_data)
attaches.append(mloopd_control.attaching(given_dir))
a, none = keep_with_connections(given_dir, given_image, 17)
check("refused: more connections than one answer can bring",
      "connections=17" in a.get("error", "") and not none, a)
a, given = keep_with_connections(given_dir, given_image, 3)
check("a keep asking for 3 connections brings 3, and the export's numbers",
      a.get("ok") == "1" and len(given) == 3 and a.get("connections") == "3" and
      a.get("size") == str(SIZE) and int(a.get("flags", 0)) & 1 and
      int(a.get("min-block", 0)) > 0, (a, given))
check("each connection given reads the image with no handshake",
      all(nbd_read(fd, 4096 * i, 4096, 100 + i) == given_data[4096 * i:4096 * (i + 1)]
          for i, fd in enumerate(given)))
for fd in given:
    os.close(fd)
check("given dropped", ask(op="drop", dir=given_dir).get("ok") == "1")

check("no process started for any device", children(mloopd.pid) == [],
      children(mloopd.pid))
check("no pid file: no server process",
      all(mloopd_control.server_pid(device_dir(i)) == 0 for i in range(DEVICES)))
check("every export reads back its image",
      all(reads_back(i, datas[i]) for i in range(DEVICES)))

# A write through one connection reads back through another, and is in
# the image.
h = export(2)
h.pwrite(b"\xa5" * 4096, 8192, nbd.CMD_FLAG_FUA)
h.shutdown()
datas[2] = datas[2][:8192] + b"\xa5" * 4096 + datas[2][8192 + 4096:]
check("a write reads back through a new connection", reads_back(2, datas[2]))
with open(images[2], "rb") as f:
    check("a FUA write is in the image", f.read() == datas[2])

# `mloop resize`'s planned restart: the engine reads the size again.
os.truncate(images[3], 2 * SIZE)
a = ask(op="restart", dir=device_dir(3))
check("restart answered", a.get("ok") == "1", a)
mloopd_control.wait_for("device 3's new size",
                        lambda: export(3).get_size() == 2 * SIZE, timeout=10)
os.truncate(images[3], SIZE)
ask(op="restart", dir=device_dir(3))
mloopd_control.wait_for("device 3's size back",
                        lambda: export(3).get_size() == SIZE, timeout=10)

a = ask(op="drop", dir=device_dir(5))
check("drop answered", a.get("ok") == "1", a)
check("a dropped device's socket is gone",
      not os.path.exists(os.path.join(device_dir(5), "sock")))
kept = DEVICES - 1

# SIGKILL: its servers end with it; the next one, told nothing, serves
# every recorded device inside itself again.
mloopd.send_signal(signal.SIGKILL)
mloopd.wait()
check("with mloopd killed, its servers are gone",
      not any(reads_back(i, datas[i]) for i in range(kept)))
mloopd = start()
check("the next mloopd keeps every recorded device",
      mloopd_control.kept(control) == {device_dir(i) for i in range(kept)},
      mloopd_control.kept(control))
mloopd_control.wait_for("every device served again",
                        lambda: all(reads_back(i, datas[i]) for i in range(kept)),
                        timeout=20)
check("served inside the next mloopd, the record's way: no process",
      children(mloopd.pid) == [], children(mloopd.pid))
for i in range(kept):
    check(f"device {i} dropped", ask(op="drop", dir=device_dir(i)).get("ok") == "1")
harness.terminate(mloopd)
harness.exit_if_failed()
