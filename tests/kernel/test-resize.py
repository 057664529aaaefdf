"""`mloop resize` changes a device's size while it runs (losetup -c).

With ext4 mounted on the device and fio writing (and verifying) files on
it, `mloop resize --size` doubles the image: the kernel's size follows at
once, the server serves the new last block (written and read back through
the device with O_DIRECT, found in the image), resize2fs grows the mounted
filesystem, a file written into the new space and the files written before
read back the same.  Then the image grows outside and `mloop resize FILE`
takes its size; shrinking below data is refused with the first byte in use
and changes nothing; shrinking a mounted device is refused; shrinking the
free tail of an unmounted one works, and fsck finds the filesystem clean."""
import hashlib
import json
import os
import random
import subprocess
import time

from blockio import BLOCK, odirect_block, pattern
from kfix import COMMAND_TIMEOUT, make_image, mount, run, sysfs, tmpdir
from restart import attach, kill_mark

MIB = 1 << 20
START = 64 * MIB
GROWN = 128 * MIB
OUTSIDE = 160 * MIB
JOBS = 2
# Enough that fio still writes when the resize starts, a second after it,
# with a wide margin on a fast guest (8 MiB took over 2 s on every run).
REGION = 16 * MIB
# Short, so that the requests a planned nbdkit restart leaves unread are
# requeued soon (the supervisor's restart path, as after a server death).
TIMEOUT = 10


def device_size(dev):
    return int(sysfs(dev, "size")) * 512


def listed_size(kind, dev):
    rows = json.loads(kind.cli("list", "--json").stdout)
    return [r["size"] for r in rows if r["device"] == dev]


def resize(kind, dev, *args, check=True):
    """`mloop resize`; a planned nbdkit restart is marked in the kernel
    log first, so the timeouts of its unread requests are forgiven."""
    if kind.server == "nbdkit":
        kill_mark(dev, kind.status(dev)["device"]["server_pid"])
    return kind.cli("resize", *args, dev, check=check)


def write_files(mnt, prefix, count, size, seed):
    rng = random.Random(seed)
    want = {}
    for i in range(count):
        data = rng.randbytes(size)
        name = f"{prefix}{i:02}"
        with open(os.path.join(mnt, name), "wb") as f:
            f.write(data)
        want[name] = hashlib.sha256(data).hexdigest()
    run(["sync", "-f", mnt])
    return want


