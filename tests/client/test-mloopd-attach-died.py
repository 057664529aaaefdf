#!/usr/bin/python3
"""mloopd drops a device whose attach died before the device was made.

`mloop attach` holds its device directory's lock from its claim until
it has written the device's state (device_state.h); mloopd's keep comes
in between.  An attach that dies there (killed, crashed, or its mloopd
killed and restarted meanwhile) leaves a kept device that does not
exist: no state, and nobody holding the lock.  mloopd must drop it and
stop its server, whether the attach died after the keep was answered,
while its server was starting, or while no mloopd ran; must refuse a
keep no attach asks; and must keep a device whose attach finished, or
is still under way, across its own restart.

Here the test process plays the attach: it makes each directory, holds
its lock (mloopd_control.attaching), asks for the keep, and "dies" by
closing the lock, or finishes by writing a state file first.  A stand-in
for mloop-server records each spawn and, for one device, waits while a
file says so before it becomes the server.

Root (mloopd answers root only).  About 8 s (client suite)."""
import os
import signal
import socket
import time

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SERVER = os.environ["MLOOP_SERVER_BIN"]
SIZE = 1 << 20
NOTICE_S = 6    # mloopd's check (every 2 s) and a loaded machine

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
hold = os.path.join(d, "hold")
spawned = os.path.join(d, "spawned")
stand_in = os.path.join(d, "server")
mloopd_control.stand_in_server(stand_in, SERVER, f"""\
echo "$*" >> {spawned}
case "$*" in
*dev-slow*) while [ -e {hold} ]; do sleep 0.05; done ;;
esac
""")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=stand_in)
image = harness.make_image(SIZE)
devices = {}


def cleanup():
    try:
        os.unlink(hold)
    except FileNotFoundError:
        pass
    for path in devices:
        mloopd_control.kill(mloopd_control.processes_naming(
            os.path.join(path, "sock")))


harness.on_exit(cleanup)


def start():
    p = mloopd_control.start([MLOOPD], env, os.path.join(d, "mloopd.log"),
                             control)
    harness.kill_at_exit(p)
    return p


def attach(name):
    """An attach in progress of a new device NAME: its directory and the
    lock it holds."""
    path = os.path.join(run, name)
    devices[path] = mloopd_control.attaching(path)
    return path


def die(path):
    """The attach of PATH ends without writing its state."""
    os.close(devices[path])


def finish(path):
    """The attach of PATH writes its state and ends, as `mloop attach`
    does (a device the kernel does not have: nothing asks it here)."""
    with open(os.path.join(path, "state"), "w") as f:
        f.write(f"[device]\ntransport=nbd\nindex=4000\nfile={image}\n"
                f"size={SIZE}\nconnections=1\ntimeout=30\ndead_timeout=30\n"
                "server=native\n")
    os.close(devices[path])


def keep(path):
    a = mloopd_control.ask(control, op="keep", dir=path, server="native",
                           image=image, threads=1)
    check(f"{os.path.basename(path)} is kept", a.get("ok") == "1", a)


def spawns(path):
    try:
        with open(spawned) as f:
            return sum(os.path.join(path, "sock") in line for line in f)
    except FileNotFoundError:
        return 0


def servers(path):
    return mloopd_control.processes_naming(os.path.join(path, "sock"))


def dropped(path, what):
    """Checks that mloopd lets go of PATH within NOTICE_S: not kept, its
    record gone, no server of it left."""
    try:
        wait_for(what, lambda: path not in mloopd_control.kept(control)
                 and not servers(path), timeout=NOTICE_S)
        ok = True
    except AssertionError:
        ok = False
    check(what, ok, f"kept: {path in mloopd_control.kept(control)}, "
          f"servers: {servers(path)}")
    check(f"{os.path.basename(path)}'s record is gone",
          not os.path.exists(os.path.join(path, "keep")))


# --- An attach that dies once its keep is answered -------------------
p = start()
gone, made, going = attach("dev-gone"), attach("dev-made"), attach("dev-going")
for path in (gone, made, going):
    keep(path)
lone = os.path.join(run, "dev-lone")
os.mkdir(lone, 0o700)
a = mloopd_control.ask(control, op="keep", dir=lone, server="native",
                       image=image, threads=1)
check("a keep no attach asks (no state, its lock free) is refused",
      "no attach holds its lock" in a.get("error", ""), a)
check("and starts no server", spawns(lone) == 0 and not servers(lone))
devices[lone] = None
die(gone)
finish(made)
dropped(gone, "a device whose attach died after its keep is dropped, its "
        "server stopped")
time.sleep(2.5)     # one more of mloopd's checks
check("a device whose attach finished stays kept",
      made in mloopd_control.kept(control) and servers(made))
check("a device whose attach is under way stays kept",
      going in mloopd_control.kept(control) and servers(going))

# --- An attach that dies while its server starts ---------------------
slow = attach("dev-slow")
open(hold, "w").close()
with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
    s.connect(control)
    s.send(b"".join(f"{k}={v}".encode() + b"\0" for k, v in dict(
        op="keep", dir=slow, server="native", image=image).items()))
    wait_for("the slow server spawned", lambda: spawns(slow) == 1)
die(slow)           # and its socket with it, unanswered
try:
    wait_for("the slow device dropped while its server starts",
             lambda: slow not in mloopd_control.kept(control),
             timeout=NOTICE_S)
    ok = True
except AssertionError:
    ok = False
check("a device whose attach died while its server started is dropped",
      ok)
os.unlink(hold)     # the server it was starting listens now
dropped(slow, "the server a dropped start spawned is stopped once it "
        "listens")

# --- An attach that dies while no mloopd runs ------------------------
p.send_signal(signal.SIGKILL)
p.wait()
die(going)
before = spawns(going)
check("(the server a killed mloopd kept serves on)", servers(going))
p = start()
dropped(going, "the next mloopd drops a device whose attach died while no "
        "mloopd ran, and stops its server")
check("and starts no server for it", spawns(going) == before,
      f"{spawns(going) - before} spawned")

# --- An attach under way across a restart ----------------------------
under_way = attach("dev-under-way")
keep(under_way)
p.send_signal(signal.SIGKILL)
p.wait()
p = start()
time.sleep(2.5)     # one more of mloopd's checks
check("the next mloopd keeps a device whose attach is under way",
      under_way in mloopd_control.kept(control) and servers(under_way))
check("and one whose attach finished", made in mloopd_control.kept(control)
      and servers(made))
die(under_way)
dropped(under_way, "the device whose attach then dies is dropped")

a = mloopd_control.ask(control, op="drop", dir=made)
check("the finished device is dropped on request", a.get("ok") == "1", a)
p.terminate()
check("mloopd exits 0", p.wait(timeout=30) == 0)
harness.exit_if_failed()
