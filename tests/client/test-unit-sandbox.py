#!/usr/bin/python3
"""The serving units, run by a real systemd manager (tests/unitmanager.py)
with their whole sandbox: mloop-serve@ with the native server and with
--server nbdkit, and the socket-activated mloop-nbdkit@, each over TCP
on 127.0.0.1 with TLS (a pre-shared key).  A client writes and reads
back through each, the data lands in the image, and the kernel confirms
the sandbox of every process of the unit (no new privileges, a seccomp
filter, the unit's capability bounding set); stopping the unit stops it
cleanly.  Each unit's keys are ones systemd knows, and its exposure
(systemd-analyze security) stays where the sandbox put it.  About 4 s."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import nbd

import harness
import unitmanager
from harness import check

BUILD = os.path.dirname(os.path.dirname(os.environ["MLOOP_CLI"]))
SBINDIR_MLOOP = "/mloop serve "
SIZE = 16 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unit_file(subdir, name):
    path = os.path.join(BUILD, subdir, name)
    if not os.path.exists(path):
        harness.skip(f"{path} is not built (no systemd pkg-config file at setup)")
    return path


def descendants(pid):
    """PID and every process below it."""
    found = [pid]
    for p in found:
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


# What a server needs: its file limit and IO threads (SYS_RESOURCE),
# --mlock (IPC_LOCK), an image whatever its owner (DAC_OVERRIDE).
SERVER_CAPS = ["CAP_SYS_RESOURCE", "CAP_IPC_LOCK", "CAP_DAC_OVERRIDE"]


def mount_options(pid, where):
    """The options of the mount at WHERE as process PID sees it, or None."""
    found = None
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == where:
                found = fields[5]      # the last mount there is the one seen
    return found


def check_sandbox(name, pid):
    # What the unit keeps of what this machine has (a container may
    # lack some, CAP_SYS_RESOURCE say).
    want = unitmanager.capability_mask(SERVER_CAPS)
    want &= int(unitmanager.process_status(os.getpid())["CapBnd"], 16)
    for p in descendants(pid):
        try:
            st = unitmanager.process_status(p)
            usr = mount_options(p, "/usr")
            home = mount_options(p, "/home")
        except OSError:
            continue
        what = f"{name}: pid {p} ({st.get('Name')})"
        check(f"{what}: no new privileges", st.get("NoNewPrivs") == "1", st.get("NoNewPrivs"))
        check(f"{what}: seccomp filter", st.get("Seccomp") == "2", st.get("Seccomp"))
        check(f"{what}: capability bounding set", int(st["CapBnd"], 16) == want,
              f"{st['CapBnd']} != {want:016x}")
        check(f"{what}: /usr read-only", usr is not None and usr.split(",")[0] == "ro", usr)
        check(f"{what}: /home hidden", home is not None, "no mount on /home")


def exchange(name, port, psk, image):
    """Writes, flushes and reads back through the export; the data is in
    the image."""
    data = os.urandom(64 << 10)
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)
    h.connect_uri(f"nbds://alice@127.0.0.1:{port}/disk?tls-psk-file={psk}")
    try:
        check(f"{name}: export size", h.get_size() == SIZE, str(h.get_size()))
        h.pwrite(data, 1 << 20)
        h.flush()
        check(f"{name}: reads back", h.pread(len(data), 1 << 20) == data)
    finally:
        h.shutdown()
    with open(image, "rb") as f:
        f.seek(1 << 20)
        check(f"{name}: the data is in the image", f.read(len(data)) == data)


def wait_listening(m, unit, port, log):
    end = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            pass
        if m.state(unit) == "failed" or time.monotonic() > end:
            raise AssertionError(f"{unit} does not listen ({m.state(unit)}): {read(log)}")
        time.sleep(0.05)


def read(path):
    try:
        with open(path) as f:
            return f.read()[-2000:]
    except OSError:
        return ""


def write_conf(work, name, lines):
    path = os.path.join(work, name + ".conf")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def serve_unit(m, work, psk, server):
    """mloop-serve@ running `mloop serve` with SERVER (native, nbdkit)."""
    template = unit_file("systemd", "mloop-serve@.service")
    m.install(template)
    unit = f"mloop-serve@{server}.service"
    image = harness.make_image(SIZE, directory=work)
    port = free_port()
    conf = write_conf(work, server, [
        f"IMAGE={image}", f"LISTEN=tcp:127.0.0.1:{port}",
        f"OPTIONS=--export-name disk --tls require --tls-psk {psk} --server {server}"])
    # The unit's own ExecStart, with the build tree's mloop.
    exec_start = unitmanager.unit_value(template, "ExecStart")
    exec_start = os.environ["MLOOP_CLI"] + " serve " + exec_start.split(SBINDIR_MLOOP, 1)[1]
    log = os.path.join(work, server + ".log")
    m.drop_in(unit, "[Service]\nEnvironmentFile=\n"
              f"EnvironmentFile={conf}\nExecStart=\nExecStart={exec_start}\n"
              f"StandardOutput=append:{log}\nStandardError=append:{log}\n"
              + plugin_env())
    m.systemctl("start", unit)
    harness.on_exit(lambda: m.systemctl("stop", unit, check=False))
    wait_listening(m, unit, port, log)
    name = f"mloop-serve@ ({server})"
    check_sandbox(name, m.main_pid(unit))
    exchange(name, port, psk, image)
    m.systemctl("stop", unit)
    check(f"{name}: stops cleanly", m.state(unit) == "inactive", m.state(unit) + read(log))


def plugin_env():
    """The build tree's servers, as the tests' environment names them."""
    env = ""
    for var in ("MLOOP_SERVER_BIN", "MLOOP_PLUGIN", "MLOOP_SERVER_TLS_MODULE"):
        if os.environ.get(var):
            env += f"Environment={var}={os.environ[var]}\n"
    return env


def nbdkit_unit(m, work, psk):
    """The socket-activated mloop-nbdkit@: the first connection starts it."""
    template = unit_file("systemd", "mloop-nbdkit@.service")
    plugin = os.environ.get("MLOOP_PLUGIN") or os.path.join(BUILD, "plugin",
                                                             "nbdkit-mloop-plugin.so")
    if not os.path.exists(plugin):
        harness.skip(f"{plugin} is not built")
    m.install(template)
    m.install(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                           "systemd", "mloop-nbdkit@.socket"))
    unit = "mloop-nbdkit@disk.service"
    image = harness.make_image(SIZE, directory=work)
    port = free_port()
    conf = write_conf(work, "nbdkit", [
        f"IMAGE={image}",
        f"NBDKIT_OPTIONS=--exportname=disk --tls=require --tls-psk={psk}"])
    exec_start = unitmanager.unit_value(template, "ExecStart").replace(
        " mloop file=", f" {plugin} file=")
    log = os.path.join(work, "nbdkit.log")
    m.drop_in("mloop-nbdkit@disk.socket", f"[Socket]\nListenStream=\nListenStream=127.0.0.1:{port}\n")
    m.drop_in(unit, "[Service]\nEnvironmentFile=\n"
              f"EnvironmentFile={conf}\nExecStart=\nExecStart={exec_start}\n"
              f"StandardOutput=append:{log}\nStandardError=append:{log}\n")
    m.systemctl("start", "mloop-nbdkit@disk.socket")
    harness.on_exit(lambda: m.systemctl("stop", unit, "mloop-nbdkit@disk.socket", check=False))
    name = "mloop-nbdkit@ (socket activated)"
    check(f"{name}: not started before a client", m.state(unit) == "inactive", m.state(unit))
    exchange(name, port, psk, image)
    check_sandbox(name, m.main_pid(unit))
    m.systemctl("stop", unit, "mloop-nbdkit@disk.socket")
    check(f"{name}: stops cleanly", m.state(unit) == "inactive", m.state(unit) + read(log))


# systemd-analyze security's exposure (0-100 here, 0-10 as it prints it)
# that each unit must not exceed: what the sandbox reached, so that a key
# lost shows (docs/remote.md lists the scores).
EXPOSURE_LIMITS = {("systemd", "mloop-serve@.service"): 27,
                   ("systemd", "mloop-nbdkit@.service"): 27,
                   ("dbus", "mloop-dbus.service"): 48}


def check_unit_files(work):
    """Every key of each unit is one systemd knows, with a value it
    parses (it would ignore it, warning only), and the exposure holds."""
    for (subdir, name), limit in EXPOSURE_LIMITS.items():
        path = os.path.join(BUILD, subdir, name)
        if not os.path.exists(path):
            print(f"ok   {name}: not built, not checked")
            continue
        # An instance, as systemd would load it.
        copy = os.path.join(work, name.replace("@.", "@disk."))
        shutil.copy(path, copy)
        r = subprocess.run(["systemd-analyze", "verify", copy], capture_output=True, text=True)
        bad = [line for line in r.stderr.splitlines()
               if "Unknown" in line or "Failed to parse" in line or "Invalid" in line]
        check(f"{name}: systemd knows every key and value", not bad, "; ".join(bad))
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                            f"--threshold={limit}", copy], capture_output=True, text=True)
        check(f"{name}: exposure at most {limit / 10}", r.returncode == 0,
              r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip())
    check_dbus_stop_timeout()


# dbus-daemon's service_start_timeout: how long an activation may wait
# for the service to start (its default; Debian's system bus keeps it).
BUS_ACTIVATION_S = 25


def check_dbus_stop_timeout():
    """A stop of mloop-dbus.service with a close stuck on a user's FUSE
    server holds the unit, and the next call's activation, for both of
    its stop timeouts (SIGTERM's, then SIGKILL's, which that close
    outlives): they fit in the bus's activation timeout."""
    path = os.path.join(BUILD, "dbus", "mloop-dbus.service")
    if not os.path.exists(path):
        return
    value = unitmanager.unit_value(path, "TimeoutStopSec") or "90"    # systemd's default
    seconds = float(value[:-1] if value.endswith("s") else value)
    check("mloop-dbus.service: a stop held by a stuck close frees the unit "
          f"within the bus's {BUS_ACTIVATION_S} s activation timeout",
          2 * seconds < BUS_ACTIVATION_S, f"TimeoutStopSec={value}: {2 * seconds:g} s")


def main():
    try:
        m = unitmanager.UserManager()
        m.__enter__()
    except unitmanager.Unavailable as e:
        harness.skip(str(e))
    harness.on_exit(m.close)
    # The units hide /home, /root, /tmp and /var/tmp: the programs and
    # files they are given live beside the build tree.
    if BUILD.startswith(("/home/", "/root/", "/tmp/", "/var/tmp/")):
        harness.skip(f"the build tree {BUILD} is where the units' sandbox hides it")
    work = tempfile.mkdtemp(prefix="unit-sandbox-", dir=BUILD)
    harness.on_exit(lambda: shutil.rmtree(work, ignore_errors=True))
    os.chmod(work, 0o755)
    check_unit_files(work)
    psk = harness.make_psk_file(os.path.join(work, "keys.psk"))
    serve_unit(m, work, psk, "native")
    serve_unit(m, work, psk, "nbdkit")
    nbdkit_unit(m, work, psk)
    harness.exit_if_failed()


main()
