#!/usr/bin/python3
"""mloopd against callers and restarts it does not expect.

Each part runs its own mloopd on a runtime directory of its own (on the
host, no kernel NBD client), so that one failure does not hide the next:

- one directory named twice, "RUN/dev" and "RUN//dev": the second keep
  must be refused as kept already (else two keepers, two servers, fight
  over one socket);
- a client that sends requests and never reads the answers must not
  stop mloopd answering anybody else (its answers pile up in the
  client's queue until mloopd's send blocks);
- a device whose overlay's path is not UTF-8, taken over by the next
  mloopd and then restarted, must still be served through its overlay
  (the keep record is read back with g_key_file_get_string, which
  refuses what is not UTF-8, so the overlay was silently dropped);
- a device whose server died while no mloopd ran: the next mloopd
  starts a new server, and must hand the device fresh connections to
  it as a restart does (seen here as connections on the new server;
  the kernel's reconfigure then fails, there being no NBD device);
- a second mloopd started by hand on the same runtime directory must
  not take over devices the first still keeps;
- mloopd stopped (SIGTERM) while a planned restart's next server is
  still starting lets go of its keepers and then runs its loop on: a
  drop from a client connected before must not reach the keeper it
  freed (a double free: mloopd aborts, and stops the server it had
  just left serving).

Root (mloopd answers root only).  About 18 s."""
import os
import signal
import socket
import struct
import subprocess
import time

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SIZE = 1 << 20

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

servers_seen = set()
harness.on_exit(lambda: mloopd_control.kill(servers_seen))


class Service:
    def __init__(self, name):
        self.d = harness.tmpdir()
        self.run = os.path.join(self.d, "run")
        self.control = os.path.join(self.run, "mloopd.sock")
        self.env = dict(os.environ, MLOOP_RUNTIME_DIR=self.run)
        os.makedirs(self.run, 0o700, exist_ok=True)
        self.name = name
        self.attaches = []
        # Run after every mloopd of this service is killed (on_exit runs
        # the most recent first): a server one spawned just before its
        # SIGKILL is named by no pid file yet, only by its command line.
        harness.on_exit(lambda: mloopd_control.kill(
            mloopd_control.processes_naming(self.run)))

    def start(self):
        log = open(os.path.join(self.d, "mloopd.log"), "a")
        p = subprocess.Popen([MLOOPD], env=self.env, stdout=log, stderr=log)
        harness.kill_at_exit(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and p.poll() is None:
            try:
                self.ask(op="list")
                return p
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"{self.name}: mloopd did not listen")

    def ask(self, timeout=10, **fields):
        return ask_raw(self.control, timeout, {k.replace("_", "-"):
                                               v for k, v in fields.items()})

    def device(self, name):
        """A device's directory, its attach under way for the test's
        life."""
        path = os.path.join(self.run, name)
        self.attaches.append(mloopd_control.attaching(path))
        return path


def encode(v):
    return v if isinstance(v, bytes) else str(v).encode()


def ask_raw(control, timeout, fields):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(control)
        s.send(b"".join(k.encode() + b"=" + encode(v) + b"\0"
                        for k, v in fields.items()))
        data = s.recv(70000)
    return dict(f.decode(errors="replace").split("=", 1)
                for f in data.split(b"\0") if f)


def server_of(directory):
    pid = mloopd_control.server_pid(os.fsdecode(directory))
    if pid:
        servers_seen.add(pid)
    return pid


def stop(p, sig=signal.SIGKILL):
    p.send_signal(sig)
    p.wait(timeout=100)


# --- One directory, two spellings ------------------------------------
svc = Service("two spellings")
p = svc.start()
dev = svc.device("dev-twice")
image = harness.make_image(SIZE)
a = svc.ask(op="keep", dir=dev, server="native", image=image)
check("a device is kept", a.get("ok") == "1", a)
server_of(dev)
twice = svc.run + "//dev-twice"
b = svc.ask(op="keep", dir=twice, server="native", image=image)
server_of(dev)
check("the same directory spelled RUN//NAME is refused as kept already",
      "error" in b, b)
stop(p)

# --- A client that never reads its answers ---------------------------
svc = Service("non-reading client")
p = svc.start()
hog = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
hog.connect(svc.control)
hog.setblocking(False)
sent = 0
deadline = time.monotonic() + 5
dropped = False
while time.monotonic() < deadline and sent < 20000:
    try:
        hog.send(b"op=list\0")
        sent += 1
    except BlockingIOError:
        time.sleep(0.01)
        try:
            hog.send(b"op=list\0")
            sent += 1
        except BlockingIOError:
            break
        except (ConnectionResetError, BrokenPipeError):
            dropped = True      # mloopd dropped it: what it may do
            break
    except (ConnectionResetError, BrokenPipeError):
        dropped = True
        break
try:
    other = svc.ask(timeout=3, op="list")
    answered = other.get("ok") == "1"
except OSError as e:
    answered = False
    other = e
check(f"another client is answered while one ({sent} requests sent"
      f"{', then dropped' if dropped else ''}) never reads its answers",
      answered, other)
hog.close()
stop(p)

# --- An overlay whose path is not UTF-8, across a takeover ------------
svc = Service("non-UTF-8 overlay")
p = svc.start()
dev = svc.device("dev-overlay")
image = harness.make_image(SIZE)
overlay_dir = os.fsencode(svc.d) + b"/caf\xe9"
os.makedirs(overlay_dir, exist_ok=True)
overlay = overlay_dir + b"/overlay"
a = svc.ask(op="keep", dir=dev, server="native", image=image, overlay=overlay)
check("a device with an overlay whose path is not UTF-8 is kept",
      a.get("ok") == "1", a)
