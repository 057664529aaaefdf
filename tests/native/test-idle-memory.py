#!/usr/bin/python3
"""Memory goes back to the kernel when clients are gone.

500 connections come and go, 50 at a time, each reading 8 x 1 MiB (every
reply read: nothing hostile), while one more stays connected and idle,
as a kernel client's connections do.  Within a few seconds of the last
one leaving, the server's resident memory is at most 64 MiB above what
it was fresh.  Before, request buffers freed to the heap stayed there
and each connection kept up to 4 MiB of them: 1,904 MiB resident with
no client reading.  Also, an idle connection costs what design.md says
(about 1 MiB at most, its kept buffers included)."""
import time

import nbd

import harness
import netserver

if harness.VALGRIND or harness.SANITIZED:
    harness.skip("resident memory means nothing under valgrind or a sanitizer")

CONNECTIONS, AT_ONCE, READS, READ = 500, 50, 8, 1 << 20
ABOVE_FRESH = 64 << 20
SETTLE = 15                     # seconds: the server gives memory back
                                # after 5 s idle (server/worker.c)

image = harness.make_image(64 << 20)
srv = netserver.NetServer(image, unix=True)
fresh = srv.status_kib("VmRSS") << 10
idle = nbd.NBD()
idle.connect_uri(srv.uri)
harness.on_exit(lambda: netserver.disconnect(idle))
idle.pread(4096, 0)

done = 0
while done < CONNECTIONS:
    hs = []
    for _ in range(AT_ONCE):
        h = nbd.NBD()
        h.connect_uri(srv.uri)
        hs.append(h)
    pending = [(h, h.aio_pread(nbd.Buffer(READ), ((done + i + k) % 64) * READ))
               for i, h in enumerate(hs) for k in range(READS)]
    for h, cookie in pending:
        while not h.aio_command_completed(cookie):
            h.poll(-1)
    for h in hs:
        h.shutdown()
    done += AT_ONCE
busy = srv.status_kib("VmRSS") << 10

deadline = time.monotonic() + SETTLE
while True:
    rss = srv.status_kib("VmRSS") << 10
    # Half the bound: past the trim, not merely under the bound by luck.
    if rss <= fresh + ABOVE_FRESH // 2 or time.monotonic() > deadline:
        break
    time.sleep(0.2)
assert idle.pread(4096, 0) == bytes(4096), "the idle client is no longer served"
print(f"fresh {fresh >> 20} MiB, right after {CONNECTIONS} connections {busy >> 20} MiB, "
      f"then {rss >> 20} MiB")
assert rss <= fresh + ABOVE_FRESH, \
    f"{rss >> 20} MiB resident {SETTLE} s after {CONNECTIONS} clients left, " \
    f"{fresh >> 20} MiB fresh: the memory stayed"
netserver.disconnect(idle)
srv.stop()
print("ok: memory back to the kernel once the clients are gone")
