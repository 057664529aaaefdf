"""The guest half of bench/kernel-path: runs as root in the test VM (or on
any machine whose kernel has nbd and loop), attaches one image through
each device kind in turn and runs fio on the block device.

  kpath_guest.py --rounds R --runtime T --ramp S --image-gib G
                 --kinds K,... --jobs J,... [--profile KIND:JOB]

Prints one line "KPATH <json>" per record (meta, job, profile, error);
everything else it prints is progress.  The device kinds are those of the
kernel tests (tests/kernel/kinds.py) plus three only the benchmark needs:
loop without direct I/O, stock nbd-client on nbdkit's own file plugin,
and qemu-nbd -c; and mloop over ublk on kernels that have ublk_drv.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "tests", "kernel")]

import kfix  # noqa: E402
import kinds  # noqa: E402
import recvwork  # noqa: E402
import runner  # noqa: E402
from kfix import free_nbd, nbd_in_use, run, wait_until  # noqa: E402

import kpath_cpu  # noqa: E402

# ------------------------------------------------------------------ kinds


class LoopBuffered(kinds.Loop):
    """losetup's default: the loop driver reads and writes the image
    through the page cache."""
    name = "loop-buffered"
    direct_io = False


class LoopDio(kinds.Loop):
    name = "loop-dio"


class MloopDefaults(kinds.MloopCli):
    """`mloop attach` as a user runs it: the defaults, with the
    connections pinned to the default of a 4-vCPU machine."""

    def __init__(self, server):
        super().__init__(server)
        self.name = f"mloop-{server}"

    def attach(self, cl, image, read_only=False, args=None):
        return super().attach(cl, image, args=["attach", image, "--server", self.server,
                                               "--connections", str(self.queues)])


class Baseline:
    """Mixed into a kind: the same with another build's binary
    (BENCH_BASELINE on the host, passed in as the environment variable
    BASE_VAR), handed to mloop attach as BIN_VAR: a change against what
    it replaces, in the same VM run."""

    base_var = bin_var = ""

    def unavailable(self):
        if not os.environ.get(self.base_var):
            return "no BENCH_BASELINE build given"
        return super().unavailable()

    def env(self):
        return dict(super().env(), **{self.bin_var: os.environ[self.base_var]})


class MloopOverlay(MloopDefaults):
    """`mloop attach --overlay` with a fresh overlay on the image, as a
    sandbox gets one: reads come from the base until written."""

    def __init__(self):
        super().__init__("native")
        self.name = "mloop-overlay"

    def attach(self, cl, image, read_only=False, args=None):
        overlay = os.path.join(kfix.tmpdir(cl), "device.overlay")
        return kinds.MloopCli.attach(self, cl, image, args=[
            "attach", image, "--server", self.server, "--connections", str(self.queues),
            "--overlay", overlay])


class MloopBaseline(Baseline, MloopDefaults):
    base_var, bin_var = "MLOOP_BASE_SERVER_BIN", "MLOOP_SERVER_BIN"

    def __init__(self):
        super().__init__("native")
        self.name = "mloop-native-base"


class MloopUblkDefaults(kinds.MloopUblk):
    """`mloop attach --transport ublk` with its defaults, the hardware
    queues pinned like the NBD kinds' connections."""


    def __init__(self):
        super().__init__()
        self.name = "mloop-ublk"

    def attach(self, cl, image, read_only=False, args=None):
        return super().attach(cl, image, args=["attach", image, "--transport", "ublk",
                                               "--connections", str(self.queues)])


class MloopUblkOverlay(MloopUblkDefaults):
    """The same fresh overlay behind ublk."""

    def __init__(self):
        super().__init__()
        self.name = "mloop-ublk-overlay"

    def attach(self, cl, image, read_only=False, args=None):
        overlay = os.path.join(kfix.tmpdir(cl), "device.overlay")
        return kinds.MloopUblk.attach(self, cl, image, args=[
            "attach", image, "--transport", "ublk", "--connections", str(self.queues),
            "--overlay", overlay])


class MloopUblkBaseline(Baseline, MloopUblkDefaults):
    base_var, bin_var = "MLOOP_BASE_UBLK_BIN", "MLOOP_UBLK_BIN"

    def __init__(self):
        super().__init__()
        self.name = "mloop-ublk-base"


class StockFile(kinds.StockClient):
    """Stock nbd-client -C 4 on nbdkit's file plugin (page cache, as
    nbdkit serves files by default)."""

    def __init__(self):
        super().__init__("nbdkit")
        self.name = "nbd-client-file"

    def unavailable(self):
        if shutil.which("nbd-client") is None:
            return "nbd-client is not installed"
        if shutil.which("nbdkit") is None:
            return "nbdkit is not installed"
        return None

    def server_cmd(self, sock, ready, image, read_only):
        return ["nbdkit", "-f", "-U", sock, "-P", ready] + \
            (["-r"] if read_only else []) + ["file", image]


