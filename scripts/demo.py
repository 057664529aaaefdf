#!/usr/bin/python3
"""The quick-start job.  Where the kernel has an NBD client: attach a
sparse 1 GiB image with `mloop attach` (4 connections), write and read
256 MiB through /dev/nbdN with O_DIRECT, verify, and leave the device
attached for the user.  Elsewhere: say why, then serve the image with
`nbdkit mloop file=IMG threads=4` on a Unix socket, write and read it
through libnbd, verify, and clean up."""
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time

IMAGE_SIZE = 1 << 30
CHUNK = 4 << 20
COUNT = 64                      # 256 MiB written and read back
STRIDE = IMAGE_SIZE // COUNT
MIB = COUNT * CHUNK >> 20


def report(how, image, written, read):
    allocated = os.stat(image).st_blocks * 512
    print(f"mloop demo: {how};\n"
          f"  wrote {MIB} MiB in {COUNT} chunks spread over the image "
          f"({MIB / written:.0f} MiB/s, flushed), read it back "
          f"({MIB / read:.0f} MiB/s), all data verified;\n"
          f"  the image stayed sparse: {allocated >> 20} MiB allocated "
          f"of {IMAGE_SIZE >> 20} MiB.")


def through_device(image):
    """Attaches IMAGE; returns (device, None) or (None, why not)."""
    mloop = shutil.which("mloop") or shutil.which("mloop", path="/usr/local/sbin:/usr/sbin")
    if mloop is None:
        return None, "the mloop command is not installed"
    r = subprocess.run([mloop, "attach", "--connections", "4", image],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    device = r.stdout.strip()
    # O_DIRECT wants aligned buffers: anonymous mmaps are page aligned.
    data = mmap.mmap(-1, CHUNK)
    data.write(os.urandom(CHUNK))
    back = mmap.mmap(-1, CHUNK)
    fd = os.open(device, os.O_RDWR | os.O_DIRECT)
    try:
        start = time.monotonic()
        for i in range(COUNT):
            os.pwritev(fd, [data], i * STRIDE)
        os.fsync(fd)
        written = time.monotonic() - start
        start = time.monotonic()
        for i in range(COUNT):
            os.preadv(fd, [back], i * STRIDE)
            if back[:] != data[:]:
                sys.exit(f"mloop demo: data mismatch at offset {i * STRIDE}")
        read = time.monotonic() - start
    finally:
        os.close(fd)
    report(f"attached a sparse {IMAGE_SIZE >> 30} GiB image as {device} "
           f"with 'mloop attach --connections 4'", image, written, read)
    print(f"  {device} stays attached: try 'mloop list', 'mloop status "
          f"{device}', and 'mloop detach {device}' when done.")
    return device, None


def through_socket(image, work):
    import nbd
    sock = os.path.join(work, "nbd.sock")
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
        start = time.monotonic()
        for i in range(COUNT):
            h.pwrite(data, i * STRIDE)
        h.flush()
        written = time.monotonic() - start
        start = time.monotonic()
        for i in range(COUNT):
            if h.pread(CHUNK, i * STRIDE) != data:
                sys.exit(f"mloop demo: data mismatch at offset {i * STRIDE}")
        read = time.monotonic() - start
        h.shutdown()
        report(f"served a sparse {IMAGE_SIZE >> 30} GiB image with "
               f"'nbdkit mloop file=IMG threads=4' on a Unix socket",
               image, written, read)
    finally:
        server.terminate()
        server.wait()


work = tempfile.mkdtemp(prefix="mloop-demo-", dir="/var/tmp")
image = os.path.join(work, "disk.img")
with open(image, "wb") as f:
    f.truncate(IMAGE_SIZE)
device, why = through_device(image)
if device is None:
    print(f"mloop demo: no block device here: {why}\n"
          f"  serving the image on a Unix socket instead.")
    try:
        through_socket(image, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
