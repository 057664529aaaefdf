#!/usr/bin/python3
"""nbdkit mloop --help lists every parameter; --version names mloop."""
import subprocess
import harness

harness.nbdkit_only("nbdkit --help/--version")

out = subprocess.run(["nbdkit", harness.PLUGIN, "--help"], env=harness.nbdkit_env(),
                     capture_output=True, text=True, check=True).stdout
for param in ("file=", "threads=", "queue-depth=", "direct="):
    assert param in out, f"--help does not mention {param}"
out = subprocess.run(["nbdkit", harness.PLUGIN, "--version"], env=harness.nbdkit_env(),
                     capture_output=True, text=True, check=True).stdout
assert "mloop" in out, f"--version: {out!r}"
print("ok: --help and --version")
