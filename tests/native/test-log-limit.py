#!/usr/bin/python3
"""mloop-server bounds the log lines clients can repeat, all of them
together (server/log_limit.h): at most LINES in any INTERVAL, and a line
saying how many were suppressed, so that what was logged and what was
counted as suppressed add up to every event.

1. Refused connections from many addresses: --max-connections 1 held by
   one client, then connections from 2,000 source addresses of 127/8 (a
   /64 of IPv6 addresses is one attacker): each refused, and the log
   stays within the bound.  Before the bound was global, each address
   had its own: 5,429 lines for 20,000 addresses in 3.8 s.
2. Failed reads: the image shrunk under the server, 2,000 reads past its
   new end, each failing with an error: the log stays within the bound
   (one line per failure before: 2,003 lines in 0.1 s).
3. The log file's size: a log that has reached LOG_FILE_BYTES (a
   device's server.log is on /run, in RAM, and a client makes the
   server log for as long as it runs) is emptied before the next line,
   which a line says; before, it grew by every line, without end.
"""
import os
import re
import socket
import time

import nbd

import harness
import netserver

LINES, INTERVAL = 20, 10        # server/log_limit.h
LOG_FILE_BYTES = 256 * 1024     # server/log_limit.h
ADDRESSES = 2000
READS = 2000
SUPPRESSED = re.compile(r"mloop-server: (\d+) similar log line\(s\) suppressed")


def counts(text, what):
    """(lines containing WHAT, the suppressed counts summed, all lines)."""
    lines = text.splitlines()
    logged = sum(what in line for line in lines)
    suppressed = sum(int(m.group(1)) for m in map(SUPPRESSED.search, lines) if m)
    return logged, suppressed, len(lines)


def within_bound(total_lines, seconds):
    """Lines the bound allows over SECONDS: LINES a window and a
    suppressed-count line each, for every window the run touched, and
    the one at exit."""
    windows = int(seconds // INTERVAL) + 2
    return total_lines <= windows * (LINES + 1) + 1


image = harness.make_image(4 << 20)

# 1. Refusals from many addresses.
srv = netserver.NetServer(image, ["--max-connections", "1"])
held = nbd.NBD()
held.connect_tcp(*map(str, srv.addr))
harness.on_exit(lambda: netserver.disconnect(held))
start = time.monotonic()
refused = 0
for i in range(ADDRESSES):
    s = socket.socket()
    s.bind((f"127.1.{i // 250}.{i % 250 + 1}", 0))
    s.settimeout(10)
    s.connect(srv.addr)
    if s.recv(1) == b"":        # closed before the greeting: refused
        refused += 1
    s.close()
elapsed = time.monotonic() - start
assert refused == ADDRESSES, f"only {refused} of {ADDRESSES} connections refused"
netserver.disconnect(held)
srv.stop()                      # the count still unsaid is said at exit
logged, suppressed, total = counts(srv.log_text(), "refused a connection")
assert logged + suppressed == ADDRESSES, \
    f"{logged} refusals logged and {suppressed} counted as suppressed, not {ADDRESSES}"
assert within_bound(total, elapsed), \
    f"{total} log lines for {ADDRESSES} refusals in {elapsed:.1f} s"
print(f"ok: {ADDRESSES} refusals from as many addresses in {elapsed:.1f} s: "
      f"{logged} lines, {suppressed} counted as suppressed, {total} lines in all")

# 2. Failed reads past the end of an image shrunk under the server.
srv = netserver.NetServer(image)
h = nbd.NBD()
h.connect_tcp(*map(str, srv.addr))
harness.on_exit(lambda: netserver.disconnect(h))
os.truncate(image, 1 << 20)
start = time.monotonic()
failed = 0
for i in range(READS):
    try:
        h.pread(4096, (2 << 20) + (i % 256) * 4096)
    except nbd.Error:
        failed += 1
elapsed = time.monotonic() - start
netserver.disconnect(h)
srv.stop()
assert failed == READS, f"only {failed} of {READS} reads past the end failed"
logged, suppressed, total = counts(srv.log_text(), "error: read")
assert logged + suppressed == READS, \
    f"{logged} failed reads logged and {suppressed} counted as suppressed, not {READS}"
assert within_bound(total, elapsed), f"{total} log lines for {READS} failed reads"
print(f"ok: {READS} failed reads in {elapsed:.1f} s: {logged} lines, {suppressed} "
      f"counted as suppressed, {total} lines in all")

# 3. A log that reached its bound is emptied before the next line.
os.truncate(image, 4 << 20)
filler = b"an earlier line\n" * (LOG_FILE_BYTES // 16)
srv = netserver.NetServer(image, log_start=filler)
h = nbd.NBD()
h.connect_tcp(*map(str, srv.addr))
os.truncate(image, 1 << 20)
for i in range(3):
    try:
        h.pread(4096, 2 << 20)
    except nbd.Error:
        pass
netserver.disconnect(h)
srv.stop()
size = os.path.getsize(srv.log)
text = srv.log_text()
assert size < LOG_FILE_BYTES and "an earlier line" not in text and \
    f"the log reached {LOG_FILE_BYTES} bytes" in text and "error: read" in text, \
    f"a log of {LOG_FILE_BYTES} bytes was {size} bytes after 3 failed reads: {text[-300:]!r}"
print(f"ok: a full log was emptied before the next line: {size} bytes after it")
