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
spawned = os.path.join(d, "spawned")
token, held = os.path.join(d, "slow"), os.path.join(d, "slow.taken")
stand_in = os.path.join(d, "server")
mloopd_control.stand_in_server(stand_in, SERVER, f"""\
echo $$ >> {spawned}
if mv {token} {held} 2>/dev/null; then
  while [ -e {held} ]; do sleep 0.05; done
fi
""")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run, MLOOP_SERVER_BIN=stand_in)
dev = os.path.join(run, "dev-orphan")
attach = mloopd_control.attaching(dev)    # under way for the test's life
sock = os.path.join(dev, "sock")
image = harness.make_image(SIZE)


def cleanup():
    remove_file(held)
    mloopd_control.kill(mloopd_control.processes_naming(sock))


def remove_file(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


harness.on_exit(cleanup)


def start():
    p = mloopd_control.start([MLOOPD], env, os.path.join(d, "mloopd.log"),
                             control)
    harness.kill_at_exit(p)
    return p


def spawned_pids():
    try:
        with open(spawned) as f:
            return [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


p = start()
a = mloopd_control.ask(control, op="keep", dir=dev, server="native",
                       image=image, threads=1)
check("the device is kept", a.get("ok") == "1", a)
first = mloopd_control.server_pid(dev)
open(token, "w").close()
os.kill(first, signal.SIGKILL)
wait_for("the restart's server to be spawned, waiting",
         lambda: len(spawned_pids()) == 2 and os.path.exists(held))
orphan = spawned_pids()[1]
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
remove_file(held)   # one left running becomes a server now
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
