#!/usr/bin/python3
"""A server mloopd spawned but that did not listen yet when mloopd was
killed is stopped by the next mloopd.

Between a server's spawn and its pid file (written once it listens) the
device's directory names no server: the restart after a death clears
the last one's pid file first.  An mloopd killed in that window (SIGKILL
from systemd at its stop timeout, a crash) leaves the starting server
behind, reparented away.  The next mloopd finds the record and no
server, and starts another: two servers for one device, the first
unwatched, and whichever binds the socket first serves it (the other
fails; with an overlay or an RBD image they fight over its lock).  So
the next mloopd must stop a start left behind before it starts its own.

Here a stand-in for mloop-server records its pid and, when it finds a
token, waits until told before it becomes the server: the device is
kept, the token laid, its server killed, and mloopd SIGKILLed while the
restart's server waits.  The next mloopd must stop that process and
serve the device with a server of its own.

Root (mloopd answers root only).  About 1 s (client suite)."""
import os
import signal
import time

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SERVER = os.environ["MLOOP_SERVER_BIN"]
SIZE = 1 << 20

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
held = mloopd_control.HeldStart(d, SERVER)
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=held.path)
dev = os.path.join(run, "dev-orphan")
attach = mloopd_control.attaching(dev)    # under way for the test's life
sock = os.path.join(dev, "sock")
image = harness.make_image(SIZE)


def cleanup():
    held.release()
    mloopd_control.kill(mloopd_control.processes_naming(sock))


harness.on_exit(cleanup)


def start():
    p = mloopd_control.start([MLOOPD], env, os.path.join(d, "mloopd.log"),
                             control)
    harness.kill_at_exit(p)
    return p


p = start()
a = mloopd_control.ask(control, op="keep", dir=dev, server="native",
                       image=image, threads=1)
check("the device is kept", a.get("ok") == "1", a)
first = mloopd_control.server_pid(dev)
held.lay()
os.kill(first, signal.SIGKILL)
wait_for("the restart's server to be spawned, waiting",
         lambda: len(held.pids()) == 2 and held.holding())
orphan = held.pids()[1]
p.send_signal(signal.SIGKILL)
p.wait()
check("the start is left behind, not listening",
      mloopd_control.alive(orphan) and mloopd_control.server_pid(dev) == 0)

p = start()
try:
    wait_for("the start left behind to be stopped",
             lambda: not mloopd_control.alive(orphan), timeout=5)
    stopped = True
except AssertionError:
    stopped = False
check("the next mloopd stops the server a killed mloopd was starting",
      stopped, f"pid {orphan} still runs")
held.release()   # one left running becomes a server now
try:
    wait_for("the device's server",
             lambda: mloopd_control.alive(mloopd_control.server_pid(dev)))
except AssertionError:
    pass
time.sleep(0.5)         # one left running has bound the socket, or failed
serving = mloopd_control.server_pid(dev)
servers = mloopd_control.processes_naming(sock)
check("one server serves the device, named by its pid file",
      servers == [serving] and serving != orphan,
      f"pid file {serving}, processes {servers}")
check("the next mloopd keeps the device", dev in mloopd_control.kept(control))
a = mloopd_control.ask(control, op="drop", dir=dev)
check("the device is dropped", a.get("ok") == "1", a)
p.terminate()
check("mloopd exits 0", p.wait(timeout=30) == 0)
harness.exit_if_failed()
