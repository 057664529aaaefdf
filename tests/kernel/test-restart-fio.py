"""The device survives its server: fio writes random blocks with crc32c
verification from four jobs while the server is killed with SIGKILL three
times; each time the supervisor restarts it and reconnects the device
within a few seconds, fio sees no IO error and no verify mismatch."""
import json
import subprocess
import time

from kfix import COMMAND_TIMEOUT, make_image, tmpdir
from restart import attach, kill_server

JOBS = 4
REGION = 8 << 20
KILLS = 3
RESUME_LIMIT = 15  # seconds from SIGKILL to a reconnected device, under TCG


def run_test(kind, cl):
    image = make_image(cl)
    # A short request timeout: requests in flight on the killed server are
    # requeued when it expires.
    dev = attach(kind, cl, image, 10).device
    fio = subprocess.Popen(
        ["fio", "--name=restart-verify", f"--filename={dev}", "--ioengine=libaio",
         "--direct=1", "--rw=randwrite", "--bs=4k", "--iodepth=16",
         f"--numjobs={JOBS}", f"--size={REGION}", f"--offset_increment={REGION}",
         "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
         "--output-format=json"],
        cwd=tmpdir(cl), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: fio.poll() is None and (fio.kill(), fio.wait()))
    took = []
    for _ in range(KILLS):
        time.sleep(3)
        assert fio.poll() is None, "fio finished before the server could be killed 3 times"
        took.append(kill_server(kind, dev))
    out, err = fio.communicate(timeout=COMMAND_TIMEOUT)
    assert fio.returncode == 0, f"fio exit {fio.returncode}: {err.strip()[-2000:]}"
    assert "verify" not in err, f"fio reported: {err.strip()[-2000:]}"
    jobs = json.loads(out[out.index("{"):])["jobs"]
    for j in jobs:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
        assert j["write"]["io_bytes"] == REGION and j["read"]["io_bytes"] == REGION, \
            f"job wrote {j['write']['io_bytes']} and verified {j['read']['io_bytes']} bytes"
    slow = [t for t in took if t > RESUME_LIMIT]
    assert not slow, f"reconnects took {['%.1f s' % t for t in took]} (limit {RESUME_LIMIT} s)"
    print(f"# reconnected after each SIGKILL in {', '.join('%.1f s' % t for t in took)}",
          flush=True)
