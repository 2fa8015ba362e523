"""The root group imports a command's module only when that command is asked for (cli/lazygroup.py): its list of
commands is the one the modules register, and a command's start imports nothing another command needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from g4build.cli import app
from g4build.cli.lazygroup import COMMANDS, module_commands

HELPERS = ("__init__", "_common", "lazygroup", "outpaths", "progress")  # modules of the CLI that add no command
CLI_MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "toolkit/g4build/cli").glob("*.py")
                     if p.stem not in HELPERS)


def test_the_list_names_every_command_each_module_registers_and_no_other() -> None:
    registered = {name: module for module in CLI_MODULES for name in module_commands(module)}
    assert registered == COMMANDS
    assert set(CLI_MODULES) == set(COMMANDS.values())


def test_the_root_group_builds_every_command_of_the_list() -> None:
    root = typer.main.get_command(app)
    assert list(root.commands) == list(COMMANDS)  # type: ignore[attr-defined]
    assert all(cmd.name == name for name, cmd in root.commands.items())  # type: ignore[attr-defined]
    assert root.commands["pins"].commands  # type: ignore[attr-defined]  # a group, with its subcommands


def _modules_after(*argv: str) -> set[str]:
    """The modules a fresh interpreter holds after running `g4build ARGV` (through main(), as the console
    script does)."""
    code = ("import sys, json\nfrom g4build.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env={**os.environ, "G4BUILD_PLAIN": "1"}, timeout=120)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def test_a_command_imports_its_own_module_and_not_the_others() -> None:
    loaded = _modules_after("overlay", "--help")
    assert "g4build.cli.overlay" in loaded
    others = {f"g4build.cli.{m}" for m in CLI_MODULES} - {"g4build.cli.overlay"}
    assert loaded & others == set()
    # nor what only other commands, a download, a merge or validating the new wheel need
    assert loaded & {"git", "requests", "g4build.ci", "g4build.builder.request", "g4build.source.fetch",
                     "g4build.validate.wheel"} == set()


def test_help_lists_every_command() -> None:
    loaded = _modules_after("--help")
    assert {f"g4build.cli.{m}" for m in CLI_MODULES} <= loaded
