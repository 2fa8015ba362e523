"""One quoting module for every script: each quote-like code point and other hostile text goes through BOTH
renderers (the build scripts of ``builder/script.py`` and the launch scripts of ``recipes/render_*``), in both
shells, and comes out as the exact value.

- PowerShell: the real grammar (tree-sitter-powershell) parses the script without errors, and the literal in
  the value's place, read by PowerShell's own rule for verbatim strings (five single-quote characters, a doubled
  one stands for itself: ``ps_verbatim``), is one string ending where the grammar's token ends, with the value.
  The grammar alone would miss the bug: it only knows ASCII ``'``, so ``'it\u2019s'`` is one token to it while
  PowerShell ends the string at U+2019.
- bash: the whole rendered script runs in real bash; the program it starts writes its arguments and the
  environment values it received (``printf '%s\\0'``), compared byte for byte.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.unit.recipes.recipe_shell_semantics import ps_verbatim

from g4build.builder.arch import parse_arch
from g4build.builder.plan import BuildPlan, Layout, Options, Step, Target
from g4build.builder.planner import default_layout, make_plan
from g4build.builder.script import render_bash as build_bash
from g4build.builder.script import render_powershell as build_powershell
from g4build.errors import UsageError
from g4build.pins.model import load_pins
from g4build.recipes import render_plan
from g4build.recipes.script import LaunchPlan
from g4build.util.shellquote import PS_SINGLE_QUOTES, bash_quote, bash_word, ps_quote, windows_word

tree_sitter = pytest.importorskip("tree_sitter")
tsp = pytest.importorskip("tree_sitter_powershell")
PARSER = tree_sitter.Parser(tree_sitter.Language(tsp.language()))


def _quote_like() -> list[str]:
    """Every punctuation, symbol or modifier letter Unicode names a quotation mark, apostrophe, prime, grave or
    acute accent (ASCII ' " ` among them), plus the saltillo letters."""
    words = ("QUOTATION", "APOSTROPHE", "PRIME", "GRAVE", "ACUTE", "TURNED COMMA", "REVERSED COMMA")
    found = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF
             and unicodedata.category(chr(c)) in ("Pi", "Pf", "Po", "Ps", "Pe", "Sk", "So", "Lm")
             and any(w in unicodedata.name(chr(c), "") for w in words)]
    return [*found, "\ua78b", "\ua78c"]


QUOTE_LIKE = _quote_like()
HOSTILE = [
    "",
    "plain",
    "two words",
    " leading and trailing ",
    "$HOME ${PATH} $(touch PWNED) `touch PWNED` $env:PATH @(1) $args",
    "a; touch PWNED && b | c > d < e & f",
    "#not a comment <# nor a block #>",
    "--% stop-parsing token",
    "@'\nnot a here-string\n'@",
    "line1\nline2\r\nline3\rline4",
    "\n",
    "tab\there\vvt\fff",
    "\x1b[31mescape\x7f\x85nel\u2028ls\u2029ps",
    "\u00a0nbsp \ufeffbom \u200bzwsp",
    "\u00fcn\u00efc\u00f6d\u00e9 \u2713 \u65e5\u672c\u8a9e \U0001f600",
    "\\",
    "C:\\path with space\\",
    'trailing\\"',
    "%PATH% !x! ^& (a) {b} [c]",
    '{"method":"dflash","model":"C:\\\\m d\\\\x","num_speculative_tokens":15}',
    "-flag",
    "~",
    "x\u2019; Remove-Item C:\\ ; \u2019",  # ends the string early if only ' is doubled
    "".join(QUOTE_LIKE),
    "".join(q + q for q in QUOTE_LIKE),
]
VALUES = [*QUOTE_LIKE, *(f"a{q}; touch PWNED; {q}{q}'{q}b" for q in QUOTE_LIKE), *HOSTILE]


def _id(value: str) -> str:
    return ascii(value)[1:-1][:40] or "empty"


# --- PowerShell: the grammar's tokens, read by PowerShell's rule -------------------------------------------

