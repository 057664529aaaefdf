#!/usr/bin/python3
"""Large requests leave no large buffers behind.

Two connections each send 8 concurrent reads of the largest size the
server advertises (64 MiB for the plugin).  Once every reply is in, the
server's resident memory must be back near where it started: bounce and
request buffers above 1 MiB are given back when their request is done,
not kept per thread (keeping each nbdkit thread's largest bounce buffer
would hold 2 GiB after this load).  For the plugin, nbdkit's own file
plugin under the same load is the reference for what nbdkit itself keeps.
"""
import os
import shutil
import subprocess
import time

import harness
import nbd

if harness.VALGRIND or harness.SANITIZED:
    harness.skip("resident memory under valgrind or ASan says nothing about the server")

CONNECTIONS = 2
IN_FLIGHT = 8
SLACK = 64 << 20  # a typical request's buffers, thread stacks, allocator


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS for pid {pid}")


def load(uri, size=None):
    """Runs the reads (of the largest size the server advertises, up to
    64 MiB, unless SIZE is given); returns the open handles and the
    request size used."""
    hs = []
    for _ in range(CONNECTIONS):
        h = nbd.NBD()
        h.connect_uri(uri)
        hs.append(h)
    size = size or min(hs[0].get_block_size(nbd.SIZE_MAXIMUM), 64 << 20)
    export = hs[0].get_size()
    bufs = []
    for h in hs:
        for i in range(IN_FLIGHT):
            buf = nbd.Buffer(size)
            bufs.append((h, buf, h.aio_pread(buf, (i * size) % export)))
    for h, buf, cookie in bufs:
        while not h.aio_command_completed(cookie):
            h.poll(-1)
    return hs, size


def measure(pid, uri, size=None):
    """RSS of PID before and after the load, with the connections still
    open (a kernel client stays connected: what nbdkit's threads keep
    per connection would be freed only when it leaves)."""
    before = rss(pid)
    hs, size = load(uri, size)
    time.sleep(0.5)  # let the server finish retiring the last replies
    after = rss(pid)
    for h in hs:
        h.shutdown()
    return before, after, size


image = harness.make_image(128 << 20, data=harness.pattern(1 << 20, 3))
srv = harness.Server(image)
before, after, size = measure(srv.proc.pid, srv.uri)
srv.stop()
mib = lambda n: f"{n / (1 << 20):.0f} MiB"
print(f"{harness.SERVER_KIND}: {CONNECTIONS}x{IN_FLIGHT} reads of {mib(size)}: "
      f"RSS {mib(before)} before, {mib(after)} after")

reference = 0
if harness.SERVER_KIND == "nbdkit" and shutil.which("nbdkit"):
    d = harness.tmpdir()
    sock = os.path.join(d, "file.sock")
    pidfile = os.path.join(d, "file.pid")
    ref = subprocess.Popen(["nbdkit", "-f", "-U", sock, "-P", pidfile, "file",
                            f"file={image}", "cache=none"])
    harness.on_exit(lambda: harness.terminate(ref))
    while not os.path.exists(pidfile):
        assert ref.poll() is None, "nbdkit file plugin did not start"
        time.sleep(0.05)
    rb, ra, _ = measure(ref.pid, f"nbd+unix:///?socket={sock}", size)
    harness.terminate(ref)
    reference = max(ra - rb, 0)
    print(f"reference: nbdkit file plugin kept {mib(reference)} under the same load")

# What nbdkit itself may keep: one request buffer per thread that served
# a read, so at most one per read in flight.  How many of its threads
# pick up the 16 reads varies from run to run (the reference kept 960 or
# 1024 MiB), so the bound is that most, not one run's figure; a plugin
# keeping bounce buffers of its own would be a whole second set above it.
if harness.SERVER_KIND == "nbdkit":
    reference = max(reference, CONNECTIONS * IN_FLIGHT * size)
kept = after - before
assert kept <= reference + SLACK, \
    f"server kept {mib(kept)} after the large reads (nbdkit's own at most {mib(reference)}, slack {mib(SLACK)})"
print(f"ok: {mib(kept)} kept after large reads (limit {mib(reference + SLACK)})")