first = server_of(dev)
stop(p)                                 # SIGKILL: the next one takes over
p = svc.start()
check("the next mloopd takes the device over",
      dev in mloopd_control.kept(svc.control))
os.kill(first, signal.SIGKILL)
try:
    wait_for("the server restarted",
             lambda: server_of(dev) not in (0, first), timeout=15)
    with open(f"/proc/{server_of(dev)}/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
    check("the restarted server still serves through the overlay",
          b"--overlay=" + overlay in cmdline, cmdline)
except AssertionError as e:
    check("the restarted server still serves through the overlay", False, e)
stop(p)

# --- A server that died while no mloopd ran --------------------------
svc = Service("takeover reconnect")
p = svc.start()
dev = svc.device("dev-died")
image = harness.make_image(SIZE)
a = svc.ask(op="keep", dir=dev, server="native", image=image)
check("a device is kept", a.get("ok") == "1", a)
first = server_of(dev)
# The device's state as `mloop attach` writes it, for a device the
# kernel does not have: a reconnect connects to the new server, then the
# reconfigure fails.
with open(os.path.join(dev, "state"), "w") as f:
    f.write(f"[device]\ntransport=nbd\nindex=4000\nfile={image}\n"
            f"size={SIZE}\nconnections=1\ntimeout=30\ndead_timeout=30\n"
            "server=native\n")
stats = os.path.join(dev, "stats")


def connections_total():
    try:
        with open(stats, "rb") as f:
            return struct.unpack("<QQQ", f.read(24))[2]
    except (OSError, struct.error):
        return 0


stop(p)
os.kill(first, signal.SIGKILL)
wait_for("the server gone", lambda: not os.path.exists(f"/proc/{first}"))
p = svc.start()
try:
    wait_for("a new server", lambda: server_of(dev) not in (0, first),
             timeout=15)
    wait_for("the device handed connections to the new server",
             lambda: connections_total() > 0, timeout=5)
    reconnected = True
except AssertionError:
    reconnected = False
check("the next mloopd hands the device connections to the new server it "
      "starts for it", reconnected,
      open(os.path.join(dev, "supervisor.log")).read()[-600:])
# The same death while mloopd runs: what a restart does, for comparison.
svc2 = Service("restart reconnect")
p2 = svc2.start()
dev2 = svc2.device("dev-restart")
a = svc2.ask(op="keep", dir=dev2, server="native", image=image + "")
first2 = server_of(dev2)
with open(os.path.join(dev2, "state"), "w") as f:
    f.write(f"[device]\ntransport=nbd\nindex=4001\nfile={image}\n"
            f"size={SIZE}\nconnections=1\ntimeout=30\ndead_timeout=30\n"
            "server=native\n")
os.kill(first2, signal.SIGKILL)
stats = os.path.join(dev2, "stats")
try:
    wait_for("a restart's reconnect", lambda: connections_total() > 0,
             timeout=10)
    control_ok = True
except AssertionError:
    control_ok = False
check("(control) a restart while mloopd runs connects to the new server",
      control_ok)
stop(p2)
server_of(dev2)
stop(p)
server_of(dev)

# --- Two mloopd on one runtime directory -----------------------------
svc = Service("two services")
p = svc.start()
dev = svc.device("dev-shared")
image = harness.make_image(SIZE)
a = svc.ask(op="keep", dir=dev, server="native", image=image)
check("a device is kept", a.get("ok") == "1", a)
server_of(dev)
# A second one, started by hand as an administrator might while the
# socket unit's runs: it binds the same path.
log = open(os.path.join(svc.d, "second.log"), "a")
second = subprocess.Popen([MLOOPD], env=svc.env, stdout=log, stderr=log)
harness.kill_at_exit(second)
time.sleep(1.5)
if second.poll() is None:
    try:
        both = dev in mloopd_control.kept(svc.control)
    except OSError:
        both = False
else:
    both = False
check("a second mloopd on the same runtime directory does not keep the "
      "devices the first still keeps", not both)
if second.poll() is None:
    stop(second)
stop(p)

# --- A drop while mloopd stops, a start under way --------------------
svc = Service("drop while stopping")
stand_in = os.path.join(svc.d, "slow-server")
mloopd_control.stand_in_server(stand_in, os.environ["MLOOP_SERVER_BIN"], f"""\
case "$*" in *slow*) sleep 4 ;; esac
""")
svc.env["MLOOP_SERVER_BIN"] = stand_in


def kill_started_in(directory):
    """The processes whose command line names DIRECTORY: the next server
    of a start the aborted mloopd left behind."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if os.fsencode(directory) in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


harness.on_exit(lambda d=svc.d: kill_started_in(d))
p = svc.start()
dev = svc.device("dev-stopping")
image = os.path.join(svc.d, "slow.img")
with open(image, "wb") as f:
    f.truncate(SIZE)
a = svc.ask(op="keep", dir=dev, server="native", image=image)
check("a device is kept", a.get("ok") == "1", a)
first = server_of(dev)
a = svc.ask(op="restart", dir=dev)     # its next server takes 4 s to listen
client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
client.connect(svc.control)
time.sleep(0.3)                         # accepted
p.send_signal(signal.SIGTERM)
time.sleep(0.5)                         # let go; the next server still starting
client.settimeout(10)
client.send(f"op=drop\0dir={dev}\0".encode())
try:
    client.recv(1000)
except OSError:
    pass
client.close()
status = p.wait(timeout=100)
check("mloopd stopped while a start is under way exits 0 after a drop",
      status == 0, f"exit status {status}")
server_of(dev)
harness.exit_if_failed()
