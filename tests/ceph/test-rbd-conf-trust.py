#!/usr/bin/python3
"""mloop-server refuses a Ceph configuration another user could write.

The configuration says which cluster is served, and where librados
writes its log (log_file) and binds its admin socket, as the server's
user: a root server (an attached device's, restarted by its supervisor
at any time) reading a file another user can write would create or
append to any file that user names, and serve their cluster's image.
So --ceph-conf and a name's conf= are refused, in one line naming the
file, unless it is a file of the server's user or root that no one
else may write, as the device's lock records are:

1. a world-writable configuration naming a log file: refused, and the
   log file is never created;
2. the same file made 0644 but owned by another user (root only:
   chown): refused;
3. the same file of the server's user, 0644: read (the server then
   fails to reach the monitor it names, 127.0.0.1:1, within its
   client_mount_timeout), as is one behind a symbolic link (the file it
   leads to is what is judged and read);
4. no configuration named: the one librados's own search finds is
   judged the same, $CEPH_CONF's (refused world-writable, read 0644;
   its places spelt as librados reads them: $data_dir's passed over,
   ${cluster} for $cluster),
   and, where /etc/ceph/ceph.conf does not exist, a world-writable
   ceph.conf in the working directory (the search's last place: a root
   `mloop resize` run in /tmp would read it) or in $HOME/.ceph;
5. a file named backup.conf is the configuration of the cluster
   "backup", as librados names it: its keyring=$CEPH_DIR/$cluster.keyring
   is backup.keyring (the store reads the file as /proc/self/fd/N, a
   name librados would make the cluster "ceph" of, and would look for
   ceph.keyring); prod.conf.orig's cluster is "ceph" and x.conf.d.conf's
   "x.conf.d", as librados names them (the stem of a name ending in
   ".conf", else "ceph");
6. a configuration named by a device's recorded name (conf=) is walked
   again by every server that starts, not only at attach: root's
   directory holding it, in a sticky world-writable one (/tmp), passes
   and is read; once that directory is gone (a /tmp cleaner) and a user
   has made one of that name, holding a link to another configuration
   of root's (another cluster's), the next start refuses, naming the
   user's directory, and reads nothing (root only: chown); and so when
   that change of hands happens just as the server opens the path (an
   LD_PRELOAD shim, swap_on_open.c, built with cc, swaps the directories
   at its first open of the path: the server must look first and walk
   after, never open by name after its walk).

No cluster: the monitor named does not exist.  SKIPs (77) when
MLOOP_SERVER_BIN has no RBD support (no --ceph-conf).

Cost on the project machine (2 cores): about 12 s (each configuration
read waits 1 s for its monitor).
"""
import base64
import os
import shutil
import struct
import subprocess
import sys
import tempfile

# Absolute: some servers run in another working directory.
SERVER_BIN = os.path.abspath(os.environ.get("MLOOP_SERVER_BIN",
                                            "build/server/mloop-server"))
failed = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""),
          flush=True)
    if not ok:
        failed.append(name)
    return ok


try:
    helptext = subprocess.run([SERVER_BIN, "--help"], capture_output=True, text=True,
                              timeout=30).stdout
except OSError as e:
    print(f"SKIP: {SERVER_BIN}: {e.strerror}")
    sys.exit(77)
if "--ceph-conf" not in helptext:
    print(f"SKIP: {SERVER_BIN} has no RBD support (no --ceph-conf)")
    sys.exit(77)

work = tempfile.mkdtemp(prefix="mloop-conf-trust-")
os.chmod(work, 0o755)


def write_conf(path, log):
    with open(path, "w") as f:
        f.write("[global]\n"
                "mon_host = 127.0.0.1:1\n"
                "client_mount_timeout = 1\n"
                "auth_supported = none\n"
                "log_to_file = true\n"
                f"log_file = {log}\n")


def serve(conf, env=None, cwd=None, image="rbd:pool/img"):
    """mloop-server on IMAGE of the cluster CONF names (None: none
    named, librados's search, or the one IMAGE's conf= names), in ENV
    and CWD: its exit status and stderr.  The log file is removed
    first."""
    if os.path.exists(log):
        os.unlink(log)
    args = [SERVER_BIN, "--listen", f"unix:{work}/sock"]
    if conf is not None:
        args.append(f"--ceph-conf={conf}")
    p = subprocess.run(args + [image], capture_output=True,
                       text=True, timeout=60, env=env, cwd=cwd)
    return p.returncode, p.stderr.strip()


