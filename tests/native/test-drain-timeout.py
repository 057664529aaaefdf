#!/usr/bin/python3
"""SIGTERM finishes within the drain deadline even when a client leaves
its replies unread: mloop-server drops what it cannot send, exits 0 and
removes its socket; a client that did read got its replies."""
import signal
import time

import harness
import nbdwire as nw

if harness.SERVER_KIND != "native":
    harness.skip("--drain-timeout is mloop-server's")

DRAIN = 2
image = harness.make_image(64 << 20, data=harness.pattern(1 << 20, 9))
srv = harness.Server(image, params=[f"drain-timeout={DRAIN}"])
reader = srv.connect()
assert reader.pread(4096, 0) == harness.pattern(1 << 20, 9)[:4096]

w = nw.Wire(srv.sock)
w.greeting()
w.go()
for i in range(40):  # 40 MiB of replies, far more than the socket holds
    w.request(nw.CMD_READ, (i % 64) << 20, 1 << 20, cookie=i)
time.sleep(1)  # let the server read them and fill the socket

start = time.monotonic()
srv.proc.send_signal(signal.SIGTERM)
srv.proc.wait(timeout=DRAIN + (60 if harness.VALGRIND else 8))
took = time.monotonic() - start
assert srv.proc.returncode == 0, f"exit status {srv.proc.returncode}"
assert took >= DRAIN * 0.9, f"exited after {took:.1f} s, before the drain deadline"
assert "drain timeout" in srv.log_text(), "no log line about the dropped replies"
w.close()
srv.stop()
print(f"ok: SIGTERM with unread replies: exited 0 after {took:.1f} s (deadline {DRAIN} s)")
