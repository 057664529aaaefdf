"""mloop's command line is the same over ublk: list and status show the
transport and the device, detach takes the device's name or the image,
partitions are read (or dropped with --no-partscan) and queue options
applied, --device picks the number, what only NBD does is refused in
one line with nothing left behind,
--transport auto chooses ublk for a local image and NBD otherwise,
detach writes back what a buffered writer left in the page cache, a
killed mloop-ublk is replaced by the supervisor with the data intact,
and a device whose server and supervisor were both killed is still
deleted by detach."""
import json
import mmap
import os
import re
import signal

from kfix import CONNECTIONS, IMAGE_SIZE, make_image, run, sysfs, wait_until

# Two partitions, as test-partitions.py's MBR image.
MBR_TABLE = "label: dos\nstart=2048, size=65536\nstart=67584, size=65536\n"


def entries(kind):
    return json.loads(kind.cli("list", "--json").stdout)


def refused(kind, image, *extra, why):
    """`mloop attach --transport ublk IMAGE EXTRA` fails with one line
    matching WHY, and leaves no device, process or state."""
    before = sorted(d for d in os.listdir("/sys/block") if d.startswith("ublkb"))
    state = kind.state_entries()
    p = kind.cli("attach", image, "--transport", "ublk", *extra, check=False)
    err = p.stderr.strip()
    assert p.returncode != 0, f"attach {' '.join(extra)} succeeded: {p.stdout!r}"
    assert len(err.splitlines()) == 1 and re.search(why, err), \
        f"attach {' '.join(extra)}: expected one line matching {why!r}, got {err!r}"
    after = sorted(d for d in os.listdir("/sys/block") if d.startswith("ublkb"))
    assert after == before, f"attach {' '.join(extra)} left {after} (before: {before})"
    assert kind.state_entries() == state, f"attach {' '.join(extra)} left state"


def ublk_name(dev):
    return os.path.basename(dev)


