"""The report of bench/kernel-path: medians of the rounds per kernel,
device kind and job, guest CPU per request beside them, ratios against
both loop modes from the same VM run, and the targets (PASS/MISS).
Standard library only."""
import statistics

# (kind, label), in table order.
KINDS = [
    ("loop-dio", "loop --direct-io=on"),
    ("loop-buffered", "loop (buffered, losetup's default)"),
    ("mloop-native", "mloop attach --server native"),
    ("mloop-native-base", "the same, BENCH_BASELINE's mloop-server"),
    ("mloop-nbdkit", "mloop attach --server nbdkit"),
    ("mloop-ublk", "mloop attach --transport ublk"),
    ("mloop-ublk-base", "the same, BENCH_BASELINE's mloop-ublk"),
    ("nbd-client-file", "nbd-client -C 4, nbdkit file"),
    ("qemu-nbd", "qemu-nbd -c (cache=none, aio=native)"),
    ("mloop-overlay", "mloop attach --overlay (native)"),
    ("mloop-ublk-overlay", "mloop attach --overlay --transport ublk"),
    ("qemu-nbd-qcow2", "qemu-nbd -c, qcow2 overlay (cache=none, aio=native)"),
    ("nbdkit-cow", "nbd-client -C 4, nbdkit cow filter on file"),
]
LABEL = dict(KINDS)
# (job, heading, unit)
JOBS = [("randread", "4k randread QD64", "IOPS"),
        ("seqread4", "4 × seq 1 MiB readers", "MiB/s"),
        ("randwrite", "4k randwrite QD64", "IOPS")]
# The targets: (kind, job, reference kind, minimum ratio).
TARGETS = [("mloop-native", "randread", "loop-dio", 1.0),
           ("mloop-native", "seqread4", "loop-buffered", 2.0),
           # ublk's (Linux 6.12 only: 6.1 has no ublk_drv).
           ("mloop-ublk", "randread", "loop-dio", 1.0),
           ("mloop-ublk", "seqread4", "loop-dio", 1.0),
           ("mloop-ublk", "seqread4", "loop-buffered", 2.0),
           # Copy-on-write: twice the best of qemu's and nbdkit's overlays.
           ("mloop-overlay", "randread", "qemu-nbd-qcow2", 2.0),
           ("mloop-overlay", "randread", "nbdkit-cow", 2.0),
           ("mloop-overlay", "randwrite", "qemu-nbd-qcow2", 2.0),
           ("mloop-overlay", "randwrite", "nbdkit-cow", 2.0)]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    if v is None:
        return "–"
    return "{:,.{}f}".format(v, digits)


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def series_section(series, recs, note):
    meta = next((r for r in recs if r["type"] == "meta"), {})
    jobs = [r for r in recs if r["type"] == "job"]

    def cell(kind, job, field):
        return median([r.get(field) for r in jobs if r["kind"] == kind and r["job"] == job])

    def span(kind, job):
        vals = [r["value"] for r in jobs if r["kind"] == kind and r["job"] == job]
        return f"{fmt(min(vals))}–{fmt(max(vals))}" if vals else "–"

    present = [k for k, _ in KINDS if any(r["kind"] == k for r in jobs)]
    rounds = len({r["round"] for r in jobs})
    out = [f"## Kernel {meta.get('kernel', series)}\n",
           f"{meta.get('cpus', '?')} vCPUs, {meta.get('mem_mib', '?')} MiB, {note}; "
           f"{rounds} round{'s' if rounds != 1 else ''}, medians; {meta.get('fio', 'fio ?')}; "
           f"perf in the guest: {meta.get('perf', '?')}.\n"]
    head = ["device"]
    for _, h, u in JOBS:
        head += [f"{h} {u}", "guest CPU s/1k req"]
    rows = []
    for k in present:
        row = [LABEL[k]]
        for j, _, _ in JOBS:
            row += [fmt(cell(k, j, "value")), fmt(cell(k, j, "cpu_s_per_1k"), 3)]
        rows.append(row)
    out += [table(head, rows), ""]

    # Ratios of medians, both from this VM run.
    head = ["device"] + [f"{h} / {ref}" for _, h, _ in JOBS
                         for ref in ("loop-dio", "loop-buffered")]
    rows = []
    for k in present:
        row = [LABEL[k]]
        for j, _, _ in JOBS:
            for ref in ("loop-dio", "loop-buffered"):
                v, r = cell(k, j, "value"), cell(ref, j, "value")
                row.append(fmt(v / r, 2) if v is not None and r else "–")
        rows.append(row)
    out += ["Ratios (of the medians above):\n", table(head, rows), ""]

    rows = []
    for k, j, ref, want in TARGETS:
        v, r = cell(k, j, "value"), cell(ref, j, "value")
        ratio = v / r if v is not None and r else None
        verdict = "–" if ratio is None else ("PASS" if ratio >= want else "MISS")
        rows.append([f"{LABEL[k]} / {LABEL[ref]}, {dict((a, b) for a, b, _ in JOBS)[j]}",
                     f"≥ {want:.1f}", fmt(ratio, 2), verdict])
    out += ["Targets:\n", table(["target", "wanted", "measured", ""], rows), ""]

    rows = [[LABEL[k]] + [span(k, j) for j, _, _ in JOBS] for k in present]
    out += ["Range over the rounds (min–max):\n",
            table(["device"] + [h for _, h, _ in JOBS], rows), ""]

    busy = [[LABEL[k]] + [fmt(cell(k, j, "busy_cpus"), 2) for j, _, _ in JOBS]
            for k in present]
    out += ["Busy guest CPUs during the job (of the vCPUs; fio included):\n",
            table(["device"] + [h for _, h, _ in JOBS], busy), ""]

    whole = sorted({(r["kind"], r["job"], r["round"]) for r in jobs
                    if r.get("window") == "whole"})
    if whole:
        out.append("- CPU over the whole run (too short a steady window): " +
                   ", ".join(f"{k} {j} round {n}" for k, j, n in whole))
    wrapped = sorted({(r["kind"], r["round"]) for r in jobs if r.get("wrapped")})
    if wrapped:
        out.append("- the 4 readers read past their quarter of the image (a buffered "
                   "kind may then hit the page cache): " +
                   ", ".join(f"{k} round {n}" for k, n in wrapped))
    for r in recs:
        if r["type"] == "skip":
            out.append(f"- skipped {r['kind']}: {r['text']}")
        elif r["type"] == "error":
            out.append(f"- FAILED round {r['round']} {r['kind']} {r['job']}: {r['text']}")
        elif r["type"] == "vm":
            out.append(f"- vm: {r['text']}")
    out.append("")
    for r in recs:
        if r["type"] == "profile":
            out += profile_section(r)
    return "\n".join(out)


