"""Recipe parsing, --set overrides and the argv both renderers share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from g4build.errors import ConfigError, RecipeError, UsageError
from g4build.recipes import load_recipe, recipe_names
from g4build.recipes.argv import serve_argv
from g4build.recipes.model import parse_recipe
from g4build.recipes.overrides import apply_overrides, parse_override, typed_value


def test_shipped_recipes_parse_and_include_the_four_required() -> None:
    names = recipe_names()
    for required in (
        "gemma4-26b-a4b-nvfp4-dflash",
        "gemma4-26b-a4b-nvfp4-mtp",
        "gemma4-31b-dflash",
        "gemma4-26b-a4b-nvfp4-baseline",
    ):
        assert required in names
    for name in names:
        assert load_recipe(name).name == name


def test_dflash_recipe_argv_is_the_users_known_good_command_sized_for_the_drafter() -> None:
    # the users' command for the target alone, but for the context and prefill chunk: at 131072 / 32768 vLLM wants
    # 11.45 GiB of KV cache with the drafter (tests/gpu/results/vllm-0.21.0-card-fit.json), more than a 32 GB card
    # has left after the weights (test_kv_need.py)
    argv = serve_argv(load_recipe("gemma4-26b-a4b-nvfp4-dflash"))
    assert argv == [
        "serve", "./models/gemma-4-26B-A4B-it-NVFP4",
        "--served-model-name", "gemma-4-26b-a4b",
        "--max-model-len", "65536",
        "--max-num-seqs", "22",
        "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.8",
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "gemma4",
        "--mm-processor-cache-gb", "0",  # vLLM 0.21.0 + transformers 5.17: see the recipe
        "--speculative-config",
        '{"method":"dflash","model":"./models/gemma-4-26B-A4B-it-DFlash","num_speculative_tokens":15,'
        '"attention_backend":"flash_attn"}',
    ]
    assert "--quantization" not in argv


def test_baseline_has_no_speculative_config() -> None:
    assert "--speculative-config" not in serve_argv(load_recipe("gemma4-26b-a4b-nvfp4-baseline"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("15", 15), ("-3", -3), ("0.80", 0.8), ("1e3", 1000.0), ("true", True), ("False", False),
        ("null", None), ("~", None), ("yes", "yes"), ("on", "on"), ("a #b", "a #b"), ("x: y", "x: y"),
        ("'it''s'", "it's"), ('"say \\"hi\\""', 'say "hi"'), ("[a, 2]", ["a", 2]), ("{k: 1}", {"k": 1}),
        ("", ""), ("0x10", "0x10"), ("1.2.3", "1.2.3"),
    ],
)
def test_set_values_are_typed_predictably(text: str, expected: Any) -> None:
    assert typed_value(text) == expected
    assert type(typed_value(text)) is type(expected)


def test_env_values_stay_text() -> None:
    assert parse_override("env.X=0.80").value == "0.80"
    assert parse_override("env.X=true").value == "true"


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("bogus=1", "unknown recipe field 'bogus'"),
        ("hardware.colour=red", "unknown key 'colour' under 'hardware'"),
        ("args.--max-model-len=1", "not an option name"),
        ("env.BAD-NAME=1", "not an environment variable name"),
        ("model", "expected KEY=VALUE"),
        ("args..x=1", "empty part"),
        ("model='unterminated", "not valid YAML"),
        ("args.max-model-len.deep=1", "has no sub-keys"),
        ("footprint.kv.nope=1", "footprint.kv takes"),
    ],
)
def test_bad_set_items_say_what_is_wrong(item: str, needle: str) -> None:
    with pytest.raises(UsageError, match=None) as info:
        parse_override(item)
    assert needle in info.value.message


def test_overrides_reach_every_kind_of_field(base_data: dict[str, Any], write_recipe: Any) -> None:
    path = write_recipe(base_data)
    r = load_recipe(str(path), [
        "model=/elsewhere/model dir",
        "env.NEW_VAR=hello world",
        "args.max-model-len=65536",
        "args.max-num-seqs=null",
        "speculative={method: dflash, model: d}",
        "speculative.num_speculative_tokens=15",
        "hardware.vram_gb=96",
        "served_model_names=[a, b]",
    ])
    assert r.model == "/elsewhere/model dir"
    assert r.env["NEW_VAR"] == "hello world"
    assert r.args["max-model-len"] == 65536
    assert "max-num-seqs" not in r.args
    assert r.speculative == {"method": "dflash", "model": "d", "num_speculative_tokens": 15}
    assert r.hardware.vram_gb == 96
    assert r.served_model_names == ("a", "b")


def test_overrides_do_not_change_the_loaded_data(base_data: dict[str, Any]) -> None:
    before = repr(base_data)
    apply_overrides(base_data, ["args.max-model-len=1", "env.X=2"])
    assert repr(base_data) == before


def test_a_set_that_breaks_the_recipe_is_a_usage_error(base_data: dict[str, Any], write_recipe: Any) -> None:
    path = write_recipe(base_data)
    with pytest.raises(UsageError, match="served_model_names"):
        load_recipe(str(path), ["args.served-model-name=x"])
    with pytest.raises(UsageError, match="model"):
        load_recipe(str(path), ["model=-rf"])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"colour": "red"}, "unknown key(s) 'colour'"),
        ({"env": {"A": True}}, "expected a string"),
        ({"env": {"A B": "x"}}, "not an environment variable name"),
        ({"args": {"--max-model-len": 1}}, "not an option name"),
        ({"args": {"speculative-config": "{}"}}, "set the recipe field 'speculative'"),
        ({"hardware": {"vram_gb": 32}}, "missing key 'arch'"),
        ({"speculative": {"model": "x"}}, "missing key 'method'"),
        ({"model": ""}, "expected a path or a model id"),
        ({"footprint": {"weights_gib": "lots"}}, "expected a number"),
        ({"hardware": {"vram_gb": 32, "arch": "rtx5090"}}, "expected an SM arch"),
    ],
)
def test_malformed_recipes_are_config_errors(base_data: dict[str, Any], change: dict[str, Any], needle: str) -> None:
    base_data.update(change)
    with pytest.raises(ConfigError) as info:
        parse_recipe(base_data, "test.yaml")
    assert needle in info.value.message


@pytest.mark.parametrize(("arch", "cap"), [("sm120", "12.0"), ("SM_121", "12.1"), ("sm90a", "9.0"), ("sm100f", "10.0")])
def test_arch_names_the_compute_capability(base_data: dict[str, Any], arch: str, cap: str) -> None:
    base_data["hardware"] = {"vram_gb": 32, "arch": arch}
    assert parse_recipe(base_data, "t").hardware.compute_capability == cap


def test_file_name_must_match_recipe_name(base_data: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "other-name.yaml"
    path.write_text("name: unit-recipe\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="file's name"):
        load_recipe(str(path))


def test_unknown_recipe_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as info:
        load_recipe("no-such-recipe")
    assert "gemma4-26b-a4b-nvfp4-dflash" in info.value.message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"flag": True}, ["--flag"]),
        ({"enable-chunked-prefill": False}, ["--no-enable-chunked-prefill"]),
        ({"opt": "-starts-with-dash"}, ["--opt=-starts-with-dash"]),
        ({"opt": "-5"}, ["--opt", "-5"]),
        ({"opt": [1, "b"]}, ["--opt", "1", "b"]),
        ({"compilation-config": {"level": 3, "x": [1]}}, ["--compilation-config", '{"level":3,"x":[1]}']),
        ({"opt": ""}, ["--opt", ""]),
    ],
)
def test_option_values_become_exact_words(base_data: dict[str, Any], args: dict[str, Any], expected: list[str]) -> None:
    base_data["args"] = args
    base_data["served_model_names"] = []
    assert serve_argv(parse_recipe(base_data, "t"))[2:] == expected


def test_non_finite_numbers_are_refused(base_data: dict[str, Any]) -> None:
    base_data["speculative"] = {"method": "dflash", "x": float("nan")}
    with pytest.raises(RecipeError, match="cannot be written as JSON"):
        serve_argv(parse_recipe(base_data, "t"))
    base_data["speculative"] = None
    base_data["args"] = {"opt": float("inf")}
    with pytest.raises(RecipeError, match="not a finite number"):
        serve_argv(parse_recipe(base_data, "t"))


def test_list_values_starting_with_a_dash_are_refused(base_data: dict[str, Any]) -> None:
    base_data["args"] = {"opt": ["ok", "-bad"]}
    with pytest.raises(RecipeError, match="cannot be empty or start with '-'"):
        serve_argv(parse_recipe(base_data, "t"))


def test_speculative_json_keeps_order_and_non_ascii(base_data: dict[str, Any]) -> None:
    base_data["speculative"] = {"method": "dflash", "model": "D:/modèles/d", "num_speculative_tokens": 15}
    argv = serve_argv(parse_recipe(base_data, "t"))
    spec = '{"method":"dflash","model":"D:/modèles/d","num_speculative_tokens":15}'
    assert argv[-2:] == ["--speculative-config", spec]
