"""Where the guest's CPU goes during a bench/kernel-path job.

Always: the busy time of all CPUs from /proc/stat (user + nice + system +
irq + softirq; not idle, iowait or steal) divided by the requests fio
made, counted from the device's own statistics (bytes moved ÷ fio's block
size).  A sampler reads both every SAMPLE_S seconds while fio runs, and
the figure is taken over the steady part of the job only: from the ramp's
end (the device's first IO plus the ramp) to the end of fio's runtime.
fio's start-up and drain cost the same CPU whatever the kind, and would
weigh more on the slow kinds' fewer requests.  The whole run's figure is
kept beside it.

With --profile, one job also records, between its start and end: every
process's and kernel thread's CPU time (/proc/PID/stat: the server, its
threads, the loop and nbd kworkers), the softirqs and interrupts of each
kind, and, where perf works in the guest, a system-wide cpu-clock sample.
"""
import os
import signal
import subprocess
import threading
import time

HZ = os.sysconf("SC_CLK_TCK")
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...
BUSY = {"user": 0, "nice": 1, "system": 2, "irq": 5, "softirq": 6}
PERF_DATA = "/tmp/kpath-perf.data"
PERF_LOG = "/tmp/kpath-perf.log"


def _cpu_line():
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def _dev_sectors(dev):
    """(sectors read, sectors written) of DEV from /sys/block/NAME/stat
    (always in 512-byte units, whatever the device's block size)."""
    with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
        v = [int(x) for x in f.read().split()]
    return v[2], v[6]


SAMPLE_S = 0.25


def snapshot(dev):
    return {"t": time.monotonic(), "cpu": _cpu_line(), "sectors": _dev_sectors(dev)}


def delta(a, b, bs):
    """The figures between snapshots A and B, requests of BS bytes."""
    d = [y - x for x, y in zip(a["cpu"], b["cpu"])]
    fields = {f"cpu_{k}_s": d[i] / HZ for k, i in BUSY.items()}
    busy = sum(fields.values())
    moved = sum(y - x for x, y in zip(a["sectors"], b["sectors"])) * 512
    requests = moved / bs
    wall = b["t"] - a["t"]
    return dict(fields, cpu_busy_s=busy, wall_s=wall, requests=requests,
                busy_cpus=busy / wall if wall else None,
                cpu_s_per_1k=busy / requests * 1000 if requests else None)


class Sampler(threading.Thread):
    """Snapshots of DEV every SAMPLE_S seconds until stop()."""

    def __init__(self, dev):
        super().__init__(daemon=True)
        self.dev = dev
        self.samples = [snapshot(dev)]
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(SAMPLE_S):
            self.samples.append(snapshot(self.dev))

    def stop(self):
        self.done.set()
        self.join()
        self.samples.append(snapshot(self.dev))


def job_figures(samples, bs, ramp, runtime):
    """The whole run's figures, and the steady window's as the main ones
    (see the module's comment); the whole run's alone when the window
    holds too few samples (a job that barely moved)."""
    whole = delta(samples[0], samples[-1], bs)
    first = samples[0]["sectors"]
    moving = [s for s in samples if s["sectors"] != first]
    out = {f"whole_{k}": v for k, v in whole.items()}
    if moving:
        t0 = moving[0]["t"] - SAMPLE_S  # IO began within the sample before
        begin = [s for s in samples if s["t"] >= t0 + ramp]
        end = [s for s in samples if s["t"] <= t0 + ramp + runtime]
        if begin and end and end[-1]["t"] - begin[0]["t"] >= min(1.0, runtime / 2):
            out.update(delta(begin[0], end[-1], bs), window="steady")
            return out
    out.update(whole, window="whole")
    return out


def mem_total_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return None


def perf_usable():
    """Whether perf can count system-wide here: the host's perf binary on
    the guest's kernel (TCG has no PMU, so only software events)."""
    try:
        p = subprocess.run(["perf", "stat", "-a", "-e", "cpu-clock", "--", "true"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no: {e}"
    if p.returncode != 0:
        return "no: " + (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    return "yes"


def _threads():
    """{pid: (comm, utime + stime ticks)} of every process and kernel
    thread (a process's line covers all its threads)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        rest = s[s.rindex(")") + 2:].split()
        out[int(pid)] = (comm, int(rest[11]) + int(rest[12]))
    return out


def _counters(path):
    """{name: total over all CPUs} of /proc/softirqs or /proc/interrupts."""
    out = {}
    with open(path) as f:
        lines = f.read().splitlines()
    ncpu = len(lines[0].split())
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        words = rest.split()
        counts = [int(w) for w in words[:ncpu] if w.isdigit()]
        label = " ".join(words[len(counts):])  # interrupts name their source
        out[f"{name.strip()} {label}".strip()] = sum(counts)
    return out


class Profile:
    def __init__(self, seconds):
        self.seconds = seconds
        self.perf = None

    def start(self):
        self.t0 = time.monotonic()
        self.procs0 = _threads()
        self.soft0 = _counters("/proc/softirqs")
        self.irq0 = _counters("/proc/interrupts")
        if perf_usable() == "yes":
            # 499 Hz: under TCG sampling is itself expensive.
            self.perf = subprocess.Popen(
                ["perf", "record", "-a", "-g", "-F", "499", "-e", "cpu-clock",
                 "-o", PERF_DATA], stdout=subprocess.DEVNULL,
                stderr=open(PERF_LOG, "w"))
            time.sleep(1)  # perf opens its events before fio starts

    def stop(self):
        self.wall = time.monotonic() - self.t0
        self.procs1 = _threads()
        self.soft1 = _counters("/proc/softirqs")
        self.irq1 = _counters("/proc/interrupts")
        if self.perf:
            self.perf.send_signal(signal.SIGINT)
            try:
                self.perf.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.perf.kill()
                self.perf.wait()

    def report(self):
        procs = []
        for pid, (comm, ticks) in self.procs1.items():
            before = self.procs0.get(pid, (comm, 0))[1]
            if ticks > before:
                procs.append((ticks - before, f"{comm} [{pid}]"))
        procs.sort(reverse=True)
        soft = {k: v - self.soft0.get(k, 0) for k, v in self.soft1.items()}
        irq = {k: v - self.irq0.get(k, 0) for k, v in self.irq1.items()}
        rep = {"profile_wall_s": self.wall,
               "processes_cpu_s": [[n, t / HZ] for t, n in procs[:15]],
               "softirqs": {k: v for k, v in sorted(soft.items(), key=lambda x: -x[1]) if v},
               "interrupts": dict(sorted(((k, v) for k, v in irq.items() if v),
                                         key=lambda x: -x[1])[:12])}
        if self.perf:
            p = subprocess.run(["perf", "report", "-i", PERF_DATA, "--stdio", "--no-children",
                                "-g", "none", "--sort", "comm,dso,sym", "--percent-limit", "0.5"],
                               capture_output=True, text=True, timeout=600)
            rep["perf_top"] = [l for l in p.stdout.splitlines()
                               if l.strip() and not l.startswith("#")][:40]
            if p.returncode != 0:
                rep["perf_error"] = p.stderr.strip()[-300:]
        elif perf_usable() != "yes":
            rep["perf_error"] = perf_usable()
        return rep
