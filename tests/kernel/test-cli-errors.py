"""mloop's refusals on a machine with nbd: each is one line on stderr,
a non-zero exit, nothing on stdout, and nothing left behind (no device,
server or state), and an attached device survives a refused attach."""
import os

from kfix import make_image, nbd_in_use, processes_mentioning, tmpdir


def refused(kind, *args):
    """Runs mloop ARGS, which must fail cleanly; returns its message."""
    before = [d for d in os.listdir("/sys/block") if d.startswith("nbd")
              and nbd_in_use(f"/dev/{d}")]
    p = kind.cli(*args, check=False)
    what = "mloop " + " ".join(args)
    assert p.returncode != 0, f"{what} succeeded"
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"{what}: stderr {p.stderr!r}, expected one line"
    assert p.stdout == "", f"{what} printed {p.stdout!r}"
    after = [d for d in os.listdir("/sys/block") if d.startswith("nbd")
             and nbd_in_use(f"/dev/{d}")]
    assert after == before, f"{what} left devices connected: {sorted(set(after) - set(before))}"
    return lines[0]


def run_test(kind, cl):
    state_before = kind.state_entries()
    missing = os.path.join(tmpdir(cl), "no-such.img")
    refused(kind, *kind.attach_args(missing))
    assert not processes_mentioning(missing), "a server was left for a missing image"
    assert kind.state_entries() == state_before, "a refused attach left state"

    image = make_image(cl)
    att = kind.attach(cl, image)
    state_attached = kind.state_entries()
    # The same image twice, and a device already in use.
    refused(kind, *kind.attach_args(image))
    other = make_image(cl, seed=3)
    refused(kind, *kind.attach_args(other), "--device", att.device)
    assert not processes_mentioning(other), "a server was left for a refused attach"
    assert kind.state_entries() == state_attached, "a refused attach left state"
    assert nbd_in_use(att.device), "a refused attach disturbed the attached device"
    fd = os.open(att.device, os.O_RDONLY)
    try:
        assert len(os.pread(fd, 4096, 0)) == 4096, "the attached device stopped reading"
    finally:
        os.close(fd)

    # Detaching what is not attached.
    refused(kind, "detach", other)
    att.detach()
    refused(kind, "detach", att.device)
