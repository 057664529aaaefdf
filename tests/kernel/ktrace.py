#!/usr/bin/python3
"""The kernel's side of a request's story, for the kernel tests: the
guest's tracepoints, and how to line them up with the servers' per-request
trace (nbd/trace.h, MLOOP_TRACE).

  ktrace.py start               in the guest: turn the tracepoints on
  ktrace.py save DIR            in the guest: write the trace to DIR/kernel.trace
  ktrace.py report KTRACE STRACE  on either side: every request the kernel
                                sent and never saw answered, and unmatched
                                replies, with what the server did

What is traced: events/nbd (send_request, header_sent, payload_sent,
header_received, payload_received), the block layer's issue, requeue and
complete (every disk: the servers' own IO to the scratch disk too),
signals generated (a signal to a task sending an nbd request interrupts
the send), and when nbd's receive work items (one per connection, each
reading that connection's replies for as long as it lives) are queued and
start and end running, and on which thread.  trace_clock is "mono", so the timestamps are CLOCK_MONOTONIC
seconds, the clock of the servers' trace.

The handle the kernel prints is (cookie << 32 | tag); on the wire 6.1
writes it in host (little-endian) order and 6.12 big-endian, and the
servers print the wire bytes, so both byte orders are tried.
"""
import collections
import os
import re
import shutil
import sys

TRACING = "/sys/kernel/tracing"
EVENTS = ["nbd", "block/block_rq_issue", "block/block_rq_requeue",
          "block/block_rq_complete", "signal/signal_generate"]
BUFFER_KB = 8192  # per CPU


def _write(name, value):
    with open(os.path.join(TRACING, name), "w") as f:
        f.write(value)


def _kernel_symbol(name, module):
    """The address of a module's function, from /proc/kallsyms, or None."""
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                w = line.split()
                if len(w) >= 4 and w[2] == name and w[3] == f"[{module}]" and int(w[0], 16):
                    return int(w[0], 16)
    except OSError:
        pass
    return None


def start():
    """Turns the tracepoints on; returns a reason string if it cannot."""
    if not os.path.isdir(os.path.join(TRACING, "events", "nbd")):
        return f"no {TRACING}/events/nbd (tracefs not mounted, or nbd not loaded)"
    _write("tracing_on", "0")
    _write("trace_clock", "mono")
    _write("buffer_size_kb", str(BUFFER_KB))
    _write("trace", "")
    for e in EVENTS:
        _write(os.path.join("events", e, "enable"), "1")
    # nbd's per-connection receive work: queued on its "nbdN-recv"
    # workqueue, and run by a kworker or by that workqueue's rescuer.
    recv_work = _kernel_symbol("recv_work", "nbd")
    wq = os.path.join("events", "workqueue")
    if os.path.isdir(os.path.join(TRACING, wq)):
        _write(os.path.join(wq, "workqueue_queue_work", "filter"), 'workqueue ~ "nbd*"')
        _write(os.path.join(wq, "workqueue_queue_work", "enable"), "1")
        if recv_work:
            for e in ("workqueue_execute_start", "workqueue_execute_end"):
                _write(os.path.join(wq, e, "filter"), f"function == {recv_work:#x}")
                _write(os.path.join(wq, e, "enable"), "1")
    _write("tracing_on", "1")
    return None