def _walk(node: Any) -> Iterator[Any]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _parse(text: str) -> Any:
    tree = PARSER.parse(text.encode("utf-8"))
    errors = [n.text.decode() for n in _walk(tree.root_node) if n.type == "ERROR" or n.is_missing]
    assert not tree.root_node.has_error and not errors, errors[:3]
    return tree


def _literal(node: Any) -> str:
    """The value of ``node``, which must be one single-quoted literal and nothing else, read as PowerShell."""
    literals = [n for n in _walk(node) if n.type == "string_literal"]
    assert len(literals) == 1 and literals[0].text == node.text, f"not one literal: {node.text!r}"
    text = literals[0].text.decode()
    assert text[0] == "'", text
    value, end = ps_verbatim(text)
    assert end == len(text), f"PowerShell ends this string after {end} of {len(text)} characters: {text!r}"
    return value


def _every_literal_is_one_string(tree: Any) -> None:
    for node in _walk(tree.root_node):
        if node.type == "string_literal" and node.text.startswith(b"'"):
            _literal(node)


def _assigned(tree: Any, variable: str) -> list[Any]:
    return [n.children[-1] for n in _walk(tree.root_node)
            if n.type == "assignment_expression" and n.children[0].text.decode().lower() == variable.lower()]


def _invoked(tree: Any) -> list[list[Any]]:
    """``& 'program' 'arg' ...`` commands (a literal program, not ``& $Body``): [program node, argument nodes]."""
    out = []
    for node in _walk(tree.root_node):
        if node.type != "command" or node.children[0].type != "command_invokation_operator":
            continue
        name = next(c for c in node.children if c.type == "command_name_expr")
        if name.text.startswith(b"$"):
            continue
        elems = next((c for c in node.children if c.type == "command_elements"), None)
        args = [c for c in (elems.children if elems is not None else []) if c.type != "command_argument_sep"]
        out.append([name, *args])
    return out


def _array(tree: Any, variable: str) -> list[str]:
    [right] = _assigned(tree, variable)
    [array] = [n for n in _walk(right) if n.type == "array_expression"]
    [body] = [c for c in array.children if c.type == "statement_list"]
    return [_literal(c) for c in body.children if c.is_named]


# --- the two renderers -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pin21() -> Any:
    return load_pins().get("vllm-0.21.0")


def _target(os_name: str) -> Target:
    return Target(os=os_name, arch=parse_arch("sm120"), python="3.12", cuda="13.0")


def build_plan(pin: Any, os_name: str, value: str, *, program: str, root: str) -> BuildPlan:
    """A real plan for ``os_name`` whose only step runs ``program value -- end`` with ``value`` in the plan's
    environment and the step's."""
    t = _target(os_name)
    lay = (Layout(root=root, out=f"{root}/wheels", cache=f"{root}/deps") if os_name == "linux"
           else default_layout(pin, t, base=""))
    plan = make_plan(pin, [], t, layout=lay, opts=Options(jobs=2))
    step = Step(name="probe", command=(program, value, "--", "end"), cwd=lay.join("cwd"), resumable=False,
                env={"G4BUILD_STEP_VALUE": value})
    return dataclasses.replace(plan, env={**plan.env, "G4BUILD_VALUE": value}, setup=(), steps=(step,))


def launch_plan(value: str) -> LaunchPlan:
    return LaunchPlan(recipe="probe", description="", notes="", overrides=(), env=(("G4BUILD_VALUE", value),),
                      argv=("serve", value, "--", "end"), wheel=None, arch="sm120", compute_capability="12.0")


# --- the checks --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_build_powershell_script_carries_the_value(pin21: Any, value: str) -> None:
    tree = _parse(build_powershell(build_plan(pin21, "windows", value, program="C:\\t\\print.exe", root="")))
    _every_literal_is_one_string(tree)
    assert [_literal(n) for n in _assigned(tree, "$env:G4BUILD_VALUE")] == [value]
    assert [_literal(n) for n in _assigned(tree, "$env:G4BUILD_STEP_VALUE")] == [value]
    [command] = _invoked(tree)
    assert [_literal(n) for n in command] == ["C:\\t\\print.exe", value, "--", "end"]


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_launch_powershell_script_carries_the_value(value: str) -> None:
    tree = _parse(render_plan(launch_plan(value), "powershell"))
    _every_literal_is_one_string(tree)
    assert [_literal(n) for n in _assigned(tree, "$env:G4BUILD_VALUE")] == [value]
    assert _array(tree, "$vllmArgs") == ["serve", value, "--", "end"]
    assert _array(tree, "$vllmArgsLegacy") == ["serve", windows_word(value), "--", "end"]


