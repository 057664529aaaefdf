"""The device survives its server: fio writes random blocks with crc32c
verification from four jobs while the server is killed with SIGKILL three
times; each time the supervisor restarts it and reconnects the device
within a few seconds, fio sees no IO error and no verify mismatch."""
from kfix import make_image
import fioverify
from restart import attach, kill_server

KILLS = 3
RESUME_LIMIT = 15  # seconds from SIGKILL to a reconnected device, under TCG


def run_test(kind, cl):
    image = make_image(cl)
    # A short request timeout: requests in flight on the killed server are
    # requeued when it expires.
    dev = attach(kind, cl, image, 10).device
    took, rounds = fioverify.under_kills(dev, cl, KILLS, lambda: kill_server(kind, dev))
    slow = [t for t in took if t > RESUME_LIMIT]
    assert not slow, f"reconnects took {['%.1f s' % t for t in took]} (limit {RESUME_LIMIT} s)"
    print(f"# reconnected after each SIGKILL in {', '.join('%.1f s' % t for t in took)} "
          f"({rounds} fio round(s))", flush=True)