def profile_section(r):
    out = [f"### Where the guest CPU went: {r['kind']}, {r['job']} (profiled job, "
           f"not in the medians)\n",
           f"{fmt(r['value'])} {'MiB/s' if r['job'] == 'seqread4' else 'IOPS'}, "
           f"{fmt(r['cpu_s_per_1k'], 3)} guest CPU s/1k req; /proc/stat over the "
           f"{r.get('window', 'whole')} window: "
           + ", ".join(f"{k[4:-2]} {r[k]:.2f} s" for k in
                       ("cpu_user_s", "cpu_nice_s", "cpu_system_s", "cpu_irq_s",
                        "cpu_softirq_s")) + f" in {r['wall_s']:.1f} s.\n",
           "Processes and kernel threads (/proc/PID/stat, utime + stime):\n",
           table(["thread", "CPU s"], [[n, f"{s:.2f}"] for n, s in r["processes_cpu_s"]]),
           "", "Softirqs: " + ", ".join(f"{k} {v:,}" for k, v in r["softirqs"].items()),
           "", "Interrupts: " + ", ".join(f"{k} {v:,}" for k, v in r["interrupts"].items()),
           ""]
    if r.get("perf_top"):
        out += ["perf (cpu-clock, system-wide):", "```"] + r["perf_top"] + ["```", ""]
    if r.get("perf_error"):
        out.append(f"perf: {r['perf_error']}\n")
    return out


def summarize(records, args_text, note):
    """The markdown report of RECORDS (each with its "series")."""
    out = ["# mloop kernel-path benchmark\n", f"`{args_text}`\n"]
    for series in sorted({r["series"] for r in records}, key=lambda s: [int(x) for x in s.split(".")]):
        out.append(series_section(series, [r for r in records if r["series"] == series], note))
    out += ["Guest CPU s/1k req: the guest's busy time (user + nice + system + irq + "
            "softirq, all vCPUs, fio itself included) per 1000 fio requests (4 KiB or "
            "1 MiB), both taken over the job's steady part, from the ramp's end to the end "
            "of fio's runtime (sampled every 0.25 s; the records also keep the whole run's "
            "as whole_cpu_s_per_1k). Under TCG every byte a guest CPU copies is expensive and "
            "the virtio disk's DMA is not, so a kind that copies in the guest pays twice: "
            "in its rate and in this column.", ""]
    return "\n".join(out)
