"""A partitioned image shows its partitions: /dev/nbdNp1 and p2 exist as
soon as mloop attach returns (no udev in the VM, no partprobe), read the
image's bytes at the partitions' offsets, follow a re-read of a changed
table, are there again after a resize, and are gone after detach; with
--no-partscan there are none, even after the device has been opened or
resized."""
import os

from kfix import IMAGE_SIZE, make_image, run, sysfs

MIB = 1 << 20
# sfdisk script: a GPT with two partitions, at 1 MiB (64 MiB long) and at
# 65 MiB (to 1 MiB before the end, where the backup GPT goes).
TABLE = "label: gpt\nstart=2048, size=131072, name=one\nstart=133120, size=262144, name=two\n"
P2_OFFSET = 133120 * 512
MBR_TABLE = "label: dos\nstart=2048, size=65536\nstart=67584, size=65536\n"
MARK = b"mloop partition two\n" * 200


def without_block_size(args):
    i = args.index("--block-size")
    return args[:i] + args[i + 2:]


def partitions(dev):
    name = os.path.basename(dev)
    return sorted(p for p in os.listdir(f"/sys/block/{name}")
                  if p.startswith(f"{name}p"))


def make_partitioned(cl):
    image = make_image(cl)
    run(["sfdisk", "--quiet", image], input=TABLE)
    with open(image, "r+b") as f:
        f.seek(P2_OFFSET)
        f.write(MARK)
        os.fsync(f.fileno())
    return image


def run_test(kind, cl):
    max_part = open("/sys/module/nbd/parameters/max_part").read().strip()
    if max_part == "0":
        from kfix import Skip
        raise Skip("the nbd module was loaded with max_part=0: no partitions")
    print(f"# partitions: the nbd module's max_part is {max_part}", flush=True)
    image = make_partitioned(cl)
    # The table is written for 512-byte sectors: the device must have them
    # (the image's backing has them, so that is the default).
    att = kind.attach(cl, image, args=without_block_size(kind.attach_args(image)))
    dev = att.device
    name = os.path.basename(dev)
    assert partitions(dev) == [f"{name}p1", f"{name}p2"], \
        f"{dev} has partitions {partitions(dev)} right after attach (nbd max_part {max_part})"
    assert os.path.exists(f"{dev}p2"), f"{dev}p2 has no device node"
    assert int(sysfs(dev, f"{name}p1/size")) == 131072, f"{name}p1 size {sysfs(dev, f'{name}p1/size')}"
    fd = os.open(f"{dev}p2", os.O_RDONLY)
    try:
        got = os.pread(fd, len(MARK), 0)
    finally:
        os.close(fd)
    assert got == MARK, f"{dev}p2 does not start with the image's bytes at {P2_OFFSET}"

    # A third partition written through the device appears on a re-read.
    run(["sfdisk", "--quiet", "--no-reread", "--append", dev],
        input="start=397312, size=8192, name=three\n")
    run(["blockdev", "--rereadpt", dev])
    assert partitions(dev) == [f"{name}p1", f"{name}p2", f"{name}p3"], \
        f"after a re-read {dev} has {partitions(dev)}"

    att.detach()
    assert not os.path.exists(f"/sys/block/{name}/{name}p1"), f"{name}p1 outlived detach"
    assert not os.path.exists(f"{dev}p1"), f"{dev}p1 outlived detach"

    args = without_block_size(kind.attach_args(image)) + ["--no-partscan"]
    att = kind.attach(cl, image, args=args)
    with open(att.device, "rb") as f:    # an open would read the table
        f.read(4096)
    assert partitions(att.device) == [], \
        f"--no-partscan: {att.device} has {partitions(att.device)}"
    assert int(sysfs(att.device, "size")) * 512 == IMAGE_SIZE
    att.detach()

    # After a resize (which marks the table for reading again) the
    # partitions are there, and with --no-partscan still none.  An MBR
    # label: a grown GPT disk's backup header is no longer at its end,
    # which the kernel logs as a warning.
    grown = IMAGE_SIZE + (64 << 20)
    image = make_image(cl, seed=2)
    run(["sfdisk", "--quiet", image], input=MBR_TABLE)
    att = kind.attach(cl, image, args=without_block_size(kind.attach_args(image))
                      + ["--no-partscan"])
    kind.cli("resize", att.device, "--size", str(grown))
    assert partitions(att.device) == [], \
        f"--no-partscan: after a resize {att.device} has {partitions(att.device)}"
    att.detach()
    att = kind.attach(cl, image, args=without_block_size(kind.attach_args(image)))
    name = os.path.basename(att.device)
    assert partitions(att.device) == [f"{name}p1", f"{name}p2"], \
        f"MBR: {att.device} has {partitions(att.device)} after attach"
    kind.cli("resize", att.device, "--size", str(grown + (64 << 20)))
    assert int(sysfs(att.device, "size")) * 512 == grown + (64 << 20)
    assert partitions(att.device) == [f"{name}p1", f"{name}p2"], \
        f"after a resize {att.device} has {partitions(att.device)}"
    assert os.path.exists(f"{att.device}p2"), f"{att.device}p2 has no node after a resize"
