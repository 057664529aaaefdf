"""mloopd serving inside itself (--serve=in-process) survives itself:
DEVICES devices attached through it, fio writing and verifying on all of
them at once, while mloopd is killed with SIGKILL twice and started
again.  Its servers die with it; the kernel holds the devices' IO (the
dead-connection timeout) until the next mloopd has opened every image
again and handed the kernel new connections to it.  Nothing is served
between the kill and the next start: the devices wait.

Checked: no process per device (mloopd has no children while it serves);
after each restart every device is kept by the new mloopd, whole (its
server running inside it, every connection open); no IO error (fio's,
and none in the kernel log for these devices), no verify mismatch;
after detach mloopd keeps nothing.  The summary line says how long the
next mloopd took to serve every device again.

Cost: 4 attaches, fio's 4 x 8 MiB of random writes verified, two
restarts: about 30-40 s under TCG.  Run by the in-process kind only."""
import os
import re
import subprocess
import time
import uuid

import blockio
import fioverify
import kinds
from kfix import Skip, make_image, wait_until
from restart import attach, kill_mark, status

DEVICES = 4
IMAGE_SIZE = 16 << 20
REGION = 8 << 20
TIMEOUT = 30          # request and dead-connection timeout: the restart's room
BACK_WITHIN = 60


def whole(kind, dev):
    s = status(kind, dev)
    return (s["service_kept"] and s["supervisor_running"] and s["server_running"]
            and s["device"].get("server_in_process")
            and s.get("connections_open") == kind.queues)


def run_test(kind, cl):
    if not isinstance(kind, kinds.MloopServiceInProcess):
        raise Skip("for mloopd serving inside itself (the in-process kind)")
    service = kind.service
    images = [make_image(cl, size=IMAGE_SIZE, seed=190 + i) for i in range(DEVICES)]
    atts = [attach(kind, cl, image, TIMEOUT) for image in images]
    devs = [att.device for att in atts]
    children = subprocess.run(["pgrep", "-P", str(service.proc.pid)],
                              capture_output=True, text=True).stdout.split()
    assert not children, f"mloopd has children while serving inside itself: {children}"

    token = f"mloop-in-process-kill-{uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as f:
        f.write(f"<6>{token}\n")
    backs = []

    def kill_once():
        for dev in devs:
            kill_mark(dev, service.proc.pid)
        killed_at = time.monotonic()
        service.kill()
        service.start()
        wait_until(lambda: all(whole(kind, dev) for dev in devs),
                   "every device served by the next mloopd, whole", BACK_WITHIN)
        backs.append(time.monotonic() - killed_at)

    _, rounds = fioverify.under_kills(devs, cl, 2, kill_once, region=REGION)
    ours = re.compile(rf"I/O error, dev ({'|'.join(os.path.basename(d) for d in devs)}),")
    errors = [line for line in blockio.kernel_log_around(token)[1] if ours.search(line)]
    assert not errors, f"the kernel logged IO errors: {errors[:5]}"
    for att in atts:
        att.detach()
    assert not service.kept(), f"mloopd still keeps {service.kept()} after every detach"
    print(f"# {rounds} fio rounds; after each SIGKILL every device was served "
          "by the next mloopd in " + ", ".join(f"{b:.1f} s" for b in backs), flush=True)
