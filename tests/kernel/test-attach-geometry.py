"""An attached device shows one hardware queue per connection, the image's
size, the requested logical block size, and a write-back cache (the servers
advertise FLUSH, so the kernel must send flushes)."""
import os

from kfix import IMAGE_SIZE, make_image, run, sysfs


def run_test(kind, cl):
    image = make_image(cl)
    dev = kind.attach(cl, image).device
    queues = os.listdir(f"/sys/block/{os.path.basename(dev)}/mq")
    assert len(queues) == kind.queues, f"{len(queues)} hardware queues, expected {kind.queues}"
    size = int(sysfs(dev, "size")) * 512
    assert size == IMAGE_SIZE, f"sysfs size {size}, expected {IMAGE_SIZE}"
    size64 = int(run(["blockdev", "--getsize64", dev]).stdout)
    assert size64 == IMAGE_SIZE, f"BLKGETSIZE64 {size64}, expected {IMAGE_SIZE}"
    lbs = int(sysfs(dev, "queue/logical_block_size"))
    assert lbs == kind.block_size, f"logical block size {lbs}, expected {kind.block_size}"
    cache = sysfs(dev, "queue/write_cache")
    assert cache == "write back", f"write_cache is {cache!r}, expected 'write back'"
    assert sysfs(dev, "ro") == "0", "a read-write attach came up read-only"
