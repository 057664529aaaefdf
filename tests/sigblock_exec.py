#!/usr/bin/python3
"""Runs a program with signals blocked, as a process started by one
that blocks them inherits them blocked across its exec.

  sigblock_exec.py SIGNAL[,SIGNAL...] PROGRAM [ARG...]
"""
import os
import signal
import sys

signal.pthread_sigmask(signal.SIG_BLOCK,
                       [getattr(signal, name) for name in sys.argv[1].split(",")])
os.execv(sys.argv[2], sys.argv[2:])
