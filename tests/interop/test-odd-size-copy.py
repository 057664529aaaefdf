#!/usr/bin/python3
"""An image whose size is not a multiple of 512, through clients that
keep to the advertised block sizes (libnbd's default strict mode, and
nbdcopy): every byte is reachable, and a copy in and out is exact."""
import shutil

import harness

if shutil.which("nbdcopy") is None:
    harness.skip("nbdcopy (libnbd-bin) is not installed")

SIZE = 123456789
d = harness.tmpdir()
src = harness.make_image(SIZE, data=harness.pattern(SIZE, 5), directory=d)
target = d + "/target.img"
with open(target, "wb") as f:
    f.truncate(SIZE)
srv = harness.Server(target)

h = srv.connect()  # strict: requests must keep to the advertised minimum
minimum = h.get_block_size(0)  # nbd.SIZE_MINIMUM
assert SIZE % minimum == 0, f"advertised minimum {minimum} does not divide the size {SIZE}"
h.pwrite(b"\xa5" * 277, SIZE - 277)
assert h.pread(277, SIZE - 277) == b"\xa5" * 277, "last 277 bytes read back differ"
h.shutdown()

harness.nbdcopy_round_trip(srv, src, target)
print(f"ok: {SIZE}-byte image, minimum block size {minimum}, nbdcopy in and out identical")
