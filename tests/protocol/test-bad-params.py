#!/usr/bin/python3
"""Bad configuration makes nbdkit exit at startup with one line naming
the parameter and the reason, and creates or truncates nothing (on an
RBD image: the same parameters beside rbd=)."""
import os
import subprocess
import harness

harness.nbdkit_only("nbdkit's parameter parsing")

d = harness.tmpdir()
image = harness.make_image(1 << 20, data=b"keep me", directory=d)
before = harness.file_digest(image)
missing = os.path.join(d, "no-such.img")
sock = os.path.join(d, "s.sock")
harness.on_exit(lambda: os.path.exists(sock) and os.unlink(sock))

target = harness.nbdkit_image_params(image)   # file=IMAGE, or rbd= and its options
cases = [
    ([], "file= or rbd=: the image file, block device or RBD image to serve is required"),
]
if harness.file_only("a missing file and a directory as the image"):
    cases += [
        ([f"file={missing}"], f"file={missing}: No such file or directory"),
        ([f"file={d}"], "is a directory"),
    ]
cases += [
    ([*target, "threads=0"], "threads=0: must be between 1 and 64"),
    ([*target, "threads=1000"], "threads=1000: must be between 1 and 64"),
    ([*target, "threads=four"], "threads"),
    ([*target, "queue-depth=0"], "queue-depth=0: must be between 1 and 4096"),
    ([*target, "direct=maybe"], "direct=maybe: must be auto, on or off"),
    ([*target, "discard=maybe"], "discard=maybe: must be on or off"),
    ([*target, "colour=blue"], "unknown parameter 'colour'"),
]
for params, message in cases:
    p = subprocess.run(["nbdkit", "-f", "-U", sock, harness.PLUGIN, *params],
                       capture_output=True, text=True, timeout=30,
                       env=harness.nbdkit_env())
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert p.returncode != 0, f"{params}: nbdkit started"
    assert any(message in l for l in errors), \
        f"{params}: expected '{message}' in stderr, got: {p.stderr!r}"
    assert len(errors) == 1, f"{params}: expected one error line, got {errors}"

assert not os.path.exists(missing), "a missing image was created"
assert harness.file_digest(image) == before, "the image was modified"
print(f"ok: {len(cases)} bad configurations refused with a clear message")
