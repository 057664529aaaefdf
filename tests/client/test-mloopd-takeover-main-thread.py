#!/usr/bin/python3
"""What a server's start on a thread of its own comes to is handled on
mloopd's main thread, even before its loop runs.

mloopd takes over the devices a killed mloopd kept before it enters its
loop, starting each one's server on a thread (hosted_start.c for a
device served inside mloopd).  The outcome must come back to the main
thread: handled on the starting thread (g_main_context_invoke does that
when the main thread is not in its loop), a device whose image cannot
be opened is let go and taken out of mloopd's table while the main
thread is still adding the next devices to it.

On the host: mloopd --serve=in-process keeps DEVICES devices and is
killed; every other image is removed; the next mloopd, under strace,
takes them over.  Checked: every line it says about a device's server
(opened, or not: let go) is written by its main thread; it keeps
exactly the devices whose image is there, each served again.

Root (mloopd answers root only), strace.  About 3 s (standard tier,
client suite)."""
import os
import re
import shutil
import signal
import time

import nbd

import harness
import mloopd_control
from harness import check

MLOOPD = os.environ["MLOOPD_BIN"]
DEVICES = 60
SIZE = 64 << 10

if os.geteuid() != 0:
    harness.skip("mloopd answers root only")
if shutil.which("strace") is None:
    harness.skip("strace is not installed")

d = harness.tmpdir()
run, control = mloopd_control.private_runtime(d)
env = dict(os.environ, MLOOP_RUNTIME_DIR=run)
log = os.path.join(d, "mloopd.log")
trace = os.path.join(d, "strace.out")
procs = []
harness.on_exit(lambda: [(p.kill(), p.wait()) for p in procs if p.poll() is None])


def device_dir(i):
    return os.path.join(run, f"dev-{i}")


p = mloopd_control.start([MLOOPD, "--serve=in-process"], env, log, control)
procs.append(p)
images = []
for i in range(DEVICES):
    lock = mloopd_control.attaching(device_dir(i))
    images.append(harness.make_image(SIZE))
    a = mloopd_control.ask(control, op="keep", dir=device_dir(i), server="native",
                           image=images[i], threads=1)
    check(f"device {i} kept", a.get("ok") == "1", a)
    # The device made, as attach records it: the next mloopd keeps it.
    open(os.path.join(device_dir(i), "state"), "w").close()
    os.close(lock)
p.kill()
p.wait()
for image in images[::2]:
    os.unlink(image)
there = {device_dir(i) for i in range(1, DEVICES, 2)}

p = mloopd_control.start(["strace", "-f", "-qq", "-s", "256", "-e", "trace=write", "-o", trace,
                          MLOOPD], env, log, control)
procs.append(p)
mloopd_control.wait_for("only the devices whose image is there kept",
                        lambda: mloopd_control.kept(control) == there, timeout=30)


def served(directory):
    try:
        h = nbd.NBD()
        h.connect_unix(os.path.join(directory, "sock"))
        ok = h.get_size() == SIZE
        h.shutdown()
        return ok
    except nbd.Error:
        return False


check("each served again", all(served(dd) for dd in there))
with open(log) as f:
    main = re.findall(r"mloopd pid (\d+) keeps", f.read())[-1]
os.kill(int(main), signal.SIGTERM)
p.wait(30)

with open(trace) as f:
    lines = f.read().splitlines()
about = re.compile(r"cannot keep it|letting go|in this process|did not open")
by = {}
for line in lines:
    if about.search(line):
        by.setdefault(line.split()[0], []).append(line)
check("mloopd said what came of each device's server",
      sum(len(v) for v in by.values()) >= DEVICES, len(lines))
check("all of it on its main thread", set(by) == {main},
      {t: len(v) for t, v in by.items()})
harness.exit_if_failed()
