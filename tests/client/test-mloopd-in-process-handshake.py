#!/usr/bin/python3
"""A device served inside mloopd negotiates its connections one at a
time, each within 10 s in all (HOSTED_HANDSHAKE_TIMEOUT_S), and a drop
does not wait for a handshake under way.

On the host, with no kernel NBD client: mloopd --serve=in-process keeps
two devices.  On each, a client that never ends its handshake: it sends
an option (NBD_OPT_LIST) every 2 s, each well within the 10 s a read
may wait, and reads the replies.  The first device's client is cut off
within the 10 s and a second client, queued behind it, then negotiates
and reads the image.  The second device is dropped while its client is
mid-handshake: the drop is answered at once (it shuts that handshake
down rather than waiting for it), and so is a list asked meanwhile
(mloopd's main loop did not wait either).

Root (mloopd answers root only).  About 12 s (standard tier, client
suite)."""
import os
import socket
import struct
import threading
import time

import nbd

import harness
import mloopd_control
from harness import check

MLOOPD = os.environ["MLOOPD_BIN"]
SIZE = 1 << 20
HANDSHAKE_TIMEOUT = 10
OPTION_EVERY = 2
HOLD_FOR = 16         # the longest a client keeps trying

NBD_OPT_LIST = 3

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
env = dict(os.environ, MLOOP_RUNTIME_DIR=run)
log = os.path.join(d, "mloopd.log")
mloopd = mloopd_control.start([MLOOPD, "--serve=in-process"], env, log, control)
harness.kill_at_exit(mloopd)


def ask(**fields):
    return mloopd_control.ask(control, **fields)


def recv_exactly(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class Staller(threading.Thread):
    """A client of SOCK that never ends its handshake: how long it was
    kept (`held`, None while it is) and why it stopped (`how`)."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock_path = sock
        self.held = None
        self.how = None
        self.started_at = time.monotonic()
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock)
        self.s.settimeout(HOLD_FOR + 5)

    def run(self):
        s = self.s
        try:
            recv_exactly(s, 18)                         # the greeting
            s.sendall(struct.pack(">I", 3))             # fixed newstyle, no zeroes
            while time.monotonic() - self.started_at < HOLD_FOR:
                s.sendall(struct.pack(">QII", 0x49484156454F5054, NBD_OPT_LIST, 0))
                while True:                             # until the ACK
                    magic, option, rtype, length = struct.unpack(
                        ">QIII", recv_exactly(s, 20))
                    recv_exactly(s, length)
                    if rtype == 1 or rtype & 0x80000000:    # ACK, or an error
                        break
                time.sleep(OPTION_EVERY)
            self.how = "still negotiating when it gave up"
        except (OSError, ConnectionError, struct.error) as e:
            self.how = f"cut off ({e})"
        self.held = time.monotonic() - self.started_at
        s.close()


images = [harness.make_image(SIZE, harness.pattern(SIZE, 90 + i)) for i in range(2)]
dirs = [os.path.join(run, f"dev-{i}") for i in range(2)]
locks = [mloopd_control.attaching(dd) for dd in dirs]
for dd, image in zip(dirs, images):
    a = ask(op="keep", dir=dd, server="native", image=image, threads=1)
    check(f"{dd} kept inside mloopd", a.get("ok") == "1" and
          a.get("in-process") == "1", a)

stallers = [Staller(os.path.join(dd, "sock")) for dd in dirs]
for s in stallers:
    s.start()
time.sleep(1)

# A client queued behind the first device's staller.
served_after = []


def queued_client():
    t = time.monotonic()
    try:
        h = nbd.NBD()
        h.connect_unix(os.path.join(dirs[0], "sock"))
        ok = h.pread(4096, 0) == harness.pattern(SIZE, 90)[:4096]
        h.shutdown()
        served_after.append((ok, time.monotonic() - stallers[0].started_at))
    except nbd.Error as e:
        served_after.append((False, str(e)))


queued = threading.Thread(target=queued_client, daemon=True)
queued.start()

# A drop while the second device's handshake is under way.
listed = []
t = time.monotonic()
dropping = threading.Thread(target=lambda: listed.append(ask(op="drop", dir=dirs[1])),
                            daemon=True)
dropping.start()
time.sleep(0.3)
t_list = time.monotonic()
a = ask(op="list")
list_took = time.monotonic() - t_list
dropping.join(HOLD_FOR + 10)
drop_took = time.monotonic() - t
check("a list asked during the drop is answered at once",
      a.get("ok") == "1" and list_took < 2, (a, f"{list_took:.1f} s"))
check("the drop is answered at once, its handshake under way shut down",
      listed and listed[0].get("ok") == "1" and drop_took < 3,
      (listed, f"{drop_took:.1f} s", stallers[1].how))

stallers[0].join(HOLD_FOR + 10)
check(f"a handshake that never ends is cut off within {HANDSHAKE_TIMEOUT} s",
      stallers[0].held is not None and stallers[0].held < HANDSHAKE_TIMEOUT + 2,
      (stallers[0].held, stallers[0].how))
queued.join(30)
check("the client queued behind it is served then",
      served_after and served_after[0][0] is True and
      served_after[0][1] < HANDSHAKE_TIMEOUT + 4, served_after)

check("the first device dropped", ask(op="drop", dir=dirs[0]).get("ok") == "1")
for fd in locks:
    os.close(fd)
harness.terminate(mloopd)
harness.exit_if_failed()
