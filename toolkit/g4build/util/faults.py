"""Fault injection for tests of interrupted runs: ``G4BUILD_FAULT=POINT[:SIGNAL]`` makes the process send
itself SIGNAL (default SIGKILL) when it reaches POINT, the way a kill, a crash or Ctrl-C (SIGINT) would land
there. Unset, it costs one dictionary lookup."""

from __future__ import annotations

import os
import signal


def fault(point: str) -> None:
    spec = os.environ.get("G4BUILD_FAULT")
    if not spec:
        return
    where, _, name = spec.partition(":")
    if where == point:
        os.kill(os.getpid(), getattr(signal, name or "SIGKILL", signal.SIGTERM))
