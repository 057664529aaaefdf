#!/usr/bin/python3
"""The last page of an odd-sized image under concurrent writers.

Four connections write byte-disjoint pieces of the image's last 4 KiB page
at the same time, then one of them sends FLUSH (or the writes carry FUA,
or one piece is a TRIM or WRITE_ZEROES).  The tail is the one place where
an image file cannot be reached with O_DIRECT alone, and a page reached
through both the page cache and O_DIRECT makes the kernel fail a later
fdatasync with EIO ("Page cache invalidation failure on direct I/O").

On the larger image another write goes to the sectors before the last
page in each round.  Asserts, for 1 and 4 server threads: no request fails, the kernel logs no
invalidation failure, and every byte equals a shadow copy kept here.

MLOOP_TAIL_ROUNDS overrides the rounds per thread count and variant:
10,000 in the full tier (MLOOP_TEST_TIER=full), 2,000 in the standard
tier (the race this guards against showed within the first 1,000 rounds
on both servers before its fix), 300 under valgrind, where each request
costs ~100x.
"""
import os
import random
import subprocess

import harness
import nbd

# Two sizes: a tail inside the first 2 MiB (the whole image is the tail),
# and one where direct IO to the blocks before it runs alongside.
SIZES = [(1 << 20) + 3000, (5 << 20) + 3000]
ROUNDS = int(os.environ.get("MLOOP_TAIL_ROUNDS",
                            "300" if harness.VALGRIND else
                            "10000" if os.environ.get("MLOOP_TEST_TIER") == "full" else
                            "2000"))
PAGE = 4096
NEAR = 3 << 20  # how far before the last page the extra writer goes
CONNECTIONS = 4
INVALIDATION = "Page cache invalidation failure"


def kernel_log():
    """The kernel log's lines, or None where it cannot be read."""
    r = subprocess.run(["dmesg"], capture_output=True, text=True)
    return r.stdout.splitlines() if r.returncode == 0 else None


def wait_all(pending):
    """Waits for every (handle, cookie); returns how many failed."""
    failed = 0
    for h, cookie in pending:
        try:
            while not h.aio_command_completed(cookie):
                h.poll(-1)
        except nbd.Error as e:
            print(f"request failed: {e}")
            failed += 1
    return failed


def cut(rng, start, end, pieces):
    """Splits [start, end) into PIECES byte-disjoint, non-empty ranges:
    mostly at sector boundaries (so whole sectors of the page go the fast,
    aligned way beside the partial last one), sometimes anywhere."""
    if rng.random() < 0.75:
        candidates = range(start + 512, end, 512)
    else:
        candidates = range(start + 1, end)
    points = sorted(rng.sample(candidates, pieces - 1))
    bounds = [start] + points + [end]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(pieces)]


def run(size, threads, variant, seed):
    """ROUNDS rounds of VARIANT on a fresh image; returns the error count."""
    rng = random.Random(seed)
    shadow = bytearray(harness.pattern(size, seed))
    image = harness.make_image(size, data=bytes(shadow))
    srv = harness.Server(image, params=[f"threads={threads}"])
    # Unaligned pieces must reach the server whatever it advertises.
    hs = [srv.connect(strict=False) for _ in range(CONNECTIONS)]
    page = size - size % PAGE if size % PAGE else size - PAGE
    errors = 0
    fua = nbd.CMD_FLAG_FUA if variant == "fua" else 0
    for r in range(ROUNDS):
        pending = []
        pieces = cut(rng, page, size, CONNECTIONS)
        space_piece = rng.randrange(CONNECTIONS) if variant == "trim-zero" else -1
        for i, (off, n) in enumerate(pieces):
            h = hs[i]
            if i == space_piece:
                if rng.random() < 0.5:
                    pending.append((h, h.aio_trim(n, off)))
                else:
                    pending.append((h, h.aio_zero(n, off)))
                # A trimmed range reads back as zeroes (both servers).
                shadow[off:off + n] = bytes(n)
            else:
                data = rng.randbytes(n)
                pending.append((h, h.aio_pwrite(data, off, flags=fua)))
                shadow[off:off + n] = data
        if page >= NEAR:
            # Beside them, a whole-sector write to the blocks just before
            # the last page (O_DIRECT territory when the image is large).
            off = page - rng.randrange(1, NEAR // 512 + 1) * 512
            n = min(rng.choice([512, 4096, 65536]), page - off)
            data = rng.randbytes(n)
            h = hs[r % CONNECTIONS]
            pending.append((h, h.aio_pwrite(data, off, flags=fua)))
            shadow[off:off + n] = data
        errors += wait_all(pending)
        if variant != "fua":
            h = hs[rng.randrange(CONNECTIONS)]
            try:
                h.flush()
            except nbd.Error as e:
                print(f"flush failed in round {r}: {e}")
                errors += 1
        if r % 500 == 0 or r == ROUNDS - 1:
            got = hs[r % CONNECTIONS].pread(size - page, page)
            assert got == bytes(shadow[page:]), \
                f"size {size} threads={threads} {variant}: last page differs from the shadow after round {r}"
    for h in hs:
        h.shutdown()
    srv.stop()
    with open(image, "rb") as f:
        on_disk = f.read()
    assert len(on_disk) == size, f"image size changed to {len(on_disk)}"
    assert on_disk == bytes(shadow), \
        f"size {size} threads={threads} {variant}: image differs from the shadow"
    return errors


log_before = kernel_log()
if log_before is None:
    print("note: the kernel log cannot be read here; checking data and errors only")
total = 0
seed = 1
for size in SIZES:
    for threads in (1, 4):
        for variant in ("flush", "fua", "trim-zero"):
            e = run(size, threads, variant, seed)
            print(f"size {size} threads={threads} {variant}: {ROUNDS} rounds, {e} errors")
            total += e
            seed += 1
if log_before is not None:
    before = sum(INVALIDATION in line for line in log_before)
    bad = [line for line in kernel_log() if INVALIDATION in line][before:]
    assert not bad, f"kernel logged: {bad[0]}"
assert total == 0, f"{total} requests failed"
print("ok: concurrent writers on the last page of odd-sized images, no error, data equal")
