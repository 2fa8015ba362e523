"""Calls that must not block: a reader handed a FIFO that opens or reads it would wait forever for a writer.

``within`` runs the call in a thread and fails the test by itself (naming what hung) when it has not returned in
time, so a regression fails fast with the test's name rather than hanging the run. Before failing it opens the
named FIFOs at both ends and closes them again: that ends a blocked open, read (EOF) or write (a broken pipe), so
the thread ends too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

SECONDS = 20.0  # a bounded reader answers in milliseconds; a slow shared machine still answers in seconds


def _release(fifos: Iterable[Path]) -> None:
    for fifo in fifos:
        # the write end frees a reader waiting in open (ENXIO when none waits); the read end frees a writer
        for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
            try:
                fd = os.open(fifo, flags)
            except OSError:
                continue
            os.close(fd)


def within(call: Callable[[], T], *, fifos: Iterable[Path] = (), seconds: float = SECONDS) -> T:
    """``call()``'s result (or its exception, raised here); the test fails if it has not returned in ``seconds``."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the test's thread as it was raised
            box["error"] = exc

    thread = threading.Thread(target=run, name="bounded-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        held = list(fifos)
        _release(held)
        thread.join(5)
        pytest.fail(f"the call blocked for more than {seconds:g} s (a FIFO opened or read without a bound: "
                    f"{', '.join(map(str, held)) or 'no FIFO named'})", pytrace=False)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
