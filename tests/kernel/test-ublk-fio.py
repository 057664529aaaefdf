"""Throwaway figures for issue 15 (not in runner.py's lists; run with
MLOOP_KERNEL_TESTS=ublk-fio on 6.12): fio 4k randread QD64 and 4 x 1 MiB
readers on mloop-ublk (1 and 2 queues) and on loop --direct-io=on over
the same fully written image, in the same VM.  Prints the figures as
TAP comments; asserts only that fio ran."""
import json
import os
import subprocess

import kinds
from kfix import Skip, run, tmpdir

SIZE = 1 << 30
RUNTIME, RAMP = 10, 2
JOBS = {
    "randread": ["--rw=randread", "--bs=4k", "--iodepth=64"],
    "seqread4": ["--rw=read", "--bs=1M", "--iodepth=8", "--numjobs=4",
                 f"--offset_increment={SIZE // 4}", f"--size={SIZE // 4}",
                 "--group_reporting"],
}


def fio(dev, job):
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    p = run(["fio", f"--name={job}", f"--filename={dev}", "--ioengine=libaio",
             "--direct=1", "--time_based", f"--runtime={RUNTIME}",
             f"--ramp_time={RAMP}", "--output-format=json"] + JOBS[job], timeout=300)
    d = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]["read"]
    return d["iops"], d["bw_bytes"] / 2**20


def run_test(kind, cl):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "ublk_smoke", os.path.join(os.path.dirname(__file__), "test-ublk-smoke.py"))
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    if not os.path.exists("/dev/ublk-control"):
        raise Skip("no /dev/ublk-control")
    image = os.path.join(tmpdir(cl), "bench.img")
    run(["fio", "--name=mkimage", f"--filename={image}", f"--size={SIZE}", "--rw=write",
         "--bs=1M", "--direct=1", "--ioengine=libaio", "--iodepth=8",
         "--output=/dev/null"], timeout=1800)
    cl.push(os.unlink, image)
    setups = [("ublk q1", ["--queues", "1"]), ("loop-dio", None),
              ("ublk q2", ["--queues", "2"]), ("ublk q1 buffered", ["--buffered"])]
    for name, extra in setups:
        for job in JOBS:
            with smoke.Cleanup() as inner:
                if extra is None:
                    dev = kinds.Loop().attach(inner, image).device
                else:
                    _, dev = smoke.start(inner, image, extra)
                iops, mibs = fio(dev, job)
            print(f"# FIG {name:18} {job:9} {iops:10.0f} IOPS {mibs:8.1f} MiB/s", flush=True)
