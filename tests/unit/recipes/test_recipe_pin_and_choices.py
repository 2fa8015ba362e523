"""Two refusals `recipe render` and `recipe check` make offline, through the real command line: the pin follows
the wheel's build-manifest.json (a set pin that differs is refused, exit 11), and an option vLLM declares as a
closed set takes only its values (`--set args.moe-backend=marlinx`: exit 2, naming the choices). The choices
are read from the pins' sources into recipes/vllm-args/<pin>.json; here also from small sources of the same
shape."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins
from g4build.recipes.vllm_args import recorded_table
from g4build.recipes.vllm_choices import annotation_choices, literal_aliases, retyped_fields
from g4build.series.model import load_all

REPO = Path(__file__).resolve().parents[3]
RECIPE = "gemma4-26b-a4b-nvfp4-dflash"
WHEEL = "vllm-0.33.0+g4.0123456789-cp38-abi3-manylinux_2_28_x86_64.whl"


def g4(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=cwd or REPO, timeout=300, check=False)


def overlaid(folder: Path, pin_name: str = "vllm-0.33.0") -> Path:
    pin = load_pins().get(pin_name)
    manifest = make_manifest(pin, [s for s in load_all() if s.variant(pin.name)], route="overlay")
    path = folder / WHEEL
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        archive.writestr("vllm-0.33.0+g4.0123456789.dist-info/build-manifest.json", json.dumps(manifest))
    return path


# --- the pin follows the wheel --------------------------------------------------------------------------------


def test_render_takes_the_pin_from_the_wheel(tmp_path: Path) -> None:
    wheel = overlaid(tmp_path / "dist")
    done = g4("recipe", "render", RECIPE, "--shell", "bash", "--wheel", str(wheel), "--out", str(tmp_path / "l"))
    assert done.returncode == 0, done.stderr
    assert "pin vllm-0.33.0 follows the wheel's build-manifest.json" in done.stderr
    script = (tmp_path / "l" / f"{RECIPE}.sh").read_text(encoding="utf-8")
    torch_033, torch_021 = load_pins().get("vllm-0.33.0").torch, load_pins().get("vllm-0.21.0").torch
    assert torch_033 != torch_021
    assert f"torch=={torch_033}" in script and f"torch=={torch_021}" not in script  # what the wheel runs with
    check = g4("recipe", "check", RECIPE, "--wheel", str(wheel), "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["ok"] is True


@pytest.mark.parametrize("command", ["render", "check"])
def test_a_set_pin_that_is_not_the_wheels_is_refused(tmp_path: Path, command: str) -> None:
    wheel = overlaid(tmp_path / "dist")
    extra = ("--shell", "bash", "--out", str(tmp_path / "l")) if command == "render" else ()
    done = g4("recipe", command, RECIPE, *extra, "--set", "pin=vllm-0.21.0", "--wheel", str(wheel))
    assert done.returncode == 11, done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "was built from pin 'vllm-0.33.0'" in said and "rendered for pin 'vllm-0.21.0'" in said
    assert not (tmp_path / "l").exists()
    same = g4("recipe", command, RECIPE, *extra, "--set", "pin=vllm-0.33.0", "--wheel", str(wheel))
    assert same.returncode == 0, same.stderr


# --- option values checked against the pin's choices -------------------------------------------------------------


@pytest.mark.parametrize("command", ["render", "check"])
def test_a_value_outside_the_choices_is_refused_offline(tmp_path: Path, command: str) -> None:
    extra = ("--shell", "bash", "--out", str(tmp_path / "l")) if command == "render" else ()
    done = g4("recipe", command, RECIPE, *extra, "--set", "args.moe-backend=marlinx")
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert "--set args.moe-backend='marlinx': expected one of" in said and "marlin, triton" in said
    assert "did you mean 'marlin'?" in said and not (tmp_path / "l").exists()
    # vLLM lowers the text and turns '-' into '_' before it compares: so does the check
    assert g4("recipe", command, RECIPE, *extra, "--set", "args.moe-backend=Marlin").returncode == 0


def test_a_choice_is_folded_only_where_vllm_folds_it() -> None:
    """--moe-backend goes through vLLM's `s.lower().replace("-", "_")` before argparse compares; --dtype does not,
    so `BFloat16` is refused there as vLLM refuses it."""
    for spelled in ("Flashinfer-Cutlass", "FLASHINFER_CUTLASS"):
        taken = g4("recipe", "check", RECIPE, "--set", "pin=vllm-0.33.0", "--set", f"args.moe-backend={spelled}")
        assert taken.returncode == 0, taken.stderr
    refused = g4("recipe", "check", RECIPE, "--set", "args.dtype=BFloat16")
    assert refused.returncode == 2 and "--set args.dtype='BFloat16': expected one of" in refused.stderr
    assert g4("recipe", "check", RECIPE, "--set", "args.dtype=bfloat16").returncode == 0


def test_the_choices_are_per_pin() -> None:
    # rdna3 is a MoE backend of 0.33.0 only: refused for the default pin, taken for 0.33.0
    tables = {name: recorded_table(load_pins().get(name)) for name in load_pins().pins}
    assert all(t is not None for t in tables.values())
    moe = {name: t["args"]["moe-backend"]["choices"] for name, t in tables.items() if t is not None}
    assert all("marlin" in c and "auto" in c for c in moe.values())
    assert "rdna3" in moe["vllm-0.33.0"] and "rdna3" not in moe["vllm-0.21.0"]
    refused = g4("recipe", "check", RECIPE, "--set", "args.moe-backend=rdna3")
    assert refused.returncode == 2 and "vLLM 0.21.0" in refused.stderr
    taken = g4("recipe", "check", RECIPE, "--set", "pin=vllm-0.33.0", "--set", "args.moe-backend=rdna3")
    assert taken.returncode == 0, taken.stderr


SOURCE = '''
from typing import Literal
Inner = Literal["b", "c"]
Backend = Literal["a", Inner]
Mixed = Literal["x", 1]
class EngineArgs:
    backend: Backend = "a"
    maybe: Literal["p", "q"] | None = None
    free: Backend | str = "a"
    mixed: Mixed = "x"
    other: int = 1
def add_cli_args(kernel_kwargs, parallel_kwargs):
    backend_kwargs = kernel_kwargs["backend"]
    backend_kwargs["type"] = lambda s: s.lower().replace("-", "_")
    parallel_kwargs["maybe"]["choices"].remove("q")
    kernel_kwargs["mixed"]["type"] = str.upper
'''


def test_choices_are_read_from_literal_annotations_and_aliases() -> None:
    aliases = literal_aliases({"vllm/engine/arg_utils.py": SOURCE})
    fields = {n.target.id: n.annotation for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    assert annotation_choices(fields["backend"], aliases) == ["a", "b", "c"]  # nested aliases flattened
    assert annotation_choices(fields["maybe"], aliases) == ["p", "q"]  # None is the option left out
    assert annotation_choices(fields["free"], aliases) is None  # a str beside it: any text (a metavar)
    assert annotation_choices(fields["mixed"], aliases) is None  # not all strings
    assert annotation_choices(fields["other"], aliases) is None
    # the one conversion followed; a changed choices list or another type leaves the option unchecked
    assert retyped_fields(SOURCE) == {"backend": "lower-underscore", "maybe": None, "mixed": None}
