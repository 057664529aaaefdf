"""mloop list --json and mloop status describe what is attached: the
device, the image, its size, read-only, connections, threads, the server
kind, a live server process serving that image, and its socket; and the
device's processes work in /, not in the directory attach ran in."""
import json
import os

from kfix import CONNECTIONS, IMAGE_SIZE, free_nbd, make_image

KEYS = {"device", "file", "size", "read_only", "connections", "threads",
        "server", "server_pid", "server_in_process", "socket"}


def check_entry(kind, e, device, image, read_only):
    missing = KEYS - set(e)
    assert not missing, f"entry lacks {sorted(missing)}: {e}"
    assert e["device"] == device, f"device {e['device']}, expected {device}"
    assert e["file"] == image, f"file {e['file']}, expected {image}"
    assert e["size"] == IMAGE_SIZE, f"size {e['size']}, expected {IMAGE_SIZE}"
    assert e["read_only"] is read_only, f"read_only {e['read_only']}, expected {read_only}"
    assert e["connections"] == CONNECTIONS, f"connections {e['connections']}"
    assert e["threads"] == 4, f"threads {e['threads']}, expected 4"
    assert e["server"] == kind.server, f"server {e['server']}, expected {kind.server}"
    with open(f"/proc/{e['server_pid']}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode()
    if e["server_in_process"]:
        # Served inside mloopd (the in-process kind): its pid is mloopd's.
        assert "mloopd" in cmdline, f"server_pid {e['server_pid']} runs {cmdline!r}, not mloopd"
    else:
        assert image in cmdline, f"server_pid {e['server_pid']} runs {cmdline!r}, not on {image}"
    assert os.path.exists(e["socket"]), f"socket {e['socket']} does not exist"


def check_not_in_cwd(e, attached_from):
    """A device's processes live for weeks: they must not keep the
    directory `mloop attach` ran in busy (its file system could not be
    unmounted)."""
    for key in ("server_pid", "supervisor_pid"):
        if e.get(key):
            cwd = os.readlink(f"/proc/{e[key]}/cwd")
            assert cwd == "/", f"{key} {e[key]} works in {cwd}, attached from {attached_from}"


def run_test(kind, cl):
    rw_image, ro_image = make_image(cl, seed=1), make_image(cl, seed=2)
    here = os.getcwd()
    attached_from = os.path.dirname(rw_image)
    os.chdir(attached_from)
    try:
        rw = kind.attach(cl, rw_image).device
        ro = kind.attach(cl, ro_image, read_only=True).device
    finally:
        os.chdir(here)

    entries = json.loads(kind.cli("list", "--json").stdout)
    assert isinstance(entries, list) and len(entries) == 2, f"list --json: {entries}"
    by_dev = {e.get("device"): e for e in entries}
    check_entry(kind, by_dev.get(rw, {}), rw, rw_image, False)
    check_entry(kind, by_dev.get(ro, {}), ro, ro_image, True)
    check_not_in_cwd(by_dev.get(rw, {}), attached_from)

    plain = kind.cli("list").stdout
    for dev, image in [(rw, rw_image), (ro, ro_image)]:
        assert any(dev in line and image in line for line in plain.splitlines()), \
            f"mloop list does not show {dev} with {image}:\n{plain}"

    status = json.loads(kind.cli("status", rw, "--json").stdout)
    assert isinstance(status, dict), f"status --json is not an object: {status}"
    # The list entry, at the top level or (as mloop does) under "device"
    # beside the counters.
    entry = status["device"] if isinstance(status.get("device"), dict) else status
    check_entry(kind, entry, rw, rw_image, False)
    assert kind.cli("status", rw).stdout.strip(), "mloop status printed nothing"
    # A device mloop did not attach is an error, not an empty status.
    idle = free_nbd()
    assert kind.cli("status", idle, check=False).returncode != 0, \
        f"mloop status {idle} (not attached) succeeded"
