"""PowerShell scripts parse with a real PowerShell grammar (tree-sitter-powershell) with no error nodes, and
the values in the AST, read with PowerShell's own string rules, are the intended arguments and env."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.integration.recipes.conftest import Stubs, g4build, make_wheel
from tests.unit.recipes.recipe_shell_semantics import ps_legacy_command_line, ps_verbatim, windows_split

from g4build.recipes import load_recipe, render, script_filename, write_script

tree_sitter = pytest.importorskip("tree_sitter")
tsp = pytest.importorskip("tree_sitter_powershell")
PARSER = tree_sitter.Parser(tree_sitter.Language(tsp.language()))


def walk(node: Any) -> Any:
    yield node
    for child in node.children:
        yield from walk(child)


def _inside_if(node: Any) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type == "if_statement":
            return True
        parent = parent.parent
    return False


class PsScript:
    def __init__(self, data: bytes) -> None:
        assert data.startswith(b"\xef\xbb\xbf"), "PowerShell scripts carry a UTF-8 byte order mark"
        self.tree = PARSER.parse(data[3:])
        self.root = self.tree.root_node

    def errors(self) -> list[str]:
        return [n.text.decode() for n in walk(self.root) if n.type == "ERROR" or n.is_missing]

    def _value(self, node: Any) -> str:
        text = node.text.decode()
        value, end = ps_verbatim(text)
        assert end == len(text), f"PowerShell would end this string early: {text!r}"
        return value

    def assignments(self) -> dict[str, Any]:
        found = {}
        for node in walk(self.root):
            if node.type == "assignment_expression":
                left = node.children[0]
                found[left.text.decode()] = node.children[-1]
        return found

    def array(self, variable: str) -> list[str]:
        right = self.assignments()[variable]
        arrays = [n for n in walk(right) if n.type == "array_expression"]
        assert arrays, f"{variable} is not an @() array"
        return [self._value(n) for n in walk(arrays[0]) if n.type == "string_literal"]

    def env(self, *, conditional: bool = False) -> dict[str, str]:
        """``$env:`` assignments the script makes unconditionally (or, with ``conditional``, only inside an if)."""
        out = {}
        for node in walk(self.root):
            if node.type != "assignment_expression":
                continue
            name = node.children[0].text.decode()
            if name.lower().startswith("$env:") and _inside_if(node) == conditional:
                [literal] = [n for n in walk(node.children[-1]) if n.type == "string_literal"]
                out[name[5:]] = self._value(literal)
        return out

    def commands(self) -> list[str]:
        return [n.text.decode() for n in walk(self.root) if n.type == "command"]


def render_ps(tmp_path: Path, name: str, *extra: str) -> PsScript:
    out = tmp_path / "ps"
    result = g4build("recipe", "render", name, "--shell", "powershell", "--out", str(out), *extra)
    assert result.returncode == 0, result.stderr
    return PsScript((out / f"{name}.ps1").read_bytes())


def test_dflash_script_parses_and_passes_the_exact_command(tmp_path: Path) -> None:
    ps = render_ps(tmp_path, "gemma4-26b-a4b-nvfp4-dflash")
    assert not ps.root.has_error and ps.errors() == []
    expected = [
        "serve", "./models/gemma-4-26B-A4B-it-NVFP4", "--served-model-name", "gemma-4-26b-a4b",
        "--max-model-len", "65536", "--max-num-seqs", "22", "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.8", "--enable-chunked-prefill", "--enable-prefix-caching",
        "--trust-remote-code", "--enable-auto-tool-choice", "--tool-call-parser", "gemma4",
        "--mm-processor-cache-gb", "0",
        "--speculative-config",
        '{"method":"dflash","model":"./models/gemma-4-26B-A4B-it-DFlash","num_speculative_tokens":15,'
        '"attention_backend":"flash_attn"}',
    ]
    assert ps.array("$vllmArgs") == expected
    assert windows_split(ps_legacy_command_line(ps.array("$vllmArgsLegacy"))) == expected
    assert ps.env()["VLLM_NVFP4_GEMM_BACKEND"] == "flashinfer-cutlass"
    assert ps.env()["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "& vllm @argv" in ps.commands()
    assert "& nvidia-smi -L" in ps.commands()
    assert any(c.startswith("& nvidia-smi '--query-gpu=compute_cap' '--format=csv,noheader'") for c in ps.commands())
    assert "-contains '12.0'" in ps.root.text.decode()
    assert ps.assignments()["$PSNativeCommandArgumentPassing"].text.decode() == "'Standard'"
    assert ps.assignments()["$ErrorActionPreference"].text.decode() == "'Stop'"


@pytest.mark.parametrize("name", ["gemma4-26b-a4b-nvfp4-mtp", "gemma4-31b-dflash", "gemma4-26b-a4b-nvfp4-baseline"])
def test_every_recipe_parses_and_both_arrays_agree(tmp_path: Path, name: str) -> None:
    ps = render_ps(tmp_path, name)
    assert not ps.root.has_error and ps.errors() == []
    standard = ps.array("$vllmArgs")
    assert standard[0] == "serve"
    assert windows_split(ps_legacy_command_line(ps.array("$vllmArgsLegacy"))) == standard


@pytest.mark.parametrize(("name", "context"), [("gemma4-26b-a4b-nvfp4-dflash", "24576"),
                                               ("gemma4-26b-a4b-nvfp4-mtp", "32768")])
def test_a_card_rows_script_parses_and_passes_the_rows_settings(tmp_path: Path, name: str, context: str) -> None:
    """`--set hardware.vram_gb=24` renders the recipe's 24 GB row: the arrays carry its settings, and the row's note
    (an apostrophe, parentheses, semicolons) sits in the header's comments without breaking the grammar."""
    ps = render_ps(tmp_path, name, "--set", "hardware.vram_gb=24")
    assert not ps.root.has_error and ps.errors() == []
    argv = ps.array("$vllmArgs")
    for option, value in (("--max-model-len", context), ("--max-num-batched-tokens", "2496"),
                          ("--gpu-memory-utilization", "0.9")):
        assert argv[argv.index(option) + 1] == value
    assert windows_split(ps_legacy_command_line(ps.array("$vllmArgsLegacy"))) == argv
    assert "settings for a 24 GB card" in ps.root.text.decode()


