"""Download progress on stderr: a bar on a terminal, a line per tenth when piped or logged.

A rich bar on a console that is not a terminal draws nothing and leaves a blank line behind, so a piped
`g4build overlay` stayed silent through a minute-long download and began its output with an empty line. Here
progress never touches stdout (which stays the command's result), and off a terminal it is plain lines:
one per 10 % when the size is known, one per ``STEP_UNKNOWN`` bytes when it is not, and one when it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from g4build.cli._common import err_console

Hook = Callable[[int, "int | None"], None]  # (bytes so far, total or None), as pins.index.ProgressHook
STEP_UNKNOWN = 32 * 2**20  # a line per 32 MiB when the server gives no length
MIB = 2**20


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB" if n >= MIB else f"{n} bytes"


class LineProgress:
    """The plain-lines hook: call it with (done, total); ``finish()`` says the download is complete."""

    def __init__(self, name: str, stream: IO[str]) -> None:
        self.name, self.stream = name, stream
        self.shown = -1  # the last tenth (or STEP_UNKNOWN step) written
        self.done = 0

    def __call__(self, done: int, total: int | None) -> None:
        self.done = done
        step = done * 10 // total if total else done // STEP_UNKNOWN
        if step > self.shown and (not total or done < total):
            self.shown = step
            size = f" of {_mib(total)} ({step * 10}%)" if total else ""
            self._write(f"downloading {self.name}: {_mib(done)}{size}")

    def finish(self) -> None:
        if self.done:
            self._write(f"downloaded {self.name}: {_mib(self.done)}")

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


@contextmanager
def download_progress(name: str, *, quiet: bool) -> Iterator[Hook]:
    """A progress hook for downloading ``name``: none with ``quiet`` (--json), a transient bar when stderr is a
    terminal, else ``LineProgress`` lines on stderr."""
    if quiet:
        yield lambda _done, _total: None
        return
    if err_console.is_terminal:
        columns = ("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=err_console, transient=True) as progress:
            task = progress.add_task(name, total=None)
            yield lambda done, total: progress.update(task, completed=done, total=total)
        return
    lines = LineProgress(name, err_console.file)
    yield lines
    lines.finish()
