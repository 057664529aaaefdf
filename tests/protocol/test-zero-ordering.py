#!/usr/bin/python3
"""A zero or trim is never lost behind a write the server already
acknowledged: connection A writes (many in flight), B zeroes or trims
the same ranges once A's writes are acknowledged, C reads zeroes — while
other writes to disjoint ranges stay in flight throughout."""
import harness

SIZE = 64 << 20
CHUNK = 64 << 10
image = harness.make_image(SIZE)
srv = harness.Server(image)
a, b, c, noise = (srv.connect() for _ in range(4))


def wait(h, cookies):
    for cookie in cookies:
        while not h.aio_command_completed(cookie):
            h.poll(-1)


noise_cookies = []
for rnd in range(8):
    base = rnd * (4 << 20)
    # Keep disjoint writes in flight on another connection all along.
    noise_cookies += [noise.aio_pwrite(harness.pattern(CHUNK, rnd), (32 << 20) + base + i * CHUNK)
                      for i in range(4)]
    wait(a, [a.aio_pwrite(harness.pattern(CHUNK, rnd + i), base + i * CHUNK) for i in range(64)])
    if rnd % 2:
        b.zero(2 << 20, base)
    else:
        b.trim(2 << 20, base)
    assert c.pread(2 << 20, base) == bytes(2 << 20), f"round {rnd}: zeroed range not zero"
    assert c.pread(2 << 20, base + (2 << 20)) == b"".join(
        harness.pattern(CHUNK, rnd + i) for i in range(32, 64)), f"round {rnd}: data beside it lost"
wait(noise, noise_cookies)
for h in (a, b, c, noise):
    h.shutdown()
srv.stop()
print("ok: 8 rounds of write-then-zero/trim across connections, zeroes seen every time")
