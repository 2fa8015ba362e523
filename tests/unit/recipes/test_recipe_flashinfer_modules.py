"""The FlashInfer JIT modules a rendered recipe makes vLLM load (recipes/vllm-args/flashinfer-modules.yaml applied
to the launch ``recipe render`` writes): the shipped recipes per pin, and recipe changes that change the list."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.yamltext import yaml_text

import g4build
from g4build.data import load_yaml_mapping, recipes_dir
from g4build.errors import ConfigError, RecipeError
from g4build.pins.model import load_pins
from g4build.recipes import recipe_names
from g4build.recipes.flashinfer import wheel_flashinfer
from g4build.recipes.flashinfer_modules import TABLE_FILE, load_table, modules_for_pin, option_values

PINS = load_pins()
BOTH = ["sampling", "fp4_gemm_cutlass_sm120"]
BASELINE = "gemma4-26b-a4b-nvfp4-baseline"


def names(pin: str, recipes: list[str], sets: tuple[str, ...] = ()) -> list[str]:
    return [d.module.name for d in modules_for_pin(pin, recipes, sets=sets)]


def shipped(name: str) -> dict[str, Any]:
    return copy.deepcopy(load_yaml_mapping(recipes_dir() / f"{name}.yaml"))


@pytest.fixture
def recipe_file(tmp_path: Path) -> Callable[[dict[str, Any]], str]:
    def write(data: dict[str, Any]) -> str:
        path = tmp_path / f"{data['name']}.yaml"
        path.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
        return str(path)
    return write


@pytest.mark.parametrize("pin", sorted(PINS.pins))
def test_shipped_recipes_load_the_sampler_and_the_fp4_gemm_on_every_pin(pin: str) -> None:
    derived = modules_for_pin(pin, recipe_names())
    assert [d.module.name for d in derived] == BOTH
    sampler, gemm = derived
    assert sampler.module.generator == "flashinfer.jit.sampling:gen_sampling_module"
    assert gemm.module.majors == (12,)
    # every recipe samples; only the four NVFP4 ones reach the FP4 GEMM (the 31B is bf16)
    assert len(sampler.reasons) == len(recipe_names())
    assert not any(r.startswith("gemma4-31b-dflash:") for r in gemm.reasons)
    spelling = "VLLM_NVFP4_GEMM_BACKEND=flashinfer-cutlass" if pin == "vllm-0.21.0" else \
        "--linear-backend=flashinfer_cutlass"
    assert all(spelling in r for r in gemm.reasons)


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.33.0"])
def test_sampler_switched_off_drops_sampling(pin: str) -> None:
    assert names(pin, [BASELINE], ("env.VLLM_USE_FLASHINFER_SAMPLER=0",)) == ["fp4_gemm_cutlass_sm120"]


def test_nvfp4_backend_cutlass_drops_the_fp4_gemm() -> None:
    assert names("vllm-0.21.0", [BASELINE], ("env.VLLM_NVFP4_GEMM_BACKEND=cutlass",)) == ["sampling"]


def test_recipe_without_the_gemm_backend_has_no_fp4_gemm(recipe_file: Callable[[dict[str, Any]], str]) -> None:
    data = shipped(BASELINE)
    del data["env"]["VLLM_NVFP4_GEMM_BACKEND"]
    for pin in ("vllm-0.21.0", "vllm-0.33.0"):
        assert names(pin, [recipe_file(data)]) == ["sampling"]


def test_recipe_without_the_sampler_variable_still_samples_with_flashinfer(
        recipe_file: Callable[[dict[str, Any]], str]) -> None:
    # vLLM's default for VLLM_USE_FLASHINFER_SAMPLER is on (vllm/envs.py, every pin): dropping it keeps the module
    data = shipped(BASELINE)
    del data["env"]["VLLM_USE_FLASHINFER_SAMPLER"]
    derived = modules_for_pin("vllm-0.21.0", [recipe_file(data)])
    assert [d.module.name for d in derived] == BOTH
    assert "VLLM_USE_FLASHINFER_SAMPLER=unset" in derived[0].reasons[0]


def test_bf16_checkpoint_never_reaches_the_fp4_gemm(recipe_file: Callable[[dict[str, Any]], str]) -> None:
    data = shipped(BASELINE)
    data["checkpoint"] = {}
    assert names("vllm-0.21.0", [recipe_file(data)]) == ["sampling"]
    assert names("vllm-0.33.0", [recipe_file(data)]) == ["sampling"]


def test_linear_backend_option_is_read_on_later_pins() -> None:
    assert names("vllm-0.33.0", [BASELINE], ("args.linear-backend=cutlass",)) == ["sampling"]


@pytest.mark.parametrize("sets", [("env.VLLM_USE_FLASHINFER_MOE_FP4=1",), ("args.moe-backend=flashinfer_cutlass",),
                                  ("args.attention-backend=FLASHINFER",)])
def test_paths_the_table_does_not_know_are_refused(sets: tuple[str, ...]) -> None:
    with pytest.raises(RecipeError, match="reaches FlashInfer through"):
        modules_for_pin("vllm-0.21.0", [BASELINE], sets=sets)


def test_sampler_value_vllm_cannot_read_is_refused() -> None:
    with pytest.raises(RecipeError, match="expected an integer"):
        modules_for_pin("vllm-0.21.0", [BASELINE], sets=("env.VLLM_USE_FLASHINFER_SAMPLER=yes",))


def test_every_pin_has_triggers_and_its_flashinfer_a_source() -> None:
    table = load_table()
    assert set(table.pins) == set(PINS.pins)
    assert {p.flashinfer for p in PINS.pins.values()} <= set(table.sources)


def test_option_values_of_a_serve_argv() -> None:
    argv = ["serve", "m", "--linear-backend", "flashinfer_cutlass", "--enable-prefix-caching", "--x=1"]
    assert option_values(argv) == {"linear-backend": "flashinfer_cutlass", "enable-prefix-caching": "", "x": "1"}


def _table_root(tmp_path: Path, text: str) -> Path:
    (tmp_path / "vllm-args").mkdir()
    (tmp_path / TABLE_FILE).write_text(text, encoding="utf-8")
    return tmp_path


def test_table_trigger_naming_an_unknown_module_is_refused(tmp_path: Path) -> None:
    root = _table_root(tmp_path, "modules:\n  sampling: {generator: 'flashinfer.jit.sampling:gen_sampling_module'}\n"
                                 "tables:\n  t:\n    - {env: X, values: ['1'], modules: [topk]}\npins: {p: t}\n")
    with pytest.raises(ConfigError, match="topk not among the table's modules"):
        load_table(root)


def test_table_pin_naming_an_unknown_table_is_refused(tmp_path: Path) -> None:
    root = _table_root(tmp_path, "modules: {}\ntables: {}\npins: {p: missing}\n")
    with pytest.raises(ConfigError, match="expected one of the tables"):
        load_table(root)


def test_a_wheel_built_with_the_scoped_jit_cache_installs_it_beside() -> None:
    jit = "flashinfer_jit_cache-0.6.8.post1+g4jit.0123456789ab-cp39-abi3-linux_x86_64.whl"
    record = {"source": "aot", "version": "0.6.8.post1", "wheels": [{"file": jit, "sha256": "a" * 64}]}
    manifest = {"flashinfer": record}
    found = wheel_flashinfer("vllm-0.21.0+cu130.g4.abc-cp38-abi3-manylinux_2_28_x86_64.whl", "", manifest)
    assert found.presence == "present" and found.wheels == (jit,)


def test_the_command_lists_the_derived_modules() -> None:
    done = subprocess.run([sys.executable, "-m", "g4build", "flashinfer-aot", "--list", "--json", "--pin",
                           "vllm-0.33.0", "--arch", "sm120", "--recipe", BASELINE], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(Path(g4build.__file__).parents[1])})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["flashinfer"], data["arch_list"]) == ("0.7.2.post1", "12.0f")
    assert [m["module"] for m in data["modules"]] == BOTH
    bad = subprocess.run([sys.executable, "-m", "g4build", "flashinfer-aot", "--list", "--arch", "12.x"],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(Path(g4build.__file__).parents[1])})
    assert bad.returncode != 0 and "12.x" in bad.stderr
