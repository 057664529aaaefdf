"""mloop attach sets the device's queue as docs/design.md "Queue settings"
says: no scheduler, the server kind's depth, 1 MiB requests, 128 KiB
read-ahead; --queue-option NAME=VALUE sets any other file of
/sys/block/nbdN/queue after those, and a bad one fails the attach naming
it, leaving nothing behind.  The logical block size follows the image's
backing: 512 on a 512-byte-sector disk, 4096 on a 4096-byte one."""
import os

from kfix import make_image, processes_mentioning, run, sysfs, tmpdir

DEPTH = {"native": 128, "nbdkit": 16}


def without_block_size(args):
    i = args.index("--block-size")
    return args[:i] + args[i + 2:]


def check_refused(kind, image, option, want):
    before = kind.state_entries()
    p = kind.cli(*kind.attach_args(image), "--queue-option", option, check=False)
    assert p.returncode != 0, f"--queue-option {option} was accepted"
    assert want in p.stderr and p.stderr.count("\n") == 1, \
        f"--queue-option {option}: {p.stderr!r} does not say {want!r} in one line"
    left = sorted(set(kind.state_entries()) - set(before))
    assert not left, f"refused attach left {left}"
    assert not processes_mentioning(image), f"refused attach left {processes_mentioning(image)}"


def four_k_backing(cl):
    """A directory on ext4 over a loop device with 4096-byte sectors."""
    d = tmpdir(cl)
    backing = os.path.join(d, "4k.img")
    with open(backing, "wb") as f:
        f.truncate(96 << 20)
    loop = run(["losetup", "--find", "--show", "--sector-size", "4096",
                "--direct-io=on", backing]).stdout.strip()
    cl.push(run, ["losetup", "-d", loop])
    run(["mkfs.ext4", "-q", "-b", "4096", loop])
    mnt = os.path.join(d, "mnt")
    os.mkdir(mnt)
    run(["mount", loop, mnt])
    cl.push(run, ["umount", mnt])
    return mnt


def run_test(kind, cl):
    image = make_image(cl)
    dev = kind.attach(cl, image, args=without_block_size(kind.attach_args(image))
                      + ["--queue-option", "read_ahead_kb=512"]).device
    got = {k: sysfs(dev, f"queue/{k}") for k in
           ("scheduler", "nr_requests", "max_sectors_kb", "read_ahead_kb",
            "logical_block_size", "max_hw_sectors_kb")}
    assert "[none]" in got["scheduler"], f"scheduler {got['scheduler']}"
    assert int(got["nr_requests"]) == DEPTH[kind.server], f"nr_requests {got['nr_requests']}"
    want_kb = min(1024, int(got["max_hw_sectors_kb"]))
    assert int(got["max_sectors_kb"]) == want_kb, f"max_sectors_kb {got['max_sectors_kb']}"
    assert got["read_ahead_kb"] == "512", f"--queue-option read_ahead_kb=512 gave {got['read_ahead_kb']}"
    assert got["logical_block_size"] == "512", \
        f"an image on a 512-byte-sector disk got block size {got['logical_block_size']}"

    check_refused(kind, make_image(cl, seed=2), "no_such_setting=1", "no_such_setting")
    check_refused(kind, make_image(cl, seed=3), "scheduler=no-such-scheduler", "scheduler")
    check_refused(kind, make_image(cl, seed=4), "read_ahead_kb", "NAME=VALUE")

    mnt = four_k_backing(cl)
    image4k = os.path.join(mnt, "disk.img")
    with open(image4k, "wb") as f:
        f.truncate(64 << 20)
    att = kind.attach(cl, image4k, args=without_block_size(kind.attach_args(image4k)))
    lbs = sysfs(att.device, "queue/logical_block_size")
    att.detach()
    assert lbs == "4096", f"an image on a 4096-byte-sector disk got block size {lbs}"