HOSTILE = [
    "two words", "it's", 'say "hi"', "$env:PATH $(Remove-Item x) `n @(1)", "a; Remove-Item -Recurse C:\\; b",
    "line1\nline2\r\nline3", "ünïcödé ✓ 日本語", "x\u2019; Write-Host pwned; \u2019y \u2018a\u2018 \u201ab\u201b",
    "C:\\My Models\\x\\",
    "", "-dash", '{"a": "b c", "d": [1, "x\\"y"]}', "%PATH% ^& !x!",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_read_back_identically_to_what_bash_delivers(tmp_path: Path, stubs: Stubs, value: str) -> None:
    text = json.dumps(value, ensure_ascii=False)
    sets = ["--set", f"args.tool-call-parser={text}", "--set", f"env.G4_HOSTILE={text}",
            "--set", f"speculative.model={text}"]
    items = sets[1::2]
    recipe = load_recipe("gemma4-26b-a4b-nvfp4-dflash", items)
    ps_file = tmp_path / script_filename(recipe.name, "powershell")
    ps_path = write_script(render(recipe, "powershell", sets=items), ps_file, "powershell")
    ps = PsScript(ps_path.read_bytes())
    assert not ps.root.has_error and ps.errors() == []
    sh_path = write_script(render(recipe, "bash", sets=items), tmp_path / script_filename(recipe.name, "bash"), "bash")
    assert stubs.run(sh_path).returncode == 0
    [vllm] = [c for c in stubs.calls() if c["prog"] == "vllm"]
    assert ps.array("$vllmArgs") == vllm["argv"]
    assert windows_split(ps_legacy_command_line(ps.array("$vllmArgsLegacy"))) == vllm["argv"]
    assert ps.env()["G4_HOSTILE"] == vllm["env"]["G4_HOSTILE"] == value


def test_wheel_install_uses_the_script_folder(tmp_path: Path) -> None:
    out = tmp_path / "ps"
    wheel = make_wheel(out / "vllm-0.21.0+cu130.g4.abc-cp38-abi3-win_amd64.whl")
    result = g4build("recipe", "render", "gemma4-26b-a4b-nvfp4-baseline", "--shell", "powershell", "--out", str(out),
                     "--wheel", str(wheel))
    assert result.returncode == 0, result.stderr
    ps = PsScript((out / "gemma4-26b-a4b-nvfp4-baseline.ps1").read_bytes())
    assert not ps.root.has_error
    wheel_value = ps.assignments()["$wheel"].text.decode()
    assert wheel_value == f"Join-Path -Path $PSScriptRoot -ChildPath '{wheel.name}'"
    assert "& $python -m pip install $wheel" in ps.commands()
    # it installs into the active venv's own python only, and stops first where there is none (as build.ps1 does)
    commands = ps.commands()
    assert not any(c.startswith(("& python", "python")) for c in commands)  # never whatever PATH finds first
    text = (out / "gemma4-26b-a4b-nvfp4-baseline.ps1").read_text(encoding="utf-8-sig")
    guard = text.index("if (-not $python) {")
    assert text.index("if ($env:VIRTUAL_ENV) {") < guard < text.index("& $python -m pip install $wheel")
    assert "no virtual environment is active" in text[guard:text.index("& $python -m pip")]
    assert "exit 1" in text[guard:text.index("& $python -m pip")]


def test_the_pins_environment_is_checked_before_serving(tmp_path: Path) -> None:
    from g4build.pins.model import load_pins
    from g4build.pins.serving import check_program

    ps = render_ps(tmp_path, "gemma4-26b-a4b-nvfp4-baseline")
    assert not ps.root.has_error and ps.errors() == []
    [check] = [n for n in walk(ps.root) if n.type == "command" and n.text.decode().startswith("& $python -c ")
               and "importlib.metadata as m" in n.text.decode()]
    [program] = [n for n in walk(check) if n.type == "string_literal"]
    assert ps._value(program) == check_program(load_pins().get("vllm-0.21.0"))  # exactly, under PS quoting
    text = ps.root.text.decode()
    # exit 3 (a mismatch) or any other failure of the check itself (fail closed, saying so) stops the launch
    # unless G4BUILD_ALLOW_ENVIRONMENT is '1' (then a note and on to vllm)
    stop = text.index("if ($LASTEXITCODE -ne 0) {", text.index("importlib.metadata as m"))
    assert text.index("if ($LASTEXITCODE -ne 3) {", stop) < text.index("did not run to its end", stop) \
        < text.index("if ($env:G4BUILD_ALLOW_ENVIRONMENT -ne '1') {", stop) < text.index("exit 1", stop) \
        < text.index("G4BUILD_ALLOW_ENVIRONMENT=1: serving outside", stop)
    commands = ps.commands()
    assert commands.index(check.text.decode()) < commands.index("& vllm @argv")
