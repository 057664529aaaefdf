"""mloop attach honours --block-size (512 as well as the 4096 every other
test uses) and --device (the device asked for is the one printed)."""
import os

from kfix import IMAGE_SIZE, free_nbd, make_image, sysfs


def run_test(kind, cl):
    image = make_image(cl)
    args = kind.attach_args(image)
    args[args.index("--block-size") + 1] = "512"
    # Not the first free device: a --find would pick that one anyway.
    first = free_nbd()
    want = f"/dev/nbd{int(first[len('/dev/nbd'):]) + 1}"
    assert os.path.exists(want), f"{want} does not exist"
    att = kind.attach(cl, image, args=args + ["--device", want])
    assert att.device == want, f"mloop attach --device {want} printed {att.device}"
    lbs = sysfs(want, "queue/logical_block_size")
    assert lbs == "512", f"logical block size {lbs}, expected 512"
    size = int(sysfs(want, "size")) * 512
    assert size == IMAGE_SIZE, f"size {size}, expected {IMAGE_SIZE}"
