"""mloop list --json and mloop status describe what is attached: the
device, the image, its size, read-only, connections, threads, the server
kind, a live server process serving that image, and its socket."""
import json
import os

from kfix import CONNECTIONS, IMAGE_SIZE, free_nbd, make_image

KEYS = {"device", "file", "size", "read_only", "connections", "threads",
        "server", "server_pid", "socket"}


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
    assert image in cmdline, f"server_pid {e['server_pid']} runs {cmdline!r}, not on {image}"
    assert os.path.exists(e["socket"]), f"socket {e['socket']} does not exist"


def run_test(kind, cl):
    rw_image, ro_image = make_image(cl, seed=1), make_image(cl, seed=2)
    rw = kind.attach(cl, rw_image).device
    ro = kind.attach(cl, ro_image, read_only=True).device

    entries = json.loads(kind.cli("list", "--json").stdout)
    assert isinstance(entries, list) and len(entries) == 2, f"list --json: {entries}"
    by_dev = {e.get("device"): e for e in entries}
    check_entry(kind, by_dev.get(rw, {}), rw, rw_image, False)
    check_entry(kind, by_dev.get(ro, {}), ro, ro_image, True)

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
