"""A supervisor's stop whose mloop-ublk outlasts the stop's 10 s in its
own write-back (sync(1), while a writer keeps dirtying pages on a slow
image) is SIGKILLed before its STOP_DEV: the device is left quiesced,
holding its IO.  The supervisor must delete it then, and say the page
cache is lost, rather than exit and leave it to nobody.  /bin/sync is
replaced (a bind mount, in the guest only) by one that waits 15 s
first.  About 15 s in the 6.12 guest."""
import os
import shutil
import signal
import sys

from kfix import make_image, run, tmpdir, wait_until
import kinds
import restart

SLOW_S = 15


def run_test(kind, cl):
    image = make_image(cl)
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    supervisor = restart.supervisor_of(st)
    index = int(att.device.removeprefix("/dev/ublkb"))

    work = tmpdir(cl)
    real = os.path.join(work, "real-sync")
    shutil.copy("/usr/bin/sync", real)
    slow = os.path.join(work, "sync")
    with open(slow, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -c 'import os, sys, time; "
                f"time.sleep({SLOW_S}); os.execv(\"{real}\", [\"sync\"] + sys.argv[1:])' "
                f"\"$@\"\n")
    os.chmod(slow, 0o755)
    run(["mount", "--bind", slow, "/usr/bin/sync"])
    cl.push(run, ["umount", "/usr/bin/sync"])

    def release():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if real.encode() in f.read():
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                continue
        if os.path.exists(f"/sys/block/ublkb{index}"):
            run([kinds.UBLK_BIN, "--delete", str(index)], check=False)
    cl.push(release)

    os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: not restart.alive(supervisor), "the supervisor to end its stop", 40)
    log = restart.supervisor_log(st)
    assert not os.path.exists(f"/sys/block/ublkb{index}"), \
        f"{att.device} left quiesced, holding its IO, by a supervisor that has ended; " \
        f"supervisor.log: {log[-4:]}"
    assert any("is lost" in line for line in log), \
        f"the supervisor did not say the page cache was lost; supervisor.log: {log[-4:]}"
    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
