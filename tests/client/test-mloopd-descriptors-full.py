#!/usr/bin/python3
"""mloopd out of descriptors waits for them instead of spinning.

A connection mloopd cannot accept (EMFILE, ENFILE) stays in its
socket's queue, so the socket stays readable: a listener that only
returns to the loop wakes again at once, at full CPU for as long as its
descriptor table is full.  Here mloopd's descriptor limit is lowered
(prlimit) to a few above what it holds, clients connect until it is
full, and its CPU time over SPIN_S must stay small; it says so in its
log once; when the clients go, it answers again.

Root (mloopd answers root only).  About 3 s (client suite)."""
import os
import resource
import socket
import time

import harness
import mloopd_control
from harness import check
from mloopd_control import wait_for

MLOOPD = os.environ["MLOOPD_BIN"]
SPARE = 4           # descriptors mloopd may still open
CLIENTS = 20
SPIN_S = 2
MAX_CPU_S = 0.3     # a spin would use about SPIN_S

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
log_path = os.path.join(d, "mloopd.log")
env = dict(os.environ, MLOOP_RUNTIME_DIR=run)
p = mloopd_control.start([MLOOPD], env, log_path, control)
harness.kill_at_exit(p)
limit = mloopd_control.descriptors(p.pid) + SPARE
resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (limit, limit))


def cpu_s():
    with open(f"/proc/{p.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


clients = []
harness.on_exit(lambda: [c.close() for c in clients])
for _ in range(CLIENTS):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c.connect(control)    # queued when not accepted
    clients.append(c)
wait_for("mloopd's descriptor table to fill",
         lambda: mloopd_control.descriptors(p.pid) >= limit, timeout=5)
time.sleep(0.2)
before = cpu_s()
time.sleep(SPIN_S)
used = cpu_s() - before
check(f"mloopd with a full descriptor table uses little CPU over {SPIN_S} s",
      used < MAX_CPU_S, f"{used:.2f} s")
for c in clients:
    c.close()
clients.clear()


def answers_list():
    try:
        return mloopd_control.ask(control, op="list").get("ok") == "1"
    except OSError:
        return False


try:
    wait_for("mloopd to answer again", answers_list, timeout=10)
    answers = True
except AssertionError:
    answers = False
check("mloopd answers again once the clients go", answers)
with open(log_path) as f:
    said = [line for line in f if "descriptor" in line]
check("mloopd says once that it is out of descriptors", len(said) >= 1 and
      sum("out of" in line for line in said) == 1, said)
p.terminate()
check("mloopd exits 0", p.wait(timeout=30) == 0)
harness.exit_if_failed()
