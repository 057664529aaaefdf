#!/usr/bin/python3
"""The library's client handshake (nbd/nbd_client.c, for `mloop attach`)
negotiates with the server under test and with qemu-nbd: the size,
transmission flags and block sizes it learns match what nbdinfo sees,
and the connection then serves a read."""
import json
import os
import shutil
import subprocess
import time
import harness

HELPER = os.environ.get("MLOOP_NBD_GO")
if not HELPER or not os.path.exists(HELPER):
    harness.skip("MLOOP_NBD_GO does not name the built helper")
if shutil.which("nbdinfo") is None:
    harness.skip("nbdinfo (libnbd-bin) is not installed")

FLAG = {"is_read_only": 1 << 1, "can_flush": 1 << 2, "can_fua": 1 << 3,
        "can_trim": 1 << 5, "can_zero": 1 << 6, "can_multi_conn": 1 << 8,
        "can_fast_zero": 1 << 11}


def check(sock, uri, name=""):
    got = json.loads(subprocess.run([HELPER, sock, name], check=True, capture_output=True,
                                    text=True, timeout=30).stdout)
    info = json.loads(subprocess.run(["nbdinfo", "--json", uri], check=True,
                                     capture_output=True, text=True).stdout)["exports"][0]
    assert got["size"] == info["export-size"], (got, info["export-size"])
    for key, bit in FLAG.items():
        assert bool(got["flags"] & bit) == info[key], f"{key}: flags {got['flags']:#x}"
    if "block_size_minimum" in info:
        assert (got["min"], got["preferred"], got["max"]) == (
            info["block_size_minimum"], info["block_size_preferred"], info["block_size_maximum"])
    assert got["read_ok"], "no read after the handshake"
    return got


image = harness.make_image(8 << 20, data=b"mloop")
srv = harness.Server(image)
check(srv.sock, srv.uri)
srv.stop()

if shutil.which("qemu-nbd"):
    d = harness.tmpdir()
    sock = os.path.join(d, "q.sock")
    q = subprocess.Popen(["qemu-nbd", "-t", "-f", "raw", "-x", "disk", "-k", sock, image])  # -t: outlive the first client
    harness.on_exit(lambda: (q.terminate(), q.wait()))
    deadline = time.time() + 10
    while not os.path.exists(sock) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    check(sock, f"nbd+unix:///disk?socket={sock}", "disk")
print("ok: library handshake agrees with nbdinfo (server under test, qemu-nbd)")
