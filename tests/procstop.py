"""Stopping a process with SIGSTOP, and knowing it has stopped.

A stop signal sent to a process wakes one of its threads; the kernel
stops the others only once that thread runs (do_signal_stop).  On a
loaded machine it may wait for a CPU a while, and the other threads go
on meanwhile: a server, a Ceph daemon or a FUSE file system "stopped"
so can still answer a request sent right after the signal.  A test
that stops a process so that it answers nothing waits for all of its
threads (standard library only: the ceph suite's cluster uses it too).
"""
import os
import signal
import time


def running_threads(pid):
    """PID's threads that are not stopped, as NAME(STATE); [] once the
    process has stopped or is gone."""
    task = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task)
    except OSError:
        return []
    running = []
    for tid in tids:
        try:
            with open(f"{task}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # a thread that ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat[stat.rindex(")") + 2]
        if state not in "tT":
            running.append(f"{name}({state})")
    return running


def has_exited(pid):
    """Whether PID has exited: gone from /proc, or a zombie its parent
    has not reaped yet.  /proc/PID may vanish between any two looks at
    it, so one open answers, and its failure means "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def wait_stopped(pids, timeout=10):
    """Returns once every thread of every process in PIDS has stopped;
    RuntimeError naming those still running after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        running = {pid: r for pid in pids if (r := running_threads(pid))}
        if not running:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"SIGSTOP left threads running after {timeout} s: {running}")
        time.sleep(0.01)


def sigstop(pid, timeout=10):
    """SIGSTOP to PID, returning once all of its threads have stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped([pid], timeout)
