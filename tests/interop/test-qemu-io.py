#!/usr/bin/python3
"""qemu-io issues many AIO reads, writes and flushes at once (they
complete out of order); every pattern reads back."""
import shutil
import subprocess
import harness

if shutil.which("qemu-io") is None:
    harness.skip("qemu-io (qemu-utils) is not installed")

image = harness.make_image(64 << 20)
srv = harness.Server(image)
cmds = []
for i in range(32):                    # interleaved sizes finish out of order
    size = (4 << 10) if i % 2 else (1 << 20)
    cmds += ["-c", f"aio_write -P {i + 1} {i * (2 << 20)} {size}"]
cmds += ["-c", "aio_flush"]
for i in reversed(range(32)):
    size = (4 << 10) if i % 2 else (1 << 20)
    cmds += ["-c", f"aio_read -P {i + 1} {i * (2 << 20)} {size}"]
cmds += ["-c", "aio_flush"]
p = subprocess.run(["qemu-io", "-f", "raw", f"nbd:unix:{srv.sock}", *cmds],
                   capture_output=True, text=True, timeout=300)
srv.stop()
out = p.stdout + p.stderr
assert p.returncode == 0, out
assert "Pattern verification failed" not in out and "failed" not in out.lower(), out
assert out.count("read ") == 32 and out.count("wrote ") == 32, out
print("ok: 32 aio_write + flush + 32 aio_read verified through qemu-io")