def check_files(mnt, want):
    for name, digest in want.items():
        with open(os.path.join(mnt, name), "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        assert got == digest, f"{name} differs after the resize"


def start_fio(cl, mnt):
    fio = subprocess.Popen(
        ["fio", "--name=resize-verify", f"--directory={mnt}", "--ioengine=libaio",
         "--direct=1", "--rw=randwrite", "--bs=4k", "--iodepth=16",
         f"--numjobs={JOBS}", f"--size={REGION}", "--verify=crc32c",
         "--verify_fatal=1", "--verify_state_save=0", "--output-format=json"],
        cwd=tmpdir(cl), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: fio.poll() is None and (fio.kill(), fio.wait()))
    return fio


def finish_fio(fio):
    out, err = fio.communicate(timeout=COMMAND_TIMEOUT)
    assert fio.returncode == 0, f"fio exit {fio.returncode}: {err.strip()[-2000:]}"
    assert "verify" not in err, f"fio reported: {err.strip()[-2000:]}"
    for j in json.loads(out[out.index("{"):])["jobs"]:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
        assert j["write"]["io_bytes"] == REGION and j["read"]["io_bytes"] == REGION, \
            f"fio wrote {j['write']['io_bytes']} and verified {j['read']['io_bytes']} bytes"


def show_supervisor_log(ddir):
    """What the supervisor did (planned restarts and reconnects, with
    their times), as TAP diagnostics: read when a resize fails."""
    try:
        with open(os.path.join(ddir, "supervisor.log")) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines[-15:]:
        print(f"# supervisor.log: {line}", flush=True)


def refused(p, *words):
    msg = p.stderr.strip()
    assert p.returncode != 0, f"mloop resize succeeded: {p.stdout!r}"
    for w in words:
        assert w in msg, f"refusal {msg!r} does not say {w!r}"
    return msg


def run_test(kind, cl):
    image = make_image(cl, size=START)
    dev = attach(kind, cl, image, TIMEOUT).device
    ddir = os.path.dirname(kind.status(dev)["device"]["socket"])
    cl.push(lambda: show_supervisor_log(ddir))
    run(["mkfs.ext4", "-q", "-F", dev])
    mnt = mount(cl, dev)
    want = write_files(mnt, "before", 8, MIB, 3)

    # Grow by --size with a writer running.
    fio = start_fio(cl, mnt)
    time.sleep(1)
    assert fio.poll() is None, "fio finished before the resize started"
    t0 = time.monotonic()
    resize(kind, dev, "--size", "128M")
    took = time.monotonic() - t0
    assert os.path.getsize(image) == GROWN, f"image is {os.path.getsize(image)} bytes"
    assert device_size(dev) == GROWN, f"{dev} is {device_size(dev)} bytes after the resize"
    assert listed_size(kind, dev) == [GROWN], f"mloop list says {listed_size(kind, dev)}"
    assert kind.status(dev)["device"]["size"] == GROWN, "mloop status shows the old size"
    # The new last block, past the filesystem and the old end: through the
    # kernel and the server into the image, and back.
    last = GROWN - BLOCK
    odirect_block(dev, last, pattern(last, 13))
    assert odirect_block(dev, last) == pattern(last, 13), "the new last block reads back wrong"
    with open(image, "rb") as f:
        f.seek(last)
        assert f.read(BLOCK) == pattern(last, 13), "the new last block is not in the image"
    run(["resize2fs", dev])
    blocks = os.statvfs(mnt)
    assert blocks.f_blocks * blocks.f_frsize > 100 * MIB, \
        f"resize2fs left {blocks.f_blocks * blocks.f_frsize} bytes"
    # Beyond what the old filesystem could hold.
    want.update(write_files(mnt, "after", 1, 56 * MIB, 4))
    finish_fio(fio)
    check_files(mnt, want)
    print(f"# grew {START >> 20} -> {GROWN >> 20} MiB under fio in {took:.1f} s", flush=True)

    # The image grew outside: the device takes its size (FILE form).
    os.truncate(image, OUTSIDE)
    if kind.server == "nbdkit":
        kill_mark(dev, kind.status(dev)["device"]["server_pid"])
    kind.cli("resize", image)
    assert device_size(dev) == OUTSIDE, f"{dev} is {device_size(dev)} bytes"
    assert listed_size(kind, dev) == [OUTSIDE], f"mloop list says {listed_size(kind, dev)}"

    # Below data: refused, nothing changed.
    msg = refused(resize(kind, dev, "--size", "64M", check=False), "in use", "nothing")
    first = int(msg.split("byte ")[1].split()[0])
    assert START <= first < GROWN, f"the first byte in use {first} is outside the data"
    assert os.path.getsize(image) == OUTSIDE and device_size(dev) == OUTSIDE, \
        "a refused shrink changed a size"
    # The free tail of a mounted device: refused.
    refused(resize(kind, dev, "--size", "128M", check=False), "mounted")
    assert os.path.getsize(image) == OUTSIDE and device_size(dev) == OUTSIDE

    # The free tail, unmounted: works, and the filesystem is whole.
    run(["umount", mnt])
    resize(kind, dev, "--size", "128M")
    assert os.path.getsize(image) == GROWN and device_size(dev) == GROWN, \
        f"after the shrink: image {os.path.getsize(image)}, device {device_size(dev)}"
    assert listed_size(kind, dev) == [GROWN], f"mloop list says {listed_size(kind, dev)}"
    fsck = run(["fsck.ext4", "-fn", dev], check=False)
    assert fsck.returncode == 0, f"fsck -fn exit {fsck.returncode}: {fsck.stdout}{fsck.stderr}"
    mnt = mount(cl, dev, "ro")
    check_files(mnt, want)
    st = kind.status(dev)
    assert st["restarts"] == 0 and st["server_running"], \
        f"resizing counted {st['restarts']} restarts ({st.get('last_failure')})"
    assert st.get("connections_open") == kind.queues, \
        f"{st.get('connections_open')} of {kind.queues} connections open"
