"""The ``g4build`` command line: a thin typer layer over the pipeline stages.

Each command group lives in its own module exposing ``register(app)``, imported only when one of its commands
runs (``lazygroup``); this file only assembles them and turns ``G4BuildError`` into a message and its exit code.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import sys
from pathlib import Path

import typer
from rich.markup import escape

from g4build import __version__
from g4build.cli._common import err_console, json_already_printed, reset_json_printed, set_plain
from g4build.cli.lazygroup import LazyGroup
from g4build.data import set_root_option
from g4build.errors import G4BuildError

app = typer.Typer(
    name="g4build",
    help="Build, patch and validate vLLM wheels for Gemma 4 + DFlash on SM120 (Windows, WSL, Linux).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=LazyGroup,  # each command group's module imported when one of its commands runs (lazygroup.COMMANDS)
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"g4build {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Plain, untruncated output even on a terminal (as when piped; G4BUILD_PLAIN=1 too).",
    ),
    root: Path | None = typer.Option(
        None, "--project", "--root", file_okay=False, exists=True,
        help="The g4build project (patches/, recipes/, ci/) to read and write (G4BUILD_HOME also sets it); "
        "default: the one the working directory is in, like git finds its repository, when it and the folders "
        "up to it are yours alone (owned by you, writable by no one else), else the installed package's data.",
    ),
) -> None:
    """g4build: pin → source → patches → build → validate → emit."""
    set_root_option(root.resolve() if root is not None else None)
    set_plain(plain)


def _click_exception_types() -> tuple[type[BaseException], ...]:
    """click's exception base classes as the installed typer raises them.

    typer >= 0.20 carries its own copy of click (``typer._click``) and installs no ``click``; older typer uses
    the ``click`` package. Usage errors are instances of whichever copy typer parses with, so look up both.
    """
    found: list[type[BaseException]] = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found.append(module.ClickException)
    return tuple(found)


def _json_error(argv: list[str] | None, message: str, hint: str | None, code: int) -> None:
    """Under --json an error is also a JSON object on stdout, so scripts parsing stdout see what failed."""
    args = sys.argv[1:] if argv is None else argv
    if "--json" in args and not json_already_printed():
        try:
            print(json.dumps({"error": message, "hint": hint, "exit_code": code}))
            sys.stdout.flush()
        except OSError:  # stdout itself cannot be written (a full disk): the message on stderr stands
            pass


# A write that failed for want of room (a full disk, a quota, /dev/full) or at the device: an error to report as
# such, not a defect of g4build's
_WRITE_FAILED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _write_failed(exc: OSError) -> None:
    """Report a failed write (stdout or a file) as what it is, exit 2 (the output named cannot be written)."""
    where = f" ({exc.filename})" if exc.filename else " (the output: stdout, or a file being written)"
    message = f"a write failed: {exc.strerror or exc}{where}"
    hint = "free space on that disk, or send the output elsewhere"
    try:  # nothing more goes to a stdout that cannot be written, at exit either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    err_console.print(f"[yellow]hint:[/] {escape(hint)}", highlight=False)
    sys.exit(2)


def _quiet_broken_pipe() -> None:
    """The reader of stdout closed it (``g4build pins list | head -1``): it has what it wanted, so exit 0 without a
    traceback. stdout is pointed at the null device first, or the interpreter's own flush at exit would fail
    again and print "Exception ignored ... BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an embedding host): nothing to redirect
        pass
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    finally:
        # nor does it outlast this command: a caller in the same process (a test, a host embedding g4build) reads
        # its own project afterwards, not this command's --project
        set_root_option(None)
        set_plain(False)


def _main(argv: list[str] | None) -> None:
    click_errors = _click_exception_types()
    reset_json_printed()
    set_root_option(None)  # a --root (or --plain) of an earlier command in this process must not carry over
    set_plain(False)
    try:
        # With standalone_mode=False click hands back typer.Exit's code instead of raising it.
        result = app(args=argv, standalone_mode=False)
        if result == 130:  # typer turns Ctrl-C into a silent Exit(130), which click hands back as 130
            err_console.print("aborted")
        sys.stdout.flush()  # a reader that went away (`| head -1`) shows here, inside the handlers below
        if isinstance(result, int) and result:
            sys.exit(result)
    except BrokenPipeError:
        _quiet_broken_pipe()
    except SystemExit:
        # click (and typer's copy) answer a broken pipe themselves: sys.stdout wrapped in a PacifyFlushWrapper, exit 1
        if type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
            _quiet_broken_pipe()
        raise
    except G4BuildError as exc:
        # messages quote user values (paths, names with brackets): never read them as rich markup
        err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
        if exc.hint:
            err_console.print(f"[yellow]hint:[/] {escape(exc.hint)}", highlight=False)
        _json_error(argv, exc.message, exc.hint, exc.exit_code)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        sys.exit(130)
    except click_errors as exc:  # usage errors: click's own message and usage line, exit 2
        exc.show()  # type: ignore[attr-defined]
        _json_error(argv, exc.format_message(), "see --help", exc.exit_code)  # type: ignore[attr-defined]
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except Exception as exc:
        if os.environ.get("G4BUILD_DEBUG"):
            raise
        if isinstance(exc, OSError) and exc.errno in _WRITE_FAILED:
            _write_failed(exc)
        where = ""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f" (at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})"
        err_console.print(
            f"[bold red]error:[/] unexpected {type(exc).__name__}: {escape(str(exc))}{escape(where)}", highlight=False
        )
        err_console.print(
            "[yellow]hint:[/] rerun with G4BUILD_DEBUG=1 for the traceback, and report it", highlight=False
        )
        _json_error(argv, f"unexpected {type(exc).__name__}: {exc}{where}", "rerun with G4BUILD_DEBUG=1", 1)
        sys.exit(1)
