"""fio verify rounds on a device while its server is killed: the shared
part of the restart tests.

One round is four fio jobs writing random 4 KiB blocks with crc32c over
8 MiB each of one device (or one job on each of several devices), then
reading them back and verifying.  A fixed amount of data
has no fixed duration: on a fast guest a round can end before all the
kills are done (seen on 6.12 with the native server).  So a round that
has ended is checked and another started before the next kill: every
kill lands while a round is writing, however fast the guest is."""
import json
import subprocess
import time

from kfix import COMMAND_TIMEOUT, tmpdir

JOBS = 4
REGION = 8 << 20
# A new round's fio is past its start-up (and far from done: 32 MiB of
# random 4 KiB writes takes seconds under TCG) by then.
ROUND_START = 1


OPTIONS = ["ioengine=libaio", "direct=1", "rw=randwrite", "bs=4k", "iodepth=16",
           "verify=crc32c", "verify_fatal=1", "verify_state_save=0"]


def start_round(dev, cl, region=REGION):
    """Starts a round on DEV: JOBS jobs of REGION bytes each, one after
    another on the device; or, when DEV is a list of devices, one job of
    REGION bytes on each."""
    d = tmpdir(cl)
    if isinstance(dev, str):
        job = [f"--{o}" for o in ["name=verify-under-kills"] + OPTIONS + [
            f"filename={dev}", f"numjobs={JOBS}", f"size={region}",
            f"offset_increment={region}"]]
    else:
        # Verifies as it goes (every 256 blocks written): with many devices
        # a round's reads would otherwise take most of it, and kills
        # would land while nothing is written.
        with open(f"{d}/devices.fio", "w") as f:
            f.write("[global]\n" + "".join(f"{o}\n" for o in OPTIONS + [
                f"size={region}", "verify_backlog=256"]))
            f.writelines(f"[dev{i}]\nfilename={one}\n" for i, one in enumerate(dev))
        job = ["devices.fio"]
    fio = subprocess.Popen(["fio", "--output-format=json", *job], cwd=d,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: fio.poll() is None and (fio.kill(), fio.wait()))
    return fio


def check_round(fio, region=REGION):
    """Waits for FIO's round (of REGION bytes per job) and asserts every
    block was written and verified without an error."""
    out, err = fio.communicate(timeout=COMMAND_TIMEOUT)
    assert fio.returncode == 0, f"fio exit {fio.returncode}: {err.strip()[-2000:]}"
    assert "verify" not in err, f"fio reported: {err.strip()[-2000:]}"
    jobs = json.loads(out[out.index("{"):])["jobs"]
    for j in jobs:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
        assert j["write"]["io_bytes"] == region and j["read"]["io_bytes"] == region, \
            f"job wrote {j['write']['io_bytes']} and verified {j['read']['io_bytes']} bytes"


def under_kills(dev, cl, kills, kill_once, pause=3, region=REGION):
    """Runs verify rounds (REGION bytes per job) on DEV (a device, or a
    list of them: start_round) and calls
    KILL_ONCE() KILLS times, PAUSE seconds apart, each while a round is
    running; checks every round.  Returns KILL_ONCE's results and the
    number of rounds."""
    fio = start_round(dev, cl, region)
    rounds, results = 1, []
    for _ in range(kills):
        time.sleep(pause)
        if fio.poll() is not None:
            check_round(fio, region)
            fio = start_round(dev, cl, region)
            rounds += 1
            time.sleep(ROUND_START)
            assert fio.poll() is None, "a fio round ended within a second of its start"
        results.append(kill_once())
    check_round(fio, region)
    return results, rounds
