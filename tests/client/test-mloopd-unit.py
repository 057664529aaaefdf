#!/usr/bin/python3
"""mloopd under its units, run by a real systemd manager
(tests/unitmanager.py): the first request on mloopd.socket starts
mloopd.service; a restart of the service (an upgrade) and a SIGKILL of
mloopd (a crash, which Restart=always answers) each leave the devices'
servers serving, their pids unchanged (KillMode=process), and the next
mloopd keeps every device again; a server killed after that is
restarted by it.  Stopping the units after every device is dropped
leaves no server.

Root, on the host (no kernel NBD client needed); a SKIP where systemd's
manager cannot run.  About 4 s (standard tier, client suite)."""
import os
import shutil
import signal
import tempfile

import harness
import mloopd_control
import procstop
import unitmanager
from harness import check
from mloopd_control import server_pid, wait_for

BUILD = os.path.dirname(os.path.dirname(os.environ["MLOOPD_BIN"]))
MLOOPD = os.environ["MLOOPD_BIN"]
DEVICES = 3
SIZE = 4 << 20


def unit_file(subdir, name):
    path = os.path.join(BUILD, subdir, name)
    if not os.path.exists(path):
        harness.skip(f"{path} is not built (no systemd pkg-config file at setup)")
    return path


def main():
    try:
        m = unitmanager.UserManager()
        m.__enter__()
    except unitmanager.Unavailable as e:
        harness.skip(str(e))
    harness.on_exit(m.close)
    run = tempfile.mkdtemp(prefix="mloopd-unit-", dir="/run")
    harness.on_exit(lambda: shutil.rmtree(run, ignore_errors=True))
    control = os.path.join(run, "mloopd.sock")
    log = os.path.join(harness.tmpdir(), "mloopd.log")
    servers = set()

    def kill_servers():
        for pid in servers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    harness.on_exit(kill_servers)

    m.install(unit_file("systemd", "mloopd.service"))
    m.install(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                           "systemd", "mloopd.socket"))
    m.drop_in("mloopd.socket", f"[Socket]\nListenSequentialPacket=\n"
              f"ListenSequentialPacket={control}\n")
    env = "".join(f"Environment={k}={os.environ[k]}\n"
                  for k in ("MLOOP_SERVER_BIN",) if os.environ.get(k))
    m.drop_in("mloopd.service", f"[Service]\nExecStart=\nExecStart={MLOOPD}\n"
              f"Environment=MLOOP_RUNTIME_DIR={run}\n{env}"
              f"StandardOutput=append:{log}\nStandardError=append:{log}\n")
    m.systemctl("start", "mloopd.socket")
    harness.on_exit(lambda: m.systemctl("stop", "mloopd.service", "mloopd.socket",
                                        check=False))
    check("mloopd is not started before a request", m.state("mloopd.service") == "inactive")

    def ask(**fields):
        return mloopd_control.ask(control, **fields)

    def kept():
        return mloopd_control.kept(control)

    dirs, images, attaches = [], [], []
    for i in range(DEVICES):
        data = harness.pattern(SIZE, 60 + i)
        images.append((harness.make_image(SIZE, data), data))
        d = os.path.join(run, f"dev-{i}")
        attaches.append(mloopd_control.attaching(d))   # for the test's life
        dirs.append(d)
        a = ask(op="keep", dir=d, image=images[i][0], server="native")
        check(f"device {i} kept by the socket-started mloopd", a.get("ok") == "1", a)
        servers.add(server_pid(d))
    first = m.main_pid("mloopd.service")
    check("the first request started mloopd.service", first is not None and
          m.state("mloopd.service") == "active")
    before = {d: server_pid(d) for d in dirs}

    m.systemctl("restart", "mloopd.service")
    wait_for("the restarted mloopd to keep every device", lambda: kept() == set(dirs))
    second = m.main_pid("mloopd.service")
    check("a restart is another mloopd", second not in (None, first))
    check("a restart leaves every server serving, the same pids",
          all(server_pid(d) == before[d] and not procstop.has_exited(before[d])
              for d in dirs), {d: server_pid(d) for d in dirs})

    os.kill(second, signal.SIGKILL)
    wait_for("systemd to start mloopd again after a SIGKILL",
             lambda: m.main_pid("mloopd.service") not in (None, second))
    wait_for("the next mloopd to keep every device", lambda: kept() == set(dirs))
    check("a crash leaves every server serving, the same pids",
          all(server_pid(d) == before[d] and not procstop.has_exited(before[d])
              for d in dirs))

    os.kill(before[dirs[0]], signal.SIGKILL)
    wait_for("device 0's server, restarted by the third mloopd",
             lambda: server_pid(dirs[0]) not in (0, before[dirs[0]]))
    servers.add(server_pid(dirs[0]))
    check("a server killed then is restarted", not procstop.has_exited(server_pid(dirs[0])))

    for d in dirs:
        check(f"{os.path.basename(d)} dropped", ask(op="drop", dir=d).get("ok") == "1")
    m.systemctl("stop", "mloopd.service", "mloopd.socket")
    check("no server is left", all(procstop.has_exited(p) for p in servers if p > 0))
    harness.exit_if_failed()


main()