class StockCow(StockFile):
    """Stock nbd-client -C 4 on nbdkit's cow filter over the file plugin:
    nbdkit's copy-on-write overlay (a temporary file, 64 KiB blocks)."""

    def __init__(self):
        super().__init__()
        self.name = "nbdkit-cow"

    def server_cmd(self, sock, ready, image, read_only):
        return ["nbdkit", "-f", "-U", sock, "-P", ready, "--filter=cow", "file", image]


class QemuNbd:
    """qemu-nbd -c: qemu's server connects the device itself over one
    socket (the ioctl interface) and stays in the background;
    --cache=none --aio=native as bench/run serves images with it."""

    queues = 1
    block_size = kfix.BLOCK_SIZE
    name = "qemu-nbd"

    def unavailable(self):
        return None if shutil.which("qemu-nbd") else "qemu-nbd is not installed"

    image_format = "raw"

    def served_file(self, cl, image):
        """What qemu-nbd serves for IMAGE."""
        return image

    def attach(self, cl, image, read_only=False):
        dev = free_nbd()
        # -k: its socket, by default under /var/lock, which the VM lacks.
        sock = os.path.join(kfix.tmpdir(cl), "qemu-nbd.sock")
        image = self.served_file(cl, image)
        run(["qemu-nbd", "-c", dev, "-k", sock, "-f", self.image_format, "--cache=none",
             "--aio=native"] + (["--read-only"] if read_only else []) + [image])
        wait_until(lambda: nbd_in_use(dev), f"{dev} to connect")

        def undo():
            run(["qemu-nbd", "-d", dev])
            wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
            wait_until(lambda: not kfix.processes_mentioning(image),
                       f"qemu-nbd serving {image} to exit")
        return kinds._attach(cl, dev, undo, self.queues)


class QemuNbdQcow2(QemuNbd):
    """qemu-nbd -c on a fresh qcow2 overlay backed by the raw image
    (qemu-img create -b): qemu's copy-on-write, as `qemu-nbd -s` makes
    it."""

    name = "qemu-nbd-qcow2"
    image_format = "qcow2"

    def served_file(self, cl, image):
        overlay = os.path.join(kfix.tmpdir(cl), "overlay.qcow2")
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", image, "-F", "raw", overlay])
        return overlay


KINDS = {k.name: k for k in [LoopDio(), LoopBuffered(), MloopDefaults("native"),
                             MloopOverlay(), MloopUblkOverlay(), StockCow(),
                             QemuNbdQcow2(),
                             MloopBaseline(), MloopDefaults("nbdkit"), MloopUblkDefaults(),
                             MloopUblkBaseline(), StockFile(),
                             QemuNbd()]}

# ------------------------------------------------------------------- jobs

# name: (fio arguments, block size, figure).  The 4 readers each read
# their own quarter of the device (fio --offset_increment).
JOBS = {
    "randread": (["--rw=randread", "--bs=4k", "--iodepth=64"], 4096, "iops"),
    "seqread4": (["--rw=read", "--bs=1M", "--iodepth=8", "--numjobs=4",
                  "--offset_increment={quarter}", "--size={quarter}",
                  "--group_reporting"], 1 << 20, "mibs"),
    "randwrite": (["--rw=randwrite", "--bs=4k", "--iodepth=64"], 4096, "iops"),
}


def emit(rec):
    print("KPATH " + json.dumps(rec), flush=True)


def say(text):
    print(f"# {text}", flush=True)


