"""The guest half of bench/attach-speed: runs as root in the test VM (or
on any machine whose kernel has nbd and loop) and times making and
removing block devices from small images, one at a time and many at once.

  attach_guest.py --rounds R --parallel P --kinds K,...

Kinds: loop-dio (losetup --direct-io=on), mloop-native (mloop attach,
mloop-server, a supervisor per device), mloop-service (the same where
mloopd listens: mloopd keeps the server, no supervisor is started),
mloop-ublk (mloop attach --transport ublk, where the kernel has
ublk_drv).  Each round times one attach and one detach of
every kind, kinds rotated; then P images are attached at once and
detached at once, per kind.  mloop's attaches run with --verbose, so the
report can say where their time goes.  Prints one line "ATTACH <json>"
per record; anything else is progress.
"""
import argparse
import concurrent.futures
import json
import os
import re
import sys
import tempfile
import time

import devkinds

IMAGE_SIZE = 64 << 20
STEP = re.compile(r"^mloop: attach: (.+?)\s+([0-9.]+) ms$")


def emit(rec):
    print("ATTACH " + json.dumps(rec), flush=True)


def say(text):
    print(text, flush=True)


KINDS = devkinds.kinds(verbose=True)


def attach_steps(kind, image):
    """KIND attaches IMAGE: the device, and the time of each step mloop
    --verbose reported (none for losetup)."""
    dev, stderr = kind.attach(image)
    steps = {}
    for line in stderr.splitlines():
        m = STEP.match(line)
        if m:
            steps[m.group(1)] = steps.get(m.group(1), 0.0) + float(m.group(2))
    return dev, steps


def timed(fn, *args):
    start = time.monotonic()
    out = fn(*args)
    return (time.monotonic() - start) * 1000, out


def one_by_one(kind, image, rnd):
    ms_attach, (dev, steps) = timed(attach_steps, kind, image)
    ms_detach, _ = timed(kind.detach, dev)
    emit({"type": "single", "kind": kind.name, "round": rnd,
          "attach_ms": ms_attach, "detach_ms": ms_detach, "steps": steps})


def all_at_once(kind, images):
    with concurrent.futures.ThreadPoolExecutor(len(images)) as pool:
        start = time.monotonic()
        attached = list(pool.map(lambda image: attach_steps(kind, image), images))
        ms_attach = (time.monotonic() - start) * 1000
        devs = [dev for dev, _ in attached]
        steps = {}
        for _, s in attached:
            for step, ms in s.items():
                steps[step] = steps.get(step, 0.0) + ms / len(images)
        if len(set(devs)) != len(devs):
            raise RuntimeError(f"{kind.name}: devices given twice: {devs}")
        start = time.monotonic()
        list(pool.map(kind.detach, devs))
        ms_detach = (time.monotonic() - start) * 1000
    emit({"type": "parallel", "kind": kind.name, "devices": len(images),
          "attach_ms": ms_attach, "detach_ms": ms_detach, "steps": steps})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--kinds", default=",".join(KINDS))
    a = ap.parse_args()
    emit({"type": "meta", "kernel": os.uname().release, "cpus": os.cpu_count()})
    kinds = []
    for n in a.kinds.split(","):
        reason = KINDS[n].unavailable()
        if reason:
            emit({"type": "skip", "kind": n, "text": reason})
        else:
            kinds.append(KINDS[n])
    failed = 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        images = []
        for i in range(a.parallel):
            images.append(os.path.join(d, f"img{i}"))
            with open(images[-1], "wb") as f:
                f.truncate(IMAGE_SIZE)
        # The first attach of each kind warms the page cache with its
        # programs and libraries: not timed.
        for kind in kinds:
            kind.detach(kind.attach(images[0])[0])
        for rnd in range(1, a.rounds + 1):
            for kind in kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]:
                try:
                    one_by_one(kind, images[0], rnd)
                except Exception as e:
                    failed += 1
                    emit({"type": "error", "kind": kind.name, "text": str(e)[-500:]})
        say("one at a time: done")
        for kind in kinds:
            try:
                all_at_once(kind, images)
            except Exception as e:
                failed += 1
                emit({"type": "error", "kind": kind.name, "text": str(e)[-500:]})
            say(f"{kind.name}: {a.parallel} at once: done")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
