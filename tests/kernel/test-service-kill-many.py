"""mloopd survives itself, with many devices: 16 devices attached through
mloopd, fio writing and verifying on all of them at once (one job of
8 MiB per device), while mloopd is killed with SIGKILL and started again
(the next mloopd takes every device over, its running servers
untouched), then one device's server is killed (the mloopd of the
moment starts another and reconnects the kernel; the kernel requeues
what the dead server held after the request timeout), then mloopd is
killed again (the next one takes over the server its predecessor
started, too).  fio verifies as it writes (fioverify.start_round), so
every kill lands while every device is written to.  After each kill
every device must answer a read (with mloopd dead: the devices serve
without it) and be kept by mloopd, whole (`mloop status`: the service
keeps it, its server runs, every connection is open); the summary line
says how long the reads, the takeover and the restart took (under TCG:
every device read 0.1-1.3 s after a kill, the next mloopd keeping all
16 in 2-3 s after the first kill and 0.3-0.5 s after the second, the
server restarted and reconnected in 0.6-0.8 s).

Checked: no IO error (fio's, and none in the kernel log for these
devices, which run-kernel-tests forgives in the restart tests), no
verify mismatch on any device; every device but the one whose server
was killed still has the server attach started; the last mloopd keeps
every device and no other; after detach no device is connected, no
server runs, mloopd keeps nothing and the runtime directory holds no
device.

For the service kind, the kind's own mloopd is the one killed; for the
other `mloop attach` kinds (native, nbdkit) one of the test's own
listens in their runtime directory, as in test-service-attach.py.
Cost: 16 attaches, fio's 16 x 8 MiB of random writes verified, 16
detaches: 70-85 s under TCG on 6.12, 90 s on 6.1, so the full tier only
(test-service-attach.py, 27-30 s, kills mloopd and a server under fio
in the standard tier)."""
import concurrent.futures
import mmap
import os
import re
import time
import uuid

import blockio
import fioverify
from kfix import make_image, processes_mentioning, wait_until
from restart import attach, kill_server, status
from service import for_test

DEVICES = 16
IMAGE_SIZE = 16 << 20
REGION = 8 << 20      # each device's fio job
PROBE = 12 << 20      # where a read checks a device serves: past fio's region
TIMEOUT = 10          # the devices' request timeout: requests on a killed server requeue
BACK_WITHIN = 90      # seconds after a kill for every device to serve again


def probe(dev):
    """Reads one block of DEV past fio's region (O_DIRECT)."""
    buf = mmap.mmap(-1, 4096)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], PROBE) == 4096, f"{dev}: short read"
    finally:
        os.close(fd)
        buf.close()


def lacks(kind, dev):
    """What DEV lacks of being kept by mloopd with its server running and
    every connection open: a list of words, empty when it lacks nothing."""
    s = status(kind, dev)
    return [what for what, ok in (("kept", s["service_kept"] and s["supervisor_running"]),
                                  ("server", s["server_running"]),
                                  (f"connections {s.get('connections_open')}",
                                   s.get("connections_open") == kind.queues)) if not ok]


def run_test(kind, cl):
    service = for_test(kind, cl)
    images = [make_image(cl, size=IMAGE_SIZE, seed=160 + i) for i in range(DEVICES)]
    start = time.monotonic()
    atts = [attach(kind, cl, image, TIMEOUT) for image in images]
    attach_time = time.monotonic() - start
    devs = [att.device for att in atts]
    dirs = {dev: os.path.dirname(status(kind, dev)["device"]["socket"]) for dev in devs}
    assert service.kept() == set(dirs.values()), \
        f"mloopd keeps {sorted(service.kept())}, not the {DEVICES} devices' directories"
    supervisors = processes_mentioning("mloop-supervisor")
    assert not supervisors, f"supervisors run beside mloopd: {supervisors}"
    pids = {dev: status(kind, dev)["device"]["server_pid"] for dev in devs}
    victim = devs[DEVICES // 2]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=DEVICES)
    cl.push(pool.shutdown)

    token = f"mloop-service-kill-many-{uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as f:
        f.write(f"<6>{token}\n")
    kills = []

    def every_read(since):
        """Seconds from SINCE until every device has answered a read."""
        list(pool.map(probe, devs))
        return time.monotonic() - since

    def every_whole():
        """Waits until every device is kept by mloopd, whole (not timed:
        under fio's load 16 `mloop status` take seconds of their own)."""
        pending, lacked = list(devs), {}

        def whole():
            for dev in list(pending):
                missing = lacks(kind, dev)
                if missing:
                    lacked.setdefault(dev, " ".join(missing))
                else:
                    pending.remove(dev)
            return not pending
        wait_until(whole, "every device to be kept by mloopd, whole", BACK_WITHIN)
        if lacked:
            print("# at first lacking: " + ", ".join(
                f"{dev} {what}" for dev, what in lacked.items()), flush=True)

    def kill_once():
        killed_at = time.monotonic()
        if len(kills) % 2 == 0:
            # The devices serve on without mloopd.
            service.kill()
            read = every_read(killed_at)
            service.start()
            wait_until(lambda: service.kept() == set(dirs.values()),
                       "the next mloopd to keep every device", BACK_WITHIN)
            kills.append(("mloopd", time.monotonic() - killed_at, read))
        else:
            restarted = kill_server(kind, victim, timeout=BACK_WITHIN)
            pids[victim] = status(kind, victim)["device"]["server_pid"]
            kills.append(("server", restarted, every_read(killed_at)))
        every_whole()

    _, rounds = fioverify.under_kills(devs, cl, 3, kill_once, region=REGION)

    for dev in devs:
        s = status(kind, dev)
        assert s["service_kept"] and s["supervisor_running"], \
            f"{dev} is not kept by the last mloopd: {s}"
        assert s["device"]["server_pid"] == pids[dev] and s["server_running"], \
            f"{dev}: its server pid {pids[dev]} did not serve on: {s}"
    assert service.kept() == set(dirs.values()), \
        f"the last mloopd keeps {sorted(service.kept())}, not the {DEVICES} devices"
    ours = re.compile(rf"I/O error, dev ({'|'.join(os.path.basename(d) for d in devs)}),")
    errors = [line for line in blockio.kernel_log_around(token)[1] if ours.search(line)]
    assert not errors, f"the kernel logged IO errors: {errors[:5]}"

    start = time.monotonic()
    for att in atts:
        att.detach()
    detach_time = time.monotonic() - start
    assert not service.kept(), f"mloopd still keeps {service.kept()} after every detach"
    if service is not getattr(kind, "service", None):
        service.stop()  # its socket is not a device's state
    left = [p for att, image in zip(atts, images) for p in kind.leftovers(att, image)]
    assert not left, "; ".join(left[:10])
    print(f"# {DEVICES} devices attached in {attach_time:.1f} s, detached in "
          f"{detach_time:.1f} s; {rounds} fio rounds; "
          + ", ".join(f"{what} killed: every device read in {read:.1f} s, "
                      + (f"kept by the next mloopd in {back:.1f} s" if what == "mloopd"
                         else f"server restarted in {back:.1f} s")
                      for what, back, read in kills), flush=True)
