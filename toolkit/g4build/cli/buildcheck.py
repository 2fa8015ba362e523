"""`g4build build-check`: the checks a build runs on its own interpreter, as steps of `g4build wheel`.

A plan's step used to be ``python -c '<a 500-character program>'``: correct, but unreadable in a plan and in the
emitted script. The step now reads ``g4build build-check torch --python-exe python --torch 2.11.0 --cuda 13.0``;
this command runs the same program (``builder.checkprogs.python_check`` / ``torch_check``) in that interpreter, where
it prints what it found and what to install, and exits non-zero for a mismatch.
"""

from __future__ import annotations

import subprocess

import typer

from g4build.builder.checkprogs import python_check, torch_check
from g4build.errors import BuildError

build_check_app = typer.Typer(
    name="build-check", no_args_is_help=True,
    help="A build's checks of its interpreter (steps of `g4build wheel`): its Python, its torch.")
EXE_OPTION = typer.Option(..., "--python-exe", help="The interpreter to check (repeat for its arguments).")


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, check=False)  # the program's message goes to stderr as it is
    except OSError as exc:
        raise BuildError(f"the build's interpreter {argv[0]} could not be started: {exc.strerror or exc}",
                         hint="activate the build's venv, or pass --python-exe PATH") from exc
    if done.returncode != 0:
        raise BuildError(f"{what}: the check in {argv[0]} failed (exit {done.returncode}; its message is above)")


@build_check_app.command("python")
def python_cmd(python_exe: list[str] = EXE_OPTION,
               version: str = typer.Option(..., "--version", help="The Python X.Y the build is for."),
               venv: bool = typer.Option(False, "--venv", help="It must be a virtual environment's.")) -> None:
    """Exit non-zero unless the interpreter is Python X.Y (and, with --venv, a virtual environment's)."""
    _run([*python_exe, "-c", python_check(version, need_venv=venv)], f"the build's Python {version}")


@build_check_app.command("torch")
def torch_cmd(python_exe: list[str] = EXE_OPTION,
              torch: str = typer.Option(..., "--torch", help="The pin's torch version."),
              cuda: str = typer.Option(..., "--cuda", help="The CUDA X.Y it must be built for.")) -> None:
    """Exit non-zero unless the interpreter has torch VERSION built for CUDA X.Y."""
    _run([*python_exe, "-c", torch_check(torch, cuda)], f"torch {torch} for CUDA {cuda}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.add_typer(build_check_app, name="build-check")
