#!/usr/bin/env python3
"""Helper for bench/run: turns fio JSON and `perf stat -x,` output into
one JSON record per job, and the records of all rounds into the markdown
report.  Standard library only, so any python3 will do.

    report.py record    --round R --server S --workload W --fio F [--perf P]
    report.py pagecache --round R --server S --before KB --after KB --bytes B --fio F
    report.py note      --kind K [--server S] [--text T]
    report.py summarize RECORDS.jsonl --markdown OUT.md --rounds-json OUT.json

`record`, `pagecache` and `note` print one JSON line that bench/run
appends to a records file; `summarize` prints the report and writes it.
"""
import argparse
import json
import statistics
import sys

# Rows of the main table, in order: (key, label, kind).  kind is "mloop",
# "peer" (counts for "best peer") or "limit".  Keys are bench/run's names.
SERVERS = [
    ("mloop", "mloop threads=4", "mloop"),
    ("mloop-reaper", "mloop (reaper threads)", "variant"),
    ("file", "nbdkit file (buffered)", "peer"),
    ("file-nocache", "nbdkit file cache=none", "peer"),
    ("qemu-nbd", "qemu-nbd cache=none aio=native", "peer"),
    ("nbd-server", "nbd-server (buffered)", "peer"),
    ("raw", "raw file, fio libaio O_DIRECT (limit)", "limit"),
    ("null", "nbdkit null 4G (limit: no IO)", "limit"),
]
LABEL = {key: label for key, label, _ in SERVERS}
LABEL.update({"mloop-t1": "mloop threads=1", "mloop-t2": "mloop threads=2",
              "mloop-t8": "mloop threads=8"})

# Columns: (key, heading, unit, fio direction).
WORKLOADS = [
    ("randread", "4k randread QD64", "IOPS", "read"),
    ("seqread4", "4 × seq 1 MiB readers", "MiB/s", "read"),
    ("randwrite", "4k randwrite QD64", "IOPS", "write"),
    ("seqwrite", "seq 1 MiB write QD8", "MiB/s", "write"),
]
DIRECTION = {key: d for key, _, _, d in WORKLOADS}
UNIT = {key: u for key, _, u, _ in WORKLOADS}

SWEEP = [("mloop-t1", 1), ("mloop-t2", 2), ("mloop", 4), ("mloop-t8", 8)]
PAGECACHE_SERVERS = ["mloop", "file", "file-nocache", "qemu-nbd", "nbd-server"]


def load_fio(path):
    """fio's JSON output; fio may print warnings before the JSON itself."""
    with open(path) as f:
        text = f.read()
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in " + path)
    return json.loads(text[start:])


def fio_figures(path, direction):
    """(MiB/s, IOPS, total ios) of the first (group-reported) job."""
    job = load_fio(path)["jobs"][0]
    if job.get("error"):
        raise ValueError("fio job error %s" % job["error"])
    d = job[direction]
    return d["bw_bytes"] / 2**20, d["iops"], d["total_ios"]


def load_perf(path):
    """{event: value} from `perf stat -x, -o FILE`; task-clock is in ms."""
    events = {}
    with open(path) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) < 3 or line.startswith("#"):
                continue
            try:
                events[fields[2]] = float(fields[0])
            except ValueError:      # "<not counted>" / "<not supported>"
                pass
    return events


def cmd_record(a):
    rec = {"type": "job", "round": a.round, "server": a.server,
           "workload": a.workload}
    try:
        mibs, iops, total = fio_figures(a.fio, DIRECTION[a.workload])
        rec.update(value=iops if UNIT[a.workload] == "IOPS" else mibs,
                   iops=iops, mibs=mibs, total_ios=total)
    except (OSError, ValueError, KeyError, IndexError) as e:
        rec["error"] = "fio: %s" % e
        sys.stderr.write("bench:   %s %s: %s\n" % (a.server, a.workload,
                                                     rec["error"]))
        print(json.dumps(rec))
        return
    if a.perf:
        try:
            ev = load_perf(a.perf)
            # perf watched the server for the whole job, so every request
            # fio completed was served while it counted.
            requests = total
            rec.update(requests=requests,
                       context_switches=ev["context-switches"],
                       task_clock_ms=ev["task-clock"],
                       cs_per_req=ev["context-switches"] / requests,
                       cpu_ms_per_1000=ev["task-clock"] / requests * 1000)
        except (OSError, KeyError, ZeroDivisionError) as e:
            rec["perf_error"] = str(e)
    sys.stderr.write("bench:   %s %s: %.0f %s%s\n" % (
        a.server, a.workload, rec["value"], UNIT[a.workload],
        ", %.2f cs/req, %.1f CPU ms/1k req" % (rec["cs_per_req"],
                                                rec["cpu_ms_per_1000"])
        if "cs_per_req" in rec else ""))
    print(json.dumps(rec))


