"""fio writes random 4 KiB blocks with libaio and O_DIRECT from four jobs,
each in its own region of the device, and reads every block back with a
crc32c check: no mismatch, no error."""
import json

from kfix import run, tmpdir, make_image

JOBS = 4
REGION = 4 << 20  # per job: 1024 random writes; TCG makes more cost minutes


def run_test(kind, cl):
    image = make_image(cl)
    dev = kind.attach(cl, image).device
    # cwd in a private directory: fio drops files (verify state) there.
    p = run(["fio", "--name=kernel-verify", f"--filename={dev}",
             "--ioengine=libaio", "--direct=1", "--rw=randwrite", "--bs=4k",
             "--iodepth=16", f"--numjobs={JOBS}", f"--size={REGION}",
             f"--offset_increment={REGION}", "--verify=crc32c",
             "--verify_fatal=1", "--verify_state_save=0",
             "--output-format=json"], check=False, cwd=tmpdir(cl))
    assert p.returncode == 0, f"fio exit {p.returncode}: {p.stderr.strip()[-2000:]}"
    assert "verify" not in p.stderr, f"fio reported: {p.stderr.strip()[-2000:]}"
    # fio may print warnings before the JSON document.
    jobs = json.loads(p.stdout[p.stdout.index("{"):])["jobs"]
    assert len(jobs) == JOBS, f"{len(jobs)} fio jobs reported, expected {JOBS}"
    for j in jobs:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
        assert j["write"]["io_bytes"] == REGION, \
            f"job wrote {j['write']['io_bytes']} bytes, expected {REGION}"
        # The verify pass reads every block written.
        assert j["read"]["io_bytes"] == REGION, \
            f"job verified {j['read']['io_bytes']} bytes, expected {REGION}"