def drop_caches():
    """Nothing of the image is in the guest's page cache when a job
    starts: a buffered kind's first read of a block goes to the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_image(path, size):
    """SIZE bytes written once with O_DIRECT (fio's random buffer): every
    block allocated, so no kind reads holes."""
    run(["fio", "--name=mkimage", f"--filename={path}", f"--size={size}",
         "--rw=write", "--bs=1M", "--direct=1", "--ioengine=libaio",
         "--iodepth=8", "--output=/dev/null"], timeout=1800)
    assert os.path.getsize(path) == size, f"{path}: fio wrote a short image"


def fio_job(dev, job, size, runtime, ramp):
    """Runs JOB on DEV; returns (fio's JSON, the CPU and device counts:
    kpath_cpu.job_figures)."""
    args, bs, _ = JOBS[job]
    quarter = size // 4
    args = [a.format(quarter=quarter) for a in args]
    cmd = ["fio", f"--name={job}", f"--filename={dev}", "--ioengine=libaio",
           "--direct=1", "--time_based", f"--runtime={runtime}",
           f"--ramp_time={ramp}", "--output-format=json"] + args
    sampler = kpath_cpu.Sampler(dev)
    sampler.start()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime + ramp + 300)
    finally:
        sampler.stop()
    if p.returncode != 0:
        raise AssertionError(f"fio exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return (json.loads(p.stdout[p.stdout.index("{"):]),
            kpath_cpu.job_figures(sampler.samples, bs, ramp, runtime))


def one_job(kind, image, size, rnd, job, a, profiling=False):
    """A cell of one round: a fresh attach, a cold cache, one fio job.
    PROFILING: a job of its own (round 0) that also records where the
    guest's CPU went; its figures stay out of the medians (the recording
    costs CPU itself)."""
    figure = JOBS[job][2]
    rec = {"type": "profile" if profiling else "job", "round": rnd,
           "kind": kind.name, "job": job}
    start = time.monotonic()
    with kfix.Cleanup() as cl:
        if not isinstance(kind, (kinds.Loop, kinds.MloopUblk)):
            recvwork.warm()  # as the kernel tests do: see recvwork.py
        dev = kind.attach(cl, image).device
        drop_caches()
        prof = kpath_cpu.Profile(a.runtime + a.ramp) if profiling else None
        if prof:
            prof.start()
        try:
            out, cpu = fio_job(dev, job, size, a.runtime, a.ramp)
        finally:
            if prof:
                prof.stop()
    j = out["jobs"][0]
    d = j["write" if job == "randwrite" else "read"]
    rec.update(iops=d["iops"], mibs=d["bw_bytes"] / 2**20, total_ios=d["total_ios"],
               value=d["iops"] if figure == "iops" else d["bw_bytes"] / 2**20,
               bytes=d["io_bytes"], **cpu)
    if job == "seqread4":
        # A reader that went past its quarter read blocks again: a buffered
        # kind may then have served them from the page cache.
        rec["wrapped"] = d["io_bytes"] / 4 > size // 4
    if prof:
        rec.update(prof.report())
    rec["cell_s"] = time.monotonic() - start  # attach to detach: for run-time estimates
    emit(rec)
    say(f"round {rnd} {kind.name} {job}: {rec['value']:.0f} "
        f"{'IOPS' if figure == 'iops' else 'MiB/s'}, "
        f"{rec['cpu_s_per_1k']:.3f} guest CPU s/1k req")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--ramp", type=int, default=2)
    ap.add_argument("--image-gib", type=int, default=4)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--jobs", default=",".join(JOBS))
    ap.add_argument("--profile", default="")
    a = ap.parse_args()
    names, jobs = a.kinds.split(","), a.jobs.split(",")
    for n in names:
        if n not in KINDS:
            sys.exit(f"kpath_guest: unknown kind {n}; one of {', '.join(KINDS)}")
    for j in jobs:
        if j not in JOBS:
            sys.exit(f"kpath_guest: unknown job {j}; one of {', '.join(JOBS)}")
    emit({"type": "meta", "kernel": os.uname().release, "cpus": os.cpu_count(),
          "fio": run(["fio", "--version"]).stdout.strip(),
          "mem_mib": kpath_cpu.mem_total_mib(), "perf": kpath_cpu.perf_usable()})
    runnable = []
    for n in names:
        reason = KINDS[n].unavailable() or runner.kernel_lacks(KINDS[n])
        if reason:
            emit({"type": "skip", "kind": n, "text": reason})
        else:
            runnable.append(KINDS[n])
    size = a.image_gib << 30
    with kfix.Cleanup() as cl:
        image = os.path.join(kfix.tmpdir(cl), "disk.img")
        say(f"writing the {a.image_gib} GiB image")
        start = time.monotonic()
        make_image(image, size)
        say(f"image written in {time.monotonic() - start:.0f} s")
        failed = 0
        if a.profile:
            pk, _, pj = a.profile.partition(":")
            if pk not in KINDS or pj not in JOBS:
                sys.exit(f"kpath_guest: --profile {a.profile}: expected KIND:JOB")
            try:
                one_job(KINDS[pk], image, size, 0, pj, a, profiling=True)
            except Exception as e:
                failed += 1
                emit({"type": "error", "round": 0, "kind": pk, "job": pj,
                      "text": str(e)[-500:]})
        for rnd in range(1, a.rounds + 1):
            # Rotated: no kind always runs first, or always after a write job.
            order = runnable[(rnd - 1) % len(runnable):] + runnable[:(rnd - 1) % len(runnable)]
            for job in jobs:
                for kind in order:
                    try:
                        one_job(kind, image, size, rnd, job, a)
                    except Exception as e:
                        failed += 1
                        emit({"type": "error", "round": rnd, "kind": kind.name,
                              "job": job, "text": str(e)[-500:]})
                        say(f"round {rnd} {kind.name} {job}: FAILED: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
