#!/usr/bin/python3
"""nbdinfo shows exactly the flags mloop means to advertise: multi-conn,
flush, FUA, trim, zero, fast zero, no cache, DF, the block size constraints
and the base:allocation context; and read-only exports say so."""
import json
import shutil
import subprocess
import harness

if shutil.which("nbdinfo") is None:
    harness.skip("nbdinfo (libnbd-bin) is not installed")


def info(params=(), nbdkit_args=()):
    image = harness.make_image(16 << 20)
    srv = harness.Server(image, list(params), list(nbdkit_args))
    out = subprocess.run(["nbdinfo", "--json", srv.uri], check=True,
                         capture_output=True, text=True).stdout
    srv.stop()
    return json.loads(out)["exports"][0]


e = info()
expected = {
    "can_multi_conn": True, "can_flush": True, "can_fua": True,
    "can_trim": True, "can_zero": True, "can_fast_zero": True,
    "can_cache": False, "is_read_only": False, "can_df": True,
    "block_size_minimum": 1,
    "block_size_maximum": 64 << 20,
    "export-size": 16 << 20,
}
for k, v in expected.items():
    assert e.get(k) == v, f"{k}: nbdinfo says {e.get(k)!r}, expected {v!r}"
# The O_DIRECT alignment of the filesystem the image is on.
assert e.get("block_size_preferred") in (512, 1024, 2048, 4096), \
    f"preferred block size {e.get('block_size_preferred')}"
assert e.get("contexts") == ["base:allocation"], f"contexts: {e.get('contexts')}"

e = info(["discard=off"])
assert e["can_trim"] is False, "discard=off still advertises trim"
e = info(nbdkit_args=["-r"])
assert e["is_read_only"] is True and e["can_trim"] is False and e["can_zero"] is False
print("ok: nbdinfo flags match what the plugin means")