def cmd_pagecache(a):
    rec = {"type": "pagecache", "round": a.round, "server": a.server,
           "cached_before_kib": a.before, "cached_after_kib": a.after,
           "bytes_read": a.bytes}
    growth = (a.after - a.before) * 1024
    rec["growth_mib"] = growth / 2**20
    rec["growth_pct"] = 100.0 * growth / a.bytes
    try:
        rec["mibs"] = fio_figures(a.fio, "read")[0]
    except (OSError, ValueError, KeyError, IndexError) as e:
        rec["error"] = "fio: %s" % e
    print(json.dumps(rec))


def cmd_note(a):
    print(json.dumps({"type": a.kind, "server": a.server, "text": a.text}))


# ---------------------------------------------------------------- summary

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, unit):
    if v is None:
        return "–"
    if unit == "IOPS":
        return "{:,.0f}".format(v)
    if unit == "MiB/s":
        return "{:,.0f}".format(v)
    if unit == "ratio":
        return "{:.2f}".format(v)
    return "{:.{}f}".format(v, unit)     # unit = number of decimals


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def summarize(records):
    jobs = [r for r in records if r["type"] == "job"]
    meta = {}
    for r in records:
        if r["type"] == "meta":
            k, _, v = r["text"].partition("=")
            meta[k] = v
    skips = [r for r in records if r["type"] == "skip"]

    def cell(server, workload, field):
        vals = [j.get(field) for j in jobs
                if j["server"] == server and j["workload"] == workload]
        return median(vals)

    def cells_n(server, workload):
        return sum(1 for j in jobs if j["server"] == server
                   and j["workload"] == workload and "value" in j)

    present = {j["server"] for j in jobs}
    rounds = int(meta.get("rounds", 0) or 0)
    out = []
    out.append("# mloop benchmark\n")
    out.append("%s · %s · %s rounds × %s s per job · medians of the rounds\n"
               % (meta.get("date", "?"), meta.get("machine", "?"),
                  meta.get("rounds", "?"), meta.get("runtime", "?")))
    out.append("Client: fio %s `--ioengine=nbd` over a Unix socket "
               "(raw file: `--ioengine=libaio --direct=1`); image %s; "
               "page cache dropped before every job. %s; mloop at %s.\n"
               % (meta.get("fio", "?"), meta.get("image", "?"),
                  meta.get("nbdkit", "?"), meta.get("git", "?")))
    for s in skips:
        out.append("- skipped %s: %s" % (s["server"], s["text"]))
    if skips:
        out.append("")

    # 1. Throughput, absolute.
    head = ["server"] + ["%s %s" % (h, u) for _, h, u, _ in WORKLOADS]
    rows = []
    for key, label, _ in SERVERS:
        if key not in present:
            continue
        row = [label]
        for w, _, u, _ in WORKLOADS:
            v = cell(key, w, "value")
            n = cells_n(key, w)
            s = fmt(v, u)
            if v is not None and rounds and n < rounds:
                s += " (n=%d)" % n      # some rounds failed: say so
            row.append(s)
        rows.append(row)

    # Ratios: best peer per column, and the two limits.
    def ratio_row(title, pick):
        row = [title]
        for w, _, _, _ in WORKLOADS:
            m = cell("mloop", w, "value")
            ref, name = pick(w)
            row.append("–" if m is None or not ref else
                       "%.2f%s" % (m / ref, " (%s)" % name if name else ""))
        return row

    def best_peer(w):
        peers = [(cell(k, w, "value"), k) for k, _, kind in SERVERS
                 if kind == "peer" and k in present]
        peers = [p for p in peers if p[0] is not None]
        return max(peers) if peers else (None, None)

    rows.append(ratio_row("**mloop / best peer**", best_peer))
    rows.append(ratio_row("mloop / qemu-nbd (the other O_DIRECT server)",
                          lambda w: (cell("qemu-nbd", w, "value"), None)))
    rows.append(ratio_row("**mloop / raw file**",
                          lambda w: (cell("raw", w, "value"), None)))
    rows.append(ratio_row("**mloop / null**",
                          lambda w: (cell("null", w, "value"), None)))
    out.append("## Throughput (median of rounds)\n")
    out.append(table(head, rows) + "\n")
    out.append("Buffered peers (nbdkit file, nbd-server) acknowledge writes "
               "from the host page cache, and re-read from it once a "
               "time-based sequential reader wraps around its GiB.\n")

    # Spread, so a reader can tell a real gap from noise.
    rows = []
    for key, label, _ in SERVERS:
        if key not in present:
            continue
        row = [label]
        for w, _, u, _ in WORKLOADS:
            vals = [j["value"] for j in jobs if j["server"] == key
                    and j["workload"] == w and "value" in j]
            row.append("%s–%s" % (fmt(min(vals), u), fmt(max(vals), u))
                       if vals else "–")
        rows.append(row)
    out.append("Range across rounds (min–max):\n")
    out.append(table(head, rows) + "\n")

    # 2. CPU cost per request.
    head = ["server"]
    for _, h, _, _ in WORKLOADS:
        head += ["%s cs/req" % h, "CPU ms/1k req"]
    rows = []
    for key, label, kind in SERVERS:
        if key not in present or key == "raw":
            continue
        row = [label]
        for w, _, _, _ in WORKLOADS:
            row.append(fmt(cell(key, w, "cs_per_req"), 2))
            row.append(fmt(cell(key, w, "cpu_ms_per_1000"), 1))
        rows.append(row)
    out.append("## Server cost per request (median of rounds)\n")
    out.append("`perf stat -e context-switches,task-clock -p SERVER`, "
               "attached before fio connects and stopped when it exits (it "
               "follows the threads and processes the server creates), "
               "divided by fio's request count: context switches per "
               "request, and server CPU time (all threads, user + system) "
               "in ms per 1000 requests. No figures for the raw file: "
               "there is no server.\n")
    out.append(table(head, rows) + "\n")

    # 3. Threads sweep on the 4-reader workload.
    rows = []
    for key, n in SWEEP:
        if key not in present:
            continue
        rows.append([str(n), fmt(cell(key, "seqread4", "value"), "MiB/s"),
                     fmt(cell(key, "seqread4", "cs_per_req"), 2),
                     fmt(cell(key, "seqread4", "cpu_ms_per_1000"), 1)])
    out.append("## mloop threads sweep: 4 × seq 1 MiB readers\n")
    out.append(table(["threads=", "MiB/s", "cs/req", "CPU ms/1k req"], rows)
               + "\n")

    # 4. Page cache growth.
    pcs = [r for r in records if r["type"] == "pagecache"]
    rows = []
    for key in PAGECACHE_SERVERS:
        mine = [r for r in pcs if r["server"] == key]
        if not mine:
            continue
        rows.append([LABEL[key],
                     fmt(median(r["growth_mib"] for r in mine), 0),
                     fmt(median(r["growth_pct"] for r in mine), 1) + " %",
                     fmt(median(r.get("mibs") for r in mine), "MiB/s")])
    out.append("## Page cache: `Cached:` growth while reading the whole "
               "4 GiB image once (1 MiB, QD8)\n")
    out.append(table(["server", "Cached growth MiB", "% of bytes read",
                      "read MiB/s"], rows) + "\n")

    errors = [j for j in jobs if "error" in j or "perf_error" in j]
    if errors:
        out.append("Failed jobs (left out of the medians):\n")
        for j in errors:
            out.append("- round %s %s %s: %s" % (
                j["round"], j["server"], j["workload"],
                j.get("error") or "perf: " + j.get("perf_error", "")))
    return "\n".join(out) + "\n"