def search_env(**extra):
    """The environment of a server left to librados's search: no
    $CEPH_CONF, no $CEPH_ARGS, $HOME an empty directory, plus EXTRA."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CEPH_CONF", "CEPH_ARGS", "CEPH_KEYRING")}
    env["HOME"] = home
    env.update(extra)
    return env


try:
    conf = os.path.join(work, "ceph.conf")
    log = os.path.join(work, "written-by-the-server")
    write_conf(conf, log)

    os.chmod(conf, 0o666)
    rc, err = serve(conf)
    check("a world-writable configuration is refused",
          rc != 0 and "refused" in err and conf in err, err)
    check("nothing is written where that configuration says",
          not os.path.exists(log), f"{log} was created")

    os.chmod(conf, 0o644)
    if os.geteuid() == 0:
        os.chown(conf, 65534, 65534)
        rc, err = serve(conf)
        check("another user's configuration is refused",
              rc != 0 and "refused" in err and conf in err, err)
        check("nothing is written where another user's says",
              not os.path.exists(log), f"{log} was created")
        os.chown(conf, 0, 0)
    else:
        print("# not root: another user's configuration not tried")

    rc, err = serve(conf)
    check("the server's own configuration is read",
          rc != 0 and "no monitor answered" in err, err)

    link = os.path.join(work, "link.conf")
    os.symlink(conf, link)
    rc, err = serve(link)
    check("a configuration behind a symbolic link is read",
          rc != 0 and "no monitor answered" in err, err)

    # librados's own search, no configuration named.
    home = os.path.join(work, "home")
    os.mkdir(home)
    os.chmod(conf, 0o666)
    rc, err = serve(None, env=search_env(CEPH_CONF=conf))
    check("a world-writable $CEPH_CONF is refused",
          rc != 0 and "refused" in err and conf in err, err)
    check("nothing is written where that $CEPH_CONF says",
          not os.path.exists(log), f"{log} was created")
    os.chmod(conf, 0o644)
    rc, err = serve(None, env=search_env(CEPH_CONF=conf))
    check("the server's own $CEPH_CONF is read",
          rc != 0 and "no monitor answered" in err, err)
    # $CEPH_CONF's places as librados reads them: one with $data_dir
    # dropped (a client has none), ${cluster} as $cluster.
    rc, err = serve(None, env=search_env(CEPH_CONF=f"$data_dir/config,{conf}"))
    check("a $CEPH_CONF place with $data_dir is passed over",
          rc != 0 and "no monitor answered" in err, err)
    rc, err = serve(None, env=search_env(CEPH_CONF=os.path.join(work, "${cluster}.conf")))
    check("${cluster} in $CEPH_CONF is $cluster",
          rc != 0 and "no monitor answered" in err, err)

    if os.path.exists("/etc/ceph/ceph.conf"):
        print("# /etc/ceph/ceph.conf exists: librados's search stops "
              "there, the working directory's and $HOME's not tried")
    else:
        cwd = os.path.join(work, "cwd")
        os.mkdir(cwd)
        os.chmod(cwd, 0o777)
        planted = os.path.join(cwd, "ceph.conf")
        write_conf(planted, log)
        os.chmod(planted, 0o666)
        rc, err = serve(None, env=search_env(), cwd=cwd)
        check("a world-writable ceph.conf in the working directory is "
              "refused", rc != 0 and "refused" in err, err)
        check("nothing is written where the working directory's says",
              not os.path.exists(log), f"{log} was created")
        os.unlink(planted)

        dot_ceph = os.path.join(home, ".ceph")
        os.mkdir(dot_ceph)
        write_conf(os.path.join(dot_ceph, "ceph.conf"), log)
        os.chmod(os.path.join(dot_ceph, "ceph.conf"), 0o666)
        rc, err = serve(None, env=search_env(), cwd=cwd)
        check("a world-writable $HOME/.ceph/ceph.conf is refused",
              rc != 0 and "refused" in err, err)
        check("nothing is written where $HOME's says",
              not os.path.exists(log), f"{log} was created")
        os.chmod(os.path.join(dot_ceph, "ceph.conf"), 0o644)
        rc, err = serve(None, env=search_env(), cwd=cwd)
        check("the server's own $HOME/.ceph/ceph.conf is read",
              rc != 0 and "no monitor answered" in err, err)

    # $cluster, as librados names the cluster of a file named: the
    # keyring it expands to is found (the server then waits for the
    # monitor), not the "ceph" cluster's.
    cluster_dir = os.path.join(work, "clusters")
    os.mkdir(cluster_dir)
    backup = os.path.join(cluster_dir, "backup.conf")
    with open(backup, "w") as f:
        f.write("[global]\n"
                "mon_host = 127.0.0.1:1\n"
                "client_mount_timeout = 1\n"
                "auth_client_required = cephx\n"
                f"keyring = {cluster_dir}/$cluster.keyring\n")
    os.chmod(backup, 0o644)
    # A cephx key as Ceph encodes one: type 1 (AES), created 0, 16 bytes.
    key = base64.b64encode(struct.pack("<HIIH", 1, 0, 0, 16) + os.urandom(16))
    with open(os.path.join(cluster_dir, "backup.keyring"), "w") as f:
        f.write(f"[client.admin]\n\tkey = {key.decode()}\n")
    rc, err = serve(backup)
    check("backup.conf's $cluster is backup, as librados names it",
          rc != 0 and "no monitor answered" in err, err)
    # librados takes the name from a file ending in ".conf" alone (its
    # stem: all before that last ".conf"), and calls any other file's
    # cluster "ceph".
    for named, cluster in (("prod.conf.orig", "ceph"),
                           ("x.conf.d.conf", "x.conf.d")):
        other = os.path.join(cluster_dir, named)
        shutil.copyfile(backup, other)
        os.chmod(other, 0o644)
        keyring = os.path.join(cluster_dir, f"{cluster}.keyring")
        shutil.copyfile(os.path.join(cluster_dir, "backup.keyring"), keyring)
        rc, err = serve(other)
        check(f"{named}'s $cluster is {cluster}, as librados names it",
              rc != 0 and "no monitor answered" in err, err)
        os.unlink(keyring)

    # The name a device records (conf=), as each of its servers is
    # started with it: the path is walked again at every start.
    if os.geteuid() == 0:
        sticky = os.path.join(work, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        roots = os.path.join(sticky, "c2")
        os.mkdir(roots)
        os.chmod(roots, 0o755)
        recorded = os.path.join(roots, "ceph.conf")
        write_conf(recorded, log)
        os.chmod(recorded, 0o644)
        image = f"rbd:pool/img:conf={recorded}"
        rc, err = serve(None, image=image)
        check("root's configuration in root's directory in a sticky one "
              "is read", rc != 0 and "no monitor answered" in err, err)
        # A /tmp cleaner removes root's directory; a user makes one of
        # that name, linking the name to another cluster's configuration.
        shutil.rmtree(roots)
        os.mkdir(roots)
        os.chown(roots, 65534, 65534)
        other = os.path.join(work, "other.conf")
        other_log = os.path.join(work, "written-for-the-other-cluster")
        write_conf(other, other_log)
        os.chmod(other, 0o644)
        os.symlink(other, recorded)
        os.lchown(recorded, 65534, 65534)
        rc, err = serve(None, image=image)
        check("the next start refuses the path through a user's directory",
              rc != 0 and "refused" in err and roots in err, err)
        check("nothing is written where the other cluster's says",
              not os.path.exists(other_log), f"{other_log} was created")
        # The same change of hands between the walk and the open: the
        # server looks at the file first, walks after, and reads only
        # what it looked at.
        shim = os.path.join(work, "swap_on_open.so")
        cc = shutil.which("cc")
        if cc and subprocess.run(
                [cc, "-shared", "-fPIC", "-o", shim,
                 os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "swap_on_open.c"), "-ldl"]).returncode == 0:
            users = roots + ".users"
            os.rename(roots, users)
            os.mkdir(roots)
            os.chmod(roots, 0o755)
            write_conf(recorded, log)
            os.chmod(recorded, 0o644)
            env = dict(os.environ, LD_PRELOAD=shim, MLOOP_TEST_SWAP_AT=recorded,
                       MLOOP_TEST_SWAP_ROOTS=roots, MLOOP_TEST_SWAP_USERS=users,
                       MLOOP_TEST_SWAP_ASIDE=roots + ".cleaned")
            rc, err = serve(None, image=image, env=env)
            check("a directory that changes hands as the server opens the "
                  "path is refused", rc != 0 and "refused" in err and
                  roots in err, err)
            check("nothing is written where the other cluster's says, the "
                  "path swapped at the open",
                  not os.path.exists(other_log), f"{other_log} was created")
        else:
            print("# no C compiler: the change of hands at the open not tried")
    else:
        print("# not root: a recorded path led elsewhere not tried")
finally:
    shutil.rmtree(work, ignore_errors=True)

if failed:
    sys.exit(f"{len(failed)} check(s) failed: {', '.join(failed)}")
