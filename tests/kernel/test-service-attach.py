"""mloop attach through mloopd, the resident service.  With mloopd
listening, `mloop attach` asks it to keep each device's server: no
mloop-supervisor runs, and mloopd's only children are the servers.  fio
writes and verifies on one device while mloopd is killed with SIGKILL
and started again (it takes every device over, its running servers
untouched) and while a server is killed (the mloopd of the moment
starts another and reconnects the kernel): no IO error, no verify
mismatch.  The image grows and `mloop resize` follows it (nbdkit: a
planned restart asked of mloopd).  An autoclear device is cleaned up
after its last close; detach leaves nothing, and mloopd keeps nothing
once every device is gone.  27-30 s under TCG (6.1 native, standard
tier)."""
import os
import time

import fioverify
from kfix import Skip, make_image, processes_mentioning, run, tmpdir, wait_until
from restart import attach, kill_server, status
from service import MLOOPD, Service

DEVICES = 3
TIMEOUT = 10  # the devices' request timeout: requests on a killed server requeue


def ended_children(pid):
    """PID's children that have ended and are not reaped (zombies)."""
    ended = []
    for child in run(["pgrep", "-P", str(pid)], check=False).stdout.split():
        try:
            with open(f"/proc/{child}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        if stat[stat.rindex(")") + 2] == "Z":
            ended.append(child)
    return ended


def run_test(kind, cl):
    if not MLOOPD or not os.path.exists(MLOOPD):
        raise Skip("mloopd is not built")
    service = Service(kind, os.path.join(tmpdir(cl), "mloopd.log"))
    cl.push(service.stop)
    service.start()
    images = [make_image(cl, seed=30 + i) for i in range(DEVICES)]
    atts = [attach(kind, cl, image, TIMEOUT) for image in images]
    devs = [att.device for att in atts]
    for dev in devs:
        s = status(kind, dev)
        assert s["service_kept"] and s["supervisor_running"] and \
            s["supervisor_pid"] == 0, f"{dev} is not kept by mloopd: {s}"
    supervisors = processes_mentioning("mloop-supervisor")
    assert not supervisors, f"supervisors run beside mloopd: {supervisors}"
    # A daemonizing nbdkit leaves an intermediate process that ends at
    # once: mloopd reaps it within its stray-reaping period.
    wait_until(lambda: not ended_children(service.proc.pid),
               "mloopd to reap the children that ended", timeout=10)
    children = run(["pgrep", "-P", str(service.proc.pid)], check=False).stdout.split()
    assert len(children) == DEVICES, \
        f"mloopd has {len(children)} children, not one server per device: {children}"
    others = {dev: status(kind, dev)["device"]["server_pid"] for dev in devs[1:]}

    kills = []

    def kill_once():
        start = time.monotonic()
        if len(kills) % 2 == 0:
            kept = service.kept()
            service.kill()
            service.start()
            wait_until(lambda: service.kept() == kept, "the next mloopd to keep every device")
            kills.append(("mloopd", time.monotonic() - start))
        else:
            kills.append(("server", kill_server(kind, devs[0])))
    fioverify.under_kills(devs[0], cl, 4, kill_once)
    for dev, pid in others.items():
        s = status(kind, dev)
        assert s["device"]["server_pid"] == pid and s["server_running"], \
            f"{dev}: its server pid {pid} did not serve on through mloopd's restarts: {s}"

    # The image grows; the device follows (nbdkit: mloopd restarts it).
    with open(images[1], "r+b") as f:
        f.truncate(os.path.getsize(images[1]) + (4 << 20))
    kind.cli("resize", devs[1])
    got = int(run(["blockdev", "--getsize64", devs[1]]).stdout)
    assert got == os.path.getsize(images[1]), \
        f"{devs[1]} has {got} bytes after the resize, the image {os.path.getsize(images[1])}"

    # Autoclear through mloopd: the last close cleans everything up.
    image = make_image(cl, seed=39)
    dev = kind.cli(*kind.attach_args(image), "--autoclear").stdout.strip()
    cl.push(lambda: kind.cli("detach", dev, check=False))
    with open(dev, "rb") as f:
        f.read(4096)
    wait_until(lambda: not processes_mentioning(image) and
               len(service.kept()) == DEVICES,
               "the autoclear device's server and record to go after its last close",
               timeout=30)

    for att in atts:
        att.detach()
    assert not service.kept(), f"mloopd still keeps {service.kept()} after every detach"
    for image in images:
        assert not processes_mentioning(image), f"a server of {image} is left"
    service.stop()
    left = kind.state_entries()
    assert not left, f"the runtime directory still holds {left}"
    print("# " + ", ".join(f"{what} killed: back in {took:.1f} s" for what, took in kills),
          flush=True)
