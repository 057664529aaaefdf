#!/usr/bin/env python3
"""Helper for bench/run: turns fio JSON and `perf stat -x,` output into
one JSON record per job, and the records of all rounds into the markdown
report.  Standard library only, so any python3 will do.

    report.py record    --round R --server S --workload W --fio F [--perf P]
    report.py pagecache --round R --server S --before KB --after KB --bytes B --fio F
    report.py note      --kind K [--server S] [--text T]
    report.py space     --round R --server S --op OP --result F
    report.py summarize RECORDS.jsonl --markdown OUT.md --rounds-json OUT.json
                        [--svg OUT.svg]

`record`, `pagecache`, `space` and `note` print one JSON line that bench/run
appends to a records file; `summarize` prints the report and writes it.
"""
import argparse
import html
import json
import statistics
import sys

# Rows of the main table, in order: (key, label, kind).  kind is "mloop",
# "peer" (counts for "best peer") or "limit".  Keys are bench/run's names.
SERVERS = [
    ("mloop", "mloop threads=4", "mloop"),
    ("native", "mloop-server threads=4", "mloop"),
    ("mloop-reaper", "mloop (reaper threads)", "variant"),
    # BENCH_BASELINE: the same two servers built from another commit.
    ("mloop-base", "mloop threads=4, baseline build", "variant"),
    ("native-base", "mloop-server threads=4, baseline build", "variant"),
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

# Space workloads: (op, heading).  Servers: the two mloop servers, then peers.
SPACE_OPS = [("zero", "zero 1 GiB s"), ("trim", "trim 1 GiB s"),
             ("copy", "nbdcopy sparse 8 GiB s")]
SPACE_SERVERS = [("mloop", "mloop threads=4 (plugin)", "mloop"),
                 ("native", "mloop-server threads=4", "mloop"),
                 ("mloop-base", "mloop threads=4 (plugin), baseline build",
                  "variant"),
                 ("native-base", "mloop-server threads=4, baseline build",
                  "variant"),
                 ("file", "nbdkit file", "peer"),
                 ("qemu-nbd", "qemu-nbd cache=none aio=native discard=unmap",
                  "peer")]
# Peers that write with O_DIRECT: the randwrite target's reference.
ODIRECT_PEERS = ["file-nocache", "qemu-nbd"]

# The TCP section: the same servers listening on 127.0.0.1, fio's nbd engine
# on nbd://127.0.0.1:PORT/.  Same kinds as SERVERS; "mloop / best peer"
# takes the best of the three peers.  TCP_UNIX pairs each mloop TCP row with
# its Unix-socket row of the same run, for the TCP / Unix ratio.
TCP_SERVERS = [
    ("native-tcp", "mloop-server threads=4", "mloop"),
    ("mloop-tcp", "mloop plugin threads=4 (nbdkit)", "mloop"),
    ("file-tcp", "nbdkit file (buffered)", "peer"),
    ("file-nocache-tcp", "nbdkit file cache=none", "peer"),
    ("qemu-nbd-tcp", "qemu-nbd cache=none aio=native", "peer"),
    ("null-tcp", "nbdkit null 4G (limit: no IO)", "limit"),
]
TCP_UNIX = [("native-tcp", "native", "mloop-server"),
            ("mloop-tcp", "mloop", "mloop plugin")]

# The TLS section: the same, with TLS (X.509, --tls require or its like) on
# nbds://127.0.0.1:PORT/.  TLS_PLAIN pairs each mloop TLS row with its
# plain TCP row of the same run, for what TLS costs.
TLS_SERVERS = [
    ("native-tls", "mloop-server threads=4", "mloop"),
    ("mloop-tls", "mloop plugin threads=4 (nbdkit)", "mloop"),
    ("file-tls", "nbdkit file (buffered)", "peer"),
    ("file-nocache-tls", "nbdkit file cache=none", "peer"),
    ("qemu-nbd-tls", "qemu-nbd cache=none aio=native", "peer"),
    ("null-tls", "nbdkit null 4G (limit: no IO)", "limit"),
]
TLS_PLAIN = [("native-tls", "native-tcp", "mloop-server"),
             ("mloop-tls", "mloop-tcp", "mloop plugin")]

# What differs between the two network sections (network_section).
TCP_SECTION = {
    "suffix": "-tcp", "servers": TCP_SERVERS, "refs": TCP_UNIX,
    "transport": "TCP", "ref_transport": "its Unix socket",
    "ref_label": "%s, Unix socket (same run)", "null": "null-tcp",
    "title": "## Serving over TCP on 127.0.0.1 (median of rounds)\n",
    "intro": "Every server listens on 127.0.0.1 only, a free port each; "
             "fio's nbd engine connects to `nbd://127.0.0.1:PORT/`. Best "
             "TCP peer: the best of nbdkit file, file cache=none and qemu-nbd "
             "over TCP in that column.\n",
}
TLS_SECTION = {
    "suffix": "-tls", "servers": TLS_SERVERS, "refs": TLS_PLAIN,
    "transport": "TLS", "ref_transport": "its plain TCP",
    "ref_label": "%s, plain TCP (same run)", "null": "null-tls",
    "title": "## Serving over TLS on 127.0.0.1 (median of rounds)\n",
    "intro": "The TCP servers again, each with TLS required and the same "
             "X.509 certificate (a throwaway CA, a server certificate for "
             "127.0.0.1; TLS 1.3 as GnuTLS negotiates it); fio's nbd "
             "engine connects to `nbds://127.0.0.1:PORT/` and libnbd checks "
             "the certificate against the CA. Best TLS peer: the best of "
             "nbdkit file, file cache=none and qemu-nbd with TLS in that "
             "column.\n",
}

SWEEP = [("mloop-t1", 1), ("mloop-t2", 2), ("mloop", 4), ("mloop-t8", 8)]
PAGECACHE_SERVERS = ["mloop", "native", "file", "file-nocache", "qemu-nbd", "nbd-server"]


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


def cmd_space(a):
    rec = {"type": "space", "round": a.round, "server": a.server, "op": a.op}
    try:
        with open(a.result) as f:
            res = json.loads(f.read().strip().splitlines()[-1])
        if "seconds" in res:
            rec["seconds"] = res["seconds"]
        else:
            rec["error"] = res.get("error") or res.get("skipped") or "no result"
    except (OSError, ValueError, IndexError) as e:
        rec["error"] = "no result: %s" % e
    sys.stderr.write("bench:   %s %s: %s\n" % (
        a.server, a.op, "%.2f s" % rec["seconds"] if "seconds" in rec
        else rec["error"]))
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
    only = meta.get("only", "")
    tcp_only = only == "tcp"
    # BENCH_ONLY=tcp, tls or space runs no Unix-socket table.
    unix_tables = only in ("", "unix")
    out = []
    out.append("# mloop benchmark\n")
    out.append("%s · %s · %s rounds × %s s per job · medians of the rounds\n"
               % (meta.get("date", "?"), meta.get("machine", "?"),
                  meta.get("rounds", "?"), meta.get("runtime", "?")))
    if tcp_only:
        client = ("over TCP, `nbd://127.0.0.1:PORT/` (TCP section only: "
                  "BENCH_ONLY=tcp; the two mloop servers also on their Unix "
                  "sockets, for reference)")
    elif not unix_tables:
        client = ("(BENCH_ONLY=%s: only those sections; TCP: "
                  "`nbd://127.0.0.1:PORT/`, TLS: `nbds://127.0.0.1:PORT/`)"
                  % only)
    else:
        client = ("over a Unix socket (raw file: `--ioengine=libaio "
                  "--direct=1`; TCP section: `nbd://127.0.0.1:PORT/`)")
    out.append("Client: fio %s `--ioengine=nbd` %s; image %s; "
               "page cache dropped before every job. %s; mloop at %s.\n"
               % (meta.get("fio", "?"), client, meta.get("image", "?"),
                  meta.get("nbdkit", "?"), meta.get("git", "?")))
    for s in skips:
        out.append("- skipped %s: %s" % (s["server"], s["text"]))
    if skips:
        out.append("")

    # The Unix-socket sections; a TCP-only run (BENCH_ONLY=tcp) has none.
    space = [r for r in records if r["type"] == "space"]
    if unix_tables:
        # 1. Throughput, absolute.
        head = ["server"] + ["%s %s" % (h, u) for _, h, u, _ in WORKLOADS]
        def server_rows(text):
            """One row per server present: its label, then TEXT(key, workload,
            unit) for every workload column."""
            return [[label] + [text(key, w, u) for w, _, u, _ in WORKLOADS]
                    for key, label, _ in SERVERS if key in present]

        def median_text(key, w, u):
            v = cell(key, w, "value")
            n = cells_n(key, w)
            s = fmt(v, u)
            if v is not None and rounds and n < rounds:
                s += " (n=%d)" % n      # some rounds failed: say so
            return s

        def range_text(key, w, u):
            vals = [j["value"] for j in jobs if j["server"] == key
                    and j["workload"] == w and "value" in j]
            return ("%s–%s" % (fmt(min(vals), u), fmt(max(vals), u))
                    if vals else "–")

        rows = server_rows(median_text)

        # Ratios: best peer per column, and the two limits.
        def ratio_row(title, pick, subject="mloop"):
            row = [title]
            for w, _, _, _ in WORKLOADS:
                m = cell(subject, w, "value")
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
        if "native" in present:
            rows.append(ratio_row("**mloop-server / best peer**", best_peer,
                                  "native"))
            rows.append(ratio_row("**mloop-server / null**",
                                  lambda w: (cell("null", w, "value"), None),
                                  "native"))
        if "mloop-base" in present:
            rows.append(ratio_row("**mloop / its baseline build**",
                                  lambda w: (cell("mloop-base", w, "value"),
                                             None)))
        if "native-base" in present:
            rows.append(ratio_row("**mloop-server / its baseline build**",
                                  lambda w: (cell("native-base", w, "value"),
                                             None), "native"))
        out.append("## Throughput (median of rounds)\n")
        out.append(table(head, rows) + "\n")
        out.append("Buffered peers (nbdkit file, nbd-server) acknowledge writes "
                   "from the host page cache, and re-read from it once a "
                   "time-based sequential reader wraps around its GiB.\n")

        # Spread, so a reader can tell a real gap from noise.
        rows = server_rows(range_text)
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

        # 5. The native server against its targets.
        if "native" in present:
            out.append(native_targets(cell, best_peer, pcs))

    # 6. Space workloads.
    if space:
        out.append(space_table(space))

    # 7. Serving over TCP on 127.0.0.1, then 8. over TLS.
    # (A tls run has plain TCP rows only as the TLS section's reference.)
    for section in (TCP_SECTION, TLS_SECTION):
        if only == "tls" and section is TCP_SECTION:
            continue
        if present & {k for k, _, _ in section["servers"]}:
            out.append(network_section(cell, jobs, present, rounds, section))

    errors = [j for j in jobs if "error" in j or "perf_error" in j]
    if errors:
        out.append("Failed jobs (left out of the medians):\n")
        for j in errors:
            out.append("- round %s %s %s: %s" % (
                j["round"], j["server"], j["workload"],
                j.get("error") or "perf: " + j.get("perf_error", "")))
    for r in space:
        if "error" in r:
            out.append("- space round %s %s %s: %s" % (
                r["round"], r["server"], r["op"], r["error"]))
    return "\n".join(out) + "\n"


def network_section(cell, jobs, present, rounds, section):
    """Servers on 127.0.0.1 (TCP_SECTION or TLS_SECTION) × workloads:
    medians, ratios, ranges, cost."""
    def vals(key, w):
        return [j["value"] for j in jobs if j["server"] == key
                and j["workload"] == w and "value" in j]

    transport = section["transport"]
    workloads = [(w, h, u) for w, h, u, _ in WORKLOADS
                 if any(j["workload"] == w for j in jobs
                        if j["server"].endswith(section["suffix"]))]
    servers = [(k, "%s, %s" % (label, transport), kind)
               for k, label, kind in section["servers"] if k in present]
    # The mloop servers' rows of the same run on the plainer transport,
    # for reference.
    refs = [(u, section["ref_label"] % name)
            for t, u, name in section["refs"] if t in present and u in present]
    head = ["server"] + ["%s %s" % (h, u) for _, h, u in workloads]

    def best_peer(w):
        peers = [(cell(k, w, "value"), k) for k, _, kind in servers
                 if kind == "peer"]
        peers = [p for p in peers if p[0] is not None]
        return max(peers) if peers else (None, None)

    def ratio(a, b):
        return "%.2f" % (a / b) if a is not None and b else "–"

    def med(k, w, u):
        v, n = cell(k, w, "value"), len(vals(k, w))
        return fmt(v, u) + (" (n=%d)" % n if v is not None and rounds
                            and n < rounds else "")

    rows = [[label] + [med(k, w, u) for w, _, u in workloads]
            for k, label, _ in servers]
    rows += [[label] + [med(k, w, u) for w, _, u in workloads]
             for k, label in refs]
    for key, _, name in section["refs"]:
        if key not in present:
            continue
        row = ["**%s %s / best %s peer**" % (name, transport, transport)]
        for w, _, _ in workloads:
            ref, peer = best_peer(w)
            r = ratio(cell(key, w, "value"), ref)
            row.append(r + (" (%s)" % peer if r != "–" else ""))
        rows.append(row)
    null = section["null"]
    for key, _, name in section["refs"]:
        if key in present and null in present:
            rows.append(["%s %s / null %s" % (name, transport, transport)] +
                        [ratio(cell(key, w, "value"),
                               cell(null, w, "value"))
                         for w, _, _ in workloads])
    for key, ref, name in section["refs"]:
        if key in present and ref in present:
            rows.append(["%s %s / %s" % (name, transport,
                                          section["ref_transport"])] +
                        [ratio(cell(key, w, "value"), cell(ref, w, "value"))
                         for w, _, _ in workloads])
    out = [section["title"], section["intro"], table(head, rows) + "\n"]

    def rng(k, w, u):
        v = vals(k, w)
        return "%s–%s" % (fmt(min(v), u), fmt(max(v), u)) if v else "–"

    rows = [[label] + [rng(k, w, u) for w, _, u in workloads]
            for k, label, _ in servers]
    rows += [[label] + [rng(k, w, u) for w, _, u in workloads]
             for k, label in refs]
    out += ["Range across rounds (min–max):\n", table(head, rows) + "\n"]

    chead = ["server"]
    for _, h, _ in workloads:
        chead += ["%s cs/req" % h, "CPU ms/1k req"]
    rows = []
    for k, label in [(k, label) for k, label, _ in servers] + refs:
        row = [label]
        for w, _, _ in workloads:
            row.append(fmt(cell(k, w, "cs_per_req"), 2))
            row.append(fmt(cell(k, w, "cpu_ms_per_1000"), 1))
        rows.append(row)
    out += ["Server cost per request over %s (median of rounds; as in the "
            "Unix-socket cost table):\n" % transport,
            table(chead, rows) + "\n"]
    return "\n".join(out) + "\n"


def verdict(ok):
    return "–" if ok is None else ("**PASS**" if ok else "**MISS**")


def native_targets(cell, best_peer, pcs):
    """Table of mloop-server's targets: figure, target, PASS/MISS."""
    rows = []

    def ratio(w, ref):
        v = cell("native", w, "value")
        return v / ref if v is not None and ref else None

    def add(what, value, target, ok, decimals=2):
        rows.append([what, fmt(value, decimals), target,
                     verdict(None if value is None else ok(value))])

    ref, name = best_peer("randread")
    add("4k randread / best peer (%s)" % name, ratio("randread", ref),
        "≥ 2.50", lambda v: v >= 2.5)
    add("4k randread / nbdkit null", ratio("randread", cell("null", "randread",
                                                              "value")),
        "≥ 0.90", lambda v: v >= 0.9)
    ref, name = best_peer("seqread4")
    add("4 × seq 1 MiB readers / best peer (%s)" % name,
        ratio("seqread4", ref), "≥ 1.30", lambda v: v >= 1.3)
    od = [(cell(k, "randwrite", "value"), k) for k in ODIRECT_PEERS]
    od = [p for p in od if p[0] is not None]
    ref, name = max(od) if od else (None, None)
    add("4k randwrite / best O_DIRECT peer (%s)" % name,
        ratio("randwrite", ref), "≥ 2.00", lambda v: v >= 2.0)
    add("4k randread context switches / request",
        cell("native", "randread", "cs_per_req"), "≤ 0.20",
        lambda v: v <= 0.2)
    add("4k randread server CPU ms / 1000 requests",
        cell("native", "randread", "cpu_ms_per_1000"), "≤ 15.0",
        lambda v: v <= 15.0, 1)
    mine = [r for r in pcs if r["server"] == "native"]
    g = median(r["growth_pct"] for r in mine) if mine else None
    rows.append(["page cache growth, % of bytes read",
                 "–" if g is None else fmt(g, 1) + " %", "< 5 %",
                 verdict(None if g is None else g < 5.0)])
    return ("## mloop-server (native) against its targets (medians)\n\n"
            + table(["target", "measured", "required", "result"], rows)
            + "\n")


def space_table(space):
    """Seconds per server × op, and mloop / best peer (peer s / mloop s)."""
    def secs(server, op):
        return median(r.get("seconds") for r in space
                      if r["server"] == server and r["op"] == op)

    present = {r["server"] for r in space}
    head = ["server"] + [h for _, h in SPACE_OPS]
    rows = []
    for key, label, _ in SPACE_SERVERS:
        if key in present:
            rows.append([label] + [fmt(secs(key, op), 3) for op, _ in SPACE_OPS])

    def best_peer(op):
        peers = [(secs(k, op), k) for k, _, kind in SPACE_SERVERS
                 if kind == "peer" and k in present]
        peers = [p for p in peers if p[0] is not None]
        return min(peers) if peers else (None, None)

    for key, title in (("mloop", "**mloop / best peer**"),
                       ("native", "**mloop-server / best peer**")):
        if key not in present:
            continue
        row = [title]
        for op, _ in SPACE_OPS:
            m = secs(key, op)
            ref, name = best_peer(op)
            if m is None or ref is None:
                row.append("–")
            else:
                r = ref / m if m > 0 else float("inf")
                row.append("%.2f (%s) %s" % (r, name, verdict(r >= 1.0)))
        rows.append(row)
    return ("## Space: zero / trim 1 GiB of allocated data, nbdcopy of a "
            "sparse 8 GiB image (seconds, median of rounds)\n\n"
            "Zero and trim: one fresh 2 GiB image whose first GiB is data, "
            "per job; WRITE_ZEROES / TRIM of [0, 1 GiB) in 1 GiB requests, "
            "then FLUSH. Copy: `nbdcopy URI null:` of an 8 GiB image with "
            "3 × 64 MiB of data. Ratio = best peer's seconds / mloop's "
            "(≥ 1.00: mloop no slower, PASS).\n\n"
            + table(head, rows) + "\n")


def svg_chart(records, path):
    """Two bar panels: 4k randread IOPS and server CPU ms per 1000 requests,
    one bar per server, plain SVG text."""
    jobs = [r for r in records if r["type"] == "job"
            and r["workload"] == "randread"]

    def med(key, field):
        return median(j.get(field) for j in jobs if j["server"] == key)

    bars = [(LABEL[k], med(k, "value"), med(k, "cpu_ms_per_1000"), kind)
            for k, _, kind in SERVERS if any(j["server"] == k for j in jobs)]
    colour = {"mloop": "#d62728", "peer": "#1f77b4", "limit": "#7f7f7f",
              "variant": "#ff9896"}
    lw, bw, bh, gap, top = 300, 260, 18, 6, 50
    width = lw + 2 * (bw + 90)
    height = top + len(bars) * (bh + gap) + 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="18" font-size="14" font-weight="bold">4k random '
           'read QD64: IOPS and server CPU per 1000 requests (median of '
           'rounds)</text>']
    for panel, (title, idx, dec) in enumerate(
            (("IOPS (higher is better)", 1, 0),
             ("server CPU ms / 1000 req (lower is better)", 2, 1))):
        x0 = lw + panel * (bw + 90)
        vmax = max([b[idx] for b in bars if b[idx] is not None] or [1])
        out.append('<text x="%d" y="40" font-weight="bold">%s</text>'
                   % (x0, html.escape(title)))
        for i, b in enumerate(bars):
            y = top + i * (bh + gap)
            if panel == 0:
                out.append('<text x="%d" y="%d" text-anchor="end">%s</text>'
                           % (lw - 8, y + bh - 5, html.escape(b[0])))
            v = b[idx]
            if v is None:
                out.append('<text x="%d" y="%d" fill="#777">n/a</text>'
                           % (x0 + 2, y + bh - 5))
                continue
            w = max(1.0, bw * v / vmax)
            out.append('<rect x="%d" y="%d" width="%.1f" height="%d" '
                       'fill="%s"/>' % (x0, y, w, bh, colour.get(b[3], "#999")))
            out.append('<text x="%.1f" y="%d">%s</text>'
                       % (x0 + w + 4, y + bh - 5,
                          "{:,.{}f}".format(v, dec)))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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
    if a.svg:
        svg_chart(records, a.svg)


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
    sp = sub.add_parser("space")
    sp.add_argument("--round", type=int, required=True)
    sp.add_argument("--server", required=True)
    sp.add_argument("--op", required=True,
                    choices=[op for op, _ in SPACE_OPS])
    sp.add_argument("--result", required=True)
    sp.set_defaults(fn=cmd_space)
    n = sub.add_parser("note")
    n.add_argument("--kind", required=True)
    n.add_argument("--server")
    n.add_argument("--text", default="")
    n.set_defaults(fn=cmd_note)
    s = sub.add_parser("summarize")
    s.add_argument("records")
    s.add_argument("--markdown", required=True)
    s.add_argument("--rounds-json", required=True)
    s.add_argument("--svg")
    s.set_defaults(fn=cmd_summarize)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
