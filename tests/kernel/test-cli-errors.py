"""mloop's refusals on a machine with nbd: each is one line on stderr,
a non-zero exit, nothing on stdout, and nothing left behind (no device,
server or state), and an attached device survives a refused attach."""
import os
import subprocess

from kfix import make_image, nbd_in_use, processes_mentioning, tmpdir
import kinds


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


# What each broken server says, which must reach the user.
BROKEN_WORDS = {"native": "mloop-test: cannot serve", "nbdkit": "no-such-plugin"}


def server_that_fails(kind, cl):
    """Environment overrides that make this kind's server fail at start,
    and the words of its failure that must reach the user."""
    if isinstance(kind, kinds.MloopServiceInProcess):
        # No program to break: mloopd's own open of the image fails (a
        # test switch standing in for fs.aio-max-nr).
        return {"MLOOP_TEST_AIO_MAX": "1"}, "MLOOP_TEST_AIO_MAX"
    return server_program_that_fails(kind, cl), BROKEN_WORDS[kind.server]


def server_program_that_fails(kind, cl):
    if kind.server == "native":
        script = os.path.join(tmpdir(cl), "broken-server")
        with open(script, "w") as f:
            f.write("#!/bin/sh\necho 'mloop-test: cannot serve this image' >&2\nexit 1\n")
        os.chmod(script, 0o755)
        return {"MLOOP_SERVER_BIN": script}
    return {"MLOOP_PLUGIN": os.path.join(tmpdir(cl), "no-such-plugin.so")}


def run_test(kind, cl):
    state_before = kind.state_entries()
    missing = os.path.join(tmpdir(cl), "no-such.img")
    refused(kind, *kind.attach_args(missing))
    assert not processes_mentioning(missing), "a server was left for a missing image"
    assert kind.state_entries() == state_before, \
        f"a refused attach left state: {kind.state_entries()} (before: {state_before})"

    # A server that fails to start: its own error reaches the user.
    image = make_image(cl)
    broken, words = server_that_fails(kind, cl)
    with kind.server_environment(broken) as env:
        p = subprocess.run([kinds.CLI, *kind.attach_args(image)], capture_output=True,
                           text=True, timeout=240, env=env)
    lines = p.stderr.splitlines()
    assert p.returncode != 0 and len(lines) == 1, f"broken server: {p.stderr!r}"
    assert "failed to start" in lines[0] and words in lines[0], \
        f"the server's error is not in {lines[0]!r}"
    assert not processes_mentioning(image), "a broken server's supervisor was left"
    assert kind.state_entries() == state_before, \
        f"a failed server start left state: {kind.state_entries()}"

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