def run_test(kind, cl):
    image, other = make_image(cl, seed=3), make_image(cl, seed=4)
    att = kind.attach(cl, image)
    dev = att.device

    # list and status show the transport, the device and its queues.
    [e] = entries(kind)
    assert e["device"] == dev and e["transport"] == "ublk", f"list --json: {e}"
    assert e["file"] == image and e["size"] == IMAGE_SIZE, f"list --json: {e}"
    assert e["server"] == "ublk" and e["connections"] == CONNECTIONS, f"list --json: {e}"
    st = kind.status(dev)
    assert st["kernel_connected"] and st["server_running"], f"status --json: {st}"
    assert st["hardware_queues"] == CONNECTIONS, f"status --json: {st}"
    text = kind.cli("status", ublk_name(dev)).stdout
    assert text.startswith(f"{dev}: {image}") and "ublk" in text, f"status:\n{text}"

    # Partitions: read at attach (ublkbNp1), or dropped with --no-partscan;
    # --queue-option reaches the device's queue.
    parted = make_image(cl, seed=5)
    run(["sfdisk", "--quiet", parted], input=MBR_TABLE)
    for extra, want in ((["--queue-option", "read_ahead_kb=512"], ["p1", "p2"]),
                        (["--no-partscan"], [])):
        # The image's own block size: the table counts 512-byte sectors.
        pdev = kind.attach(cl, parted, args=["attach", parted, "--transport", "ublk",
                                             "--connections", str(CONNECTIONS)] + extra)
        name = ublk_name(pdev.device)
        got = sorted(p[len(name):] for p in os.listdir(f"/sys/block/{name}")
                     if p.startswith(f"{name}p"))
        assert got == want, f"attach {' '.join(extra)}: partitions {got}, expected {want}"
        if "--queue-option" in extra:
            ahead = sysfs(pdev.device, "queue/read_ahead_kb")
            assert ahead == "512", f"--queue-option read_ahead_kb=512: it is {ahead}"
        assert kind.status(pdev.device)["device"]["partscan"] == (want != []), \
            f"status does not say partscan {want != []}"
        pdev.detach()

    # Attached once only; the message names the device.
    p = kind.cli("attach", image, "--transport", "ublk", check=False)
    assert p.returncode != 0 and f"already attached to {dev}" in p.stderr, \
        f"a second attach of {image}: rc {p.returncode}, {p.stderr!r}"

    # --device /dev/ublkbN, without --transport: that number; one in use
    # is refused, naming it.
    chosen = kind.attach(cl, other, args=["attach", other, "--device", "/dev/ublkb7",
                                          "--connections", str(CONNECTIONS)])
    assert chosen.device == "/dev/ublkb7", f"--device /dev/ublkb7 gave {chosen.device}"
    assert kind.status("ublkb7")["device"]["file"] == other, "status ublkb7: not the image"
    refused(kind, parted, "--device", dev, why=rf"{dev} is in use")
    chosen.detach()

    # What ublk does not do (yet) is refused, naming the option.
    refused(kind, other, "--autoclear", why=r"ublk transport does not take --autoclear")
    refused(kind, other, "--server", "nbdkit", why=r"does not take --server")
    refused(kind, other, "--device", "/dev/nbd3", why=r"does not take --device /dev/nbdN")
    refused(kind, "nbd://127.0.0.1:10809/x", why=r"remote export")
    p = kind.cli("resize", dev, check=False)
    assert p.returncode != 0 and "not supported" in p.stderr \
        and len(p.stderr.strip().splitlines()) == 1, f"resize of {dev}: {p.stderr!r}"

    # --transport auto: ublk for a plain local attach; NBD when asked for
    # what only NBD does (autoclear).
    auto = kind.cli("attach", other, "--transport", "auto").stdout.strip()
    assert re.fullmatch(r"/dev/ublkb\d+", auto), f"--transport auto gave {auto!r}"
    devices = [x["device"] for x in entries(kind)]
    assert devices == sorted([dev, auto], key=lambda d: int(d[len("/dev/ublkb"):])), \
        f"list shows {devices}"
    # Detach by image path, while a buffered writer holds the device open
    # with its data still in the page cache: detach writes it back first.
    data = os.urandom(64 << 10)
    fd = os.open(auto, os.O_WRONLY)
    try:
        assert os.pwrite(fd, data, 1 << 20) == len(data)
        kind.cli("detach", other)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # the device is gone: its pages were written back or lost
    wait_until(lambda: not os.path.exists(f"/sys/block/{ublk_name(auto)}"), f"{auto} to go")
    with open(other, "rb") as f:
        f.seek(1 << 20)
        assert f.read(len(data)) == data, \
            "data written (buffered, no fsync) before detach is not in the image"
    nbd = kind.cli("attach", other, "--transport", "auto", "--autoclear").stdout.strip()
    try:
        assert re.fullmatch(r"/dev/nbd\d+", nbd), \
            f"--transport auto --autoclear gave {nbd!r}, expected an nbd device"
    finally:
        kind.cli("detach", nbd, check=False)

    # A killed mloop-ublk is replaced by its supervisor, which takes the
    # device over (user recovery): what was written is still there.
    block = os.urandom(4096)
    write_block(dev, block)
    before = kind.status(dev)
    pid = before["device"]["server_pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: recovered(kind, dev, before), f"{dev} to be recovered", timeout=30)
    assert read_block(dev) == block, f"{dev}: the block written before the kill changed"
    # With its supervisor killed too, nothing recovers the device: detach
    # deletes what the kernel kept.
    st = kind.status(dev)
    os.kill(st["supervisor_pid"], signal.SIGKILL)
    os.kill(st["device"]["server_pid"], signal.SIGKILL)
    wait_until(lambda: not kind.status(dev)["server_running"], "mloop-ublk to die")
    name = ublk_name(dev)
    char = name.replace("ublkb", "ublkc")
    assert os.path.exists(f"/sys/class/ublk-char/{char}"), \
        f"{char} went with its server: the device was not made recoverable"
    kind.cli("detach", name)
    att.attached = False  # detached here, by its name
    wait_until(lambda: not os.path.exists(f"/sys/block/{name}")
               and not os.path.exists(f"/sys/class/ublk-char/{char}"),
               f"{dev} to be deleted")
    assert kind.state_entries() == [], f"detach left {kind.state_entries()}"


def recovered(kind, dev, before):
    s = kind.status(dev)
    return (s["restarts"] == before["restarts"] + 1 and s["server_running"]
            and s["device"]["server_pid"] != before["device"]["server_pid"])


def write_block(dev, data):
    buf = mmap.mmap(-1, len(data))
    buf.write(data)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        assert os.pwritev(fd, [buf], 0) == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_block(dev, size=4096):
    buf = mmap.mmap(-1, size)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], 0) == size
    finally:
        os.close(fd)
    return bytes(buf)