PRINT = """#!/bin/bash
{{ printf '%s\\0' "$@"; printf '%s\\0' "${{G4BUILD_VALUE-unset}}" "${{G4BUILD_STEP_VALUE-unset}}"; }} > {out}
"""


def _program(folder: Path, name: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "received"
    program = folder / name
    program.write_text(PRINT.format(out=bash_quote(str(out))))
    program.chmod(0o755)
    return program, out


def _nul_joined(*values: str) -> bytes:
    return b"".join(v.encode("utf-8") + b"\0" for v in values)


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_build_bash_script_carries_the_value(tmp_path: Path, pin21: Any, value: str) -> None:
    program, out = _program(tmp_path / "bin", "print")
    script = tmp_path / "build.sh"
    script.write_bytes(build_bash(build_plan(pin21, "linux", value, program=str(program),
                                             root=str(tmp_path / "b"))).encode("utf-8"))
    result = subprocess.run(["bash", str(script)], capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert out.read_bytes() == _nul_joined(value, "--", "end", value, value)


@pytest.mark.parametrize("value", VALUES, ids=_id)
def test_launch_bash_script_carries_the_value(tmp_path: Path, value: str) -> None:
    program, out = _program(tmp_path / "bin", "vllm")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text('#!/bin/bash\nif [ "$1" = -L ]; then echo "GPU 0: test"; else echo 12.0; fi\n')
    smi.chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_bytes(render_plan(launch_plan(value), "bash").encode("utf-8"))
    result = subprocess.run(["bash", str(script)], capture_output=True, check=False,
                            env={"PATH": f"{program.parent}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert out.read_bytes() == _nul_joined("serve", value, "--", "end", value, "unset")


# --- the rules themselves ----------------------------------------------------------------------------------

def test_powershell_single_quotes_are_the_five_of_the_language() -> None:
    assert [f"U+{ord(c):04X}" for c in PS_SINGLE_QUOTES] == ["U+0027", "U+2018", "U+2019", "U+201A", "U+201B"]
    assert all(ps_quote(q) == "'" + q + q + "'" for q in PS_SINGLE_QUOTES)
    assert ps_quote("\u201c\u201d\u201e\u201f`$") == "'\u201c\u201d\u201e\u201f`$'"  # double quotes: as they are


def test_bash_word_is_bare_only_when_bash_sees_nothing_special() -> None:
    assert bash_word("/home/u/g4b/v21") == "/home/u/g4b/v21"
    assert bash_word("") == "''"
    assert bash_quote("it's") == "'it'\\''s'"
    assert bash_word("it's") == "'it'\"'\"'s'"  # shlex.quote's spelling, as the build scripts always had
    assert bash_word("caf\u00e9") == "'caf\u00e9'"


@pytest.mark.parametrize(("value", "what"), [("a\0b", "NUL"), ("x\ud800", "U+D800"), ("\udcff", "U+DCFF")])
def test_nul_and_lone_surrogates_are_refused_by_every_renderer(pin21: Any, value: str, what: str) -> None:
    for quote in (bash_quote, bash_word, ps_quote, windows_word):
        with pytest.raises(UsageError, match=re.escape(what)):
            quote(value)
    for render in (lambda: build_bash(build_plan(pin21, "linux", value, program="p", root="/b")),
                   lambda: build_powershell(build_plan(pin21, "windows", value, program="p", root="")),
                   lambda: render_plan(launch_plan(value), "bash"),
                   lambda: render_plan(launch_plan(value), "powershell")):
        with pytest.raises(UsageError, match=re.escape(what)):
            render()