def cmd_summarize(a):
    with open(a.records) as f:
        records = [json.loads(line) for line in f if line.strip()]
    text = summarize(records)
    sys.stdout.write(text)
    with open(a.markdown, "w") as f:
        f.write(text)
    with open(a.rounds_json, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--round", type=int, required=True)
    r.add_argument("--server", required=True)
    r.add_argument("--workload", required=True, choices=list(DIRECTION))
    r.add_argument("--fio", required=True)
    r.add_argument("--perf")
    r.set_defaults(fn=cmd_record)
    c = sub.add_parser("pagecache")
    c.add_argument("--round", type=int, required=True)
    c.add_argument("--server", required=True)
    c.add_argument("--before", type=int, required=True)
    c.add_argument("--after", type=int, required=True)
    c.add_argument("--bytes", type=int, required=True)
    c.add_argument("--fio", required=True)
    c.set_defaults(fn=cmd_pagecache)
    n = sub.add_parser("note")
    n.add_argument("--kind", required=True)
    n.add_argument("--server")
    n.add_argument("--text", default="")
    n.set_defaults(fn=cmd_note)
    s = sub.add_parser("summarize")
    s.add_argument("records")
    s.add_argument("--markdown", required=True)
    s.add_argument("--rounds-json", required=True)
    s.set_defaults(fn=cmd_summarize)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
