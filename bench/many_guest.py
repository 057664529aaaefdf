"""The guest half of bench/many-devices: runs as root in the test VM and
measures what many block devices cost, made from small sparse images:
the time to attach them all P at a time, what they hold while idle
(processes, their memory, the kernel's AIO events, memory the system
no longer has free), and the time to detach them all P at a time.

  many_guest.py --devices N --parallel P --kinds K,... [--aio-max-nr N]

Kinds: loop-dio (losetup --direct-io=on), mloop-native (mloop attach),
mloop-service and mloop-in-process (mloop attach asking mloopd, which
serves through a server process per device or inside itself; mloopd is
counted with the processes the attaches left), mloop-ublk (mloop attach
--transport ublk, where the kernel has ublk_drv).  Prints one line "MANY <json>" per record; anything else is
progress.
"""
import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time

import devkinds

IMAGE_SIZE = 16 << 20


def emit(rec):
    print("MANY " + json.dumps(rec), flush=True)


KINDS = devkinds.kinds()


def user_processes():
    """Pid -> command of every process that is not a kernel thread (a
    kernel thread has an empty command line)."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if cmd:
            procs[int(pid)] = os.path.basename(cmd.split(b"\0")[0].decode(errors="replace"))
    return procs


def pss_kib(pid):
    """Proportional set size: shared pages counted once across
    processes, so a sum over processes is what they hold together."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def read_int(path):
    with open(path) as f:
        return int(f.read().split()[0])


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def measure(kind, images, parallel):
    drop_caches()
    before_procs = user_processes()
    before_aio = read_int("/proc/sys/fs/aio-nr")
    before_mem = mem_available_kib()
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        start = time.monotonic()
        devs = [dev for dev, _ in pool.map(kind.attach, images)]
        attach_ms = (time.monotonic() - start) * 1000
        if len(set(devs)) != len(devs):
            raise RuntimeError(f"{kind.name}: devices given twice")
        # Each device answers a read: attached, not only made.
        for dev in devs:
            with open(dev, "rb") as f:
                f.read(4096)
        time.sleep(2)           # let what the attaches started settle
        drop_caches()
        new = {pid: cmd for pid, cmd in user_processes().items()
               if pid not in before_procs or pid in kind.resident()}
        rec = {"type": "many", "kind": kind.name, "devices": len(images),
               "parallel": parallel, "attach_ms": attach_ms,
               "processes": len(new),
               "commands": sorted(set(new.values())),
               "pss_kib": sum(pss_kib(pid) for pid in new),
               "aio_events": read_int("/proc/sys/fs/aio-nr") - before_aio,
               "mem_used_kib": before_mem - mem_available_kib()}
        start = time.monotonic()
        list(pool.map(kind.detach, devs))
        rec["detach_ms"] = (time.monotonic() - start) * 1000
    emit(rec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--aio-max-nr", type=int, default=0)
    a = ap.parse_args()
    if a.aio_max_nr:
        with open("/proc/sys/fs/aio-max-nr", "w") as f:
            f.write(str(a.aio_max_nr))
    emit({"type": "meta", "kernel": os.uname().release, "cpus": os.cpu_count()})
    failed = 0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        images = []
        for i in range(a.devices):
            images.append(os.path.join(d, f"img{i}"))
            with open(images[-1], "wb") as f:
                f.truncate(IMAGE_SIZE)
        for n in a.kinds.split(","):
            kind = KINDS[n]
            reason = kind.unavailable()
            if reason:
                emit({"type": "skip", "kind": n, "text": reason})
                continue
            # The first attach warms the page cache with the programs
            # and libraries: not counted.
            kind.detach(kind.attach(images[0])[0])
            try:
                measure(kind, images, a.parallel)
            except Exception as e:
                failed += 1
                emit({"type": "error", "kind": n, "text": str(e)[-500:]})
            print(f"{n}: done", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
