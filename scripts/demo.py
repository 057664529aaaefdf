#!/usr/bin/python3
"""The quick-start job: serve a sparse 1 GiB image with the installed
plugin, write and read it back through libnbd, verify, and clean up."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import nbd

IMAGE_SIZE = 1 << 30
CHUNK = 4 << 20
COUNT = 64                      # 256 MiB written and read back

work = tempfile.mkdtemp(prefix="mloop-demo-", dir="/var/tmp")
image = os.path.join(work, "disk.img")
sock = os.path.join(work, "nbd.sock")
with open(image, "wb") as f:
    f.truncate(IMAGE_SIZE)
server = subprocess.Popen(["nbdkit", "-f", "-U", sock, "mloop",
                           f"file={image}", "threads=4"])
try:
    while not os.path.exists(sock):
        if server.poll() is not None:
            sys.exit("mloop demo: nbdkit failed to start (see above)")
        time.sleep(0.05)
    h = nbd.NBD()
    h.connect_uri(f"nbd+unix:///?socket={sock}")
    data = os.urandom(CHUNK)
    stride = IMAGE_SIZE // COUNT
    start = time.monotonic()
    for i in range(COUNT):
        h.pwrite(data, i * stride)
    h.flush()
    written = time.monotonic() - start
    start = time.monotonic()
    for i in range(COUNT):
        if h.pread(CHUNK, i * stride) != data:
            sys.exit(f"mloop demo: data mismatch at offset {i * stride}")
    read = time.monotonic() - start
    h.shutdown()
    allocated = os.stat(image).st_blocks * 512
    mib = COUNT * CHUNK >> 20
    print(f"mloop demo: served a sparse {IMAGE_SIZE >> 30} GiB image with "
          f"'nbdkit mloop file=IMG threads=4' on a Unix socket;\n"
          f"  wrote {mib} MiB in {COUNT} chunks spread over the image "
          f"({mib / written:.0f} MiB/s, flushed), read it back "
          f"({mib / read:.0f} MiB/s), all data verified;\n"
          f"  the image stayed sparse: {allocated >> 20} MiB allocated "
          f"of {IMAGE_SIZE >> 20} MiB.")
finally:
    server.terminate()
    server.wait()
    shutil.rmtree(work, ignore_errors=True)
