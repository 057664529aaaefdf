#!/usr/bin/python3
"""One timed space-management operation through an NBD server, for
bench/run: prints a JSON record with the seconds it took.

  space_op.py zero URI OFFSET LENGTH    one WRITE_ZEROES (may punch)
  space_op.py trim URI OFFSET LENGTH    one TRIM
  space_op.py copy URI                  nbdcopy of the whole export to null:

The zero and trim are issued as requests of at most 1 GiB (the NBD limit
is 4 GiB - 1; some servers split further themselves), back to back, and
timed until the last reply, followed by a flush so that a server which
defers the work cannot look faster than one which does it.
"""
import json
import subprocess
import sys
import time

import nbd  # python3-libnbd (Debian), hence /usr/bin/python3

MAX_REQUEST = 1 << 30


def timed_space_op(op, uri, offset, length):
    h = nbd.NBD()
    h.connect_uri(uri)
    if op == "trim" and not h.can_trim():
        return {"skipped": "server does not advertise trim"}
    if op == "zero" and not h.can_zero():
        return {"skipped": "server does not advertise write zeroes"}
    fn = h.trim if op == "trim" else h.zero
    start = time.monotonic()
    pos, end = offset, offset + length
    while pos < end:
        n = min(MAX_REQUEST, end - pos)
        fn(n, pos)
        pos += n
    if h.can_flush():
        h.flush()
    seconds = time.monotonic() - start
    h.shutdown()
    return {"seconds": seconds, "bytes": length}


def timed_copy(uri):
    start = time.monotonic()
    subprocess.run(["nbdcopy", uri, "null:"], check=True)
    return {"seconds": time.monotonic() - start}


def main(argv):
    op, uri = argv[1], argv[2]
    try:
        if op in ("zero", "trim"):
            rec = timed_space_op(op, uri, int(argv[3]), int(argv[4]))
        elif op == "copy":
            rec = timed_copy(uri)
        else:
            sys.exit(f"space_op.py: unknown operation {op}")
    except (nbd.Error, subprocess.CalledProcessError, OSError) as e:
        # A failed operation is a result to report, not a crash.
        rec = {"error": str(e)}
    rec["op"] = op
    print(json.dumps(rec))


if __name__ == "__main__":
    main(sys.argv)