def save(outdir):
    """Stops tracing and copies the trace into OUTDIR/kernel.trace."""
    _write("tracing_on", "0")
    with open(os.path.join(TRACING, "trace"), "rb") as src, \
            open(os.path.join(outdir, "kernel.trace"), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


# "  comm-pid  [cpu] flags  12.345678: event: text"
KLINE = re.compile(r"^\s*(?P<task>.+?)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+):"
                   r"\s+(?P<event>\w+):\s+(?P<text>.*)$")
KHANDLE = re.compile(r"request (?P<req>[0-9a-fx]+), handle 0x(?P<handle>[0-9a-f]+)")
# See nbd/trace.h.
SLINE = re.compile(r"^(?P<ts>\d+\.\d+) (?P<pid>\d+)/(?P<tid>\d+) (?P<event>\w+) "
                   r"conn=(?P<conn>\d+) (?:cookie=(?P<cookie>[0-9a-f]{16})|seq=\d+) "
                   r"(?P<cmd>\S+) (?P<off>\d+)\+(?P<len>\d+)")


def _swap64(h):
    return int.from_bytes(h.to_bytes(8, "big"), "little")


def parse_kernel(path):
    """{handle: [(time, event, task, req)]} for the nbd transport events,
    and the other lines worth showing (requeues, signals) with times."""
    by_handle = collections.defaultdict(list)
    other = []
    with open(path, errors="replace") as f:
        for line in f:
            m = KLINE.match(line)
            if not m:
                continue
            ev, ts = m.group("event"), float(m.group("ts"))
            h = KHANDLE.search(m.group("text"))
            if ev.startswith("nbd_") and h:
                by_handle[int(h.group("handle"), 16)].append(
                    (ts, ev, m.group("task").strip(), h.group("req")))
            elif ev in ("block_rq_requeue", "signal_generate") or ev.startswith("workqueue_"):
                other.append((ts, ev, m.group("task").strip(), m.group("text")))
    return by_handle, other


def parse_server(path):
    """{cookie as int: [(time, event, cmd, offset, length, pid)]}."""
    by_cookie = collections.defaultdict(list)
    with open(path, errors="replace") as f:
        for line in f:
            m = SLINE.match(line)
            if m and m.group("cookie"):
                by_cookie[int(m.group("cookie"), 16)].append(
                    (float(m.group("ts")), m.group("event"), m.group("cmd"),
                     int(m.group("off")), int(m.group("len")), m.group("pid")))
    return by_cookie


def report(ktrace, strace=None):
    """Lines describing each request the kernel sent and never saw a reply
    header for, what the server did with its cookie, and the replies the
    server sent that the kernel never matched."""
    kernel, other = parse_kernel(ktrace)
    server = parse_server(strace) if strace and os.path.exists(strace) else {}
    lines = []

    def server_story(handle):
        for key in (handle, _swap64(handle)):
            if key in server:
                return ", ".join(f"{ev} {ts:.6f}" for ts, ev, *_ in server[key]) + \
                    f" ({server[key][0][2]} {server[key][0][3]}+{server[key][0][4]})"
        return "never received by the server" if server else "no server trace"

    seen_by_kernel = set()
    for handle, evs in kernel.items():
        names = [e[1] for e in evs]
        seen_by_kernel.add(handle)
        seen_by_kernel.add(_swap64(handle))
        if "nbd_header_sent" in names and "nbd_header_received" not in names:
            sent = [e for e in evs if e[1] == "nbd_header_sent"]
            lines.append(f"kernel sent handle {handle:#018x} (req {sent[0][3]}) at "
                         f"{sent[0][0]:.6f} from {sent[0][2]}, never matched a reply; "
                         f"server: {server_story(handle)}")
    for cookie, evs in server.items():
        if cookie not in seen_by_kernel and any(e[1] == "reply" for e in evs):
            lines.append(f"server replied to cookie {cookie:016x} "
                         f"({evs[0][2]} {evs[0][3]}+{evs[0][4]}), which the kernel never "
                         f"sent or never matched: " +
                         ", ".join(f"{ev} {ts:.6f}" for ts, ev, *_ in evs))
    if lines:
        for ts, ev, task, text in other:
            lines.append(f"kernel {ev} at {ts:.6f} ({task}): {text}")
    return lines


def main(argv):
    if argv[1:2] == ["start"]:
        reason = start()
        if reason:
            print(f"ktrace: not tracing: {reason}", file=sys.stderr)
        return 0
    if argv[1:2] == ["save"] and len(argv) == 3:
        if os.path.exists(os.path.join(TRACING, "trace")):
            save(argv[2])
        return 0
    if argv[1:2] == ["report"] and len(argv) in (3, 4):
        for line in report(*argv[2:]):
            print(line)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
