"""Four concurrent sequential readers (dd, 1 MiB O_DIRECT reads), each over
its own region, read exactly the image's bytes."""
import hashlib
import subprocess
import threading

from kfix import COMMAND_TIMEOUT, digest, make_image

READERS = 4
# 8 reads of 1 MiB each, all four readers at once: what the test needs;
# every MiB more costs a guest copy and a hash under TCG.
REGION = 8 << 20


def run_test(kind, cl):
    image = make_image(cl, size=READERS * REGION, fill=READERS * REGION, seed=4)
    dev = kind.attach(cl, image).device
    mib = REGION >> 20
    procs = [subprocess.Popen(["dd", f"if={dev}", "bs=1M", f"skip={i * mib}",
                               f"count={mib}", "iflag=direct", "status=none"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(READERS)]
    cl.push(lambda: [p.kill() for p in procs if p.poll() is None])
    got = [None] * READERS

    # One thread per reader drains its pipe, so all four stay busy at once.
    def drain(i):
        h = hashlib.sha256()
        for block in iter(lambda: procs[i].stdout.read(1 << 20), b""):
            h.update(block)
        got[i] = h.hexdigest()
    threads = [threading.Thread(target=drain, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(COMMAND_TIMEOUT)
    for i, p in enumerate(procs):
        rc = p.wait(timeout=COMMAND_TIMEOUT)
        assert rc == 0, f"dd reader {i} exit {rc}: {p.stderr.read().decode().strip()}"
        want = digest(image, i * REGION, REGION)
        assert got[i] == want, f"reader {i} read the wrong bytes"
