"""Round 3 of hostile input: what `recipe check` and `recipe show` read is bounded before it is believed. A
checkpoint's config.json that nests deeply, holds 4,000-digit numbers, claims 10^9 layers or negative KV heads, is
a link into /proc, a FIFO or a 1 GiB sparse file; a recipe card of inf/nan/negative GB; YAML 1.1 values whose
meaning another reader would change; a 5,000-digit --set number. Each ends in a clear error with its exit code
(never "unexpected ..."), run through the real CLI on files made here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.support.hangs import within

from g4build.cli import main
from g4build.errors import ConfigError
from g4build.recipes import load_recipe

REPO = Path(__file__).resolve().parents[3]
RECIPE = "gemma4-26b-a4b-nvfp4-baseline"
GOOD_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
    "text_config": {"num_hidden_layers": 30, "num_key_value_heads": 8, "num_attention_heads": 16, "head_dim": 256,
                    "sliding_window": 1024},
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _model(tmp_path: Path, config: str | bytes | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    if config is not None:
        (folder / "config.json").write_bytes(config if isinstance(config, bytes) else config.encode())
    return folder


def _check(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    return _run(["recipe", "check", RECIPE, "--model-dir", str(folder)], capsys)


def _with_text(**text: Any) -> str:
    config = json.loads(json.dumps(GOOD_CONFIG))
    config["text_config"].update(text)
    return json.dumps(config)


HOSTILE_CONFIGS = {
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "deep objects": '{"a":' * 5_000 + "1" + "}" * 5_000,
    "4000-digit layer count": _with_text(num_hidden_layers=int("9" * 4000)),
    "4000-digit decimal": _with_text(rope_theta=float("1e300")).replace("1e+300", "1" * 4000 + ".5"),
    "Infinity": _with_text(rope_theta=1.0).replace("1.0", "Infinity"),
    "10^9 layers": _with_text(num_hidden_layers=10**9),
    "negative KV heads": _with_text(num_key_value_heads=-8),
    "zero KV heads": _with_text(num_key_value_heads=0),
    "negative head_dim": _with_text(head_dim=-256),
    "shared past the layers": _with_text(num_kv_shared_layers=31),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_hostile_config_json_is_a_clear_config_error(tmp_path: Path, case: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _check(_model(tmp_path, HOSTILE_CONFIGS[case]), capsys)
    assert code == ConfigError.exit_code, out
    assert "unexpected" not in out and "config.json" in out and "hint:" in out


def test_the_good_config_still_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _check(_model(tmp_path, json.dumps(GOOD_CONFIG)), capsys)
    assert code == 0 and "KV cache" in out, out  # the geometry was read and used


def test_config_json_linked_into_proc_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, None)
    (folder / "config.json").symlink_to("/proc/self/environ")
    code, out = _check(folder, capsys)
    assert code == ConfigError.exit_code and "/proc" in out and "unexpected" not in out, out


def test_config_json_that_is_a_fifo_does_not_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, None)
    os.mkfifo(folder / "config.json")
    code, out = within(lambda: _check(folder, capsys), fifos=[folder / "config.json"])  # a hang fails here
    assert code == ConfigError.exit_code and "FIFO" in out, out


def test_a_sparse_gibibyte_config_json_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, None)
    with open(folder / "config.json", "wb") as fh:
        fh.truncate(1 << 30)
    code, out = _check(folder, capsys)
    assert code == ConfigError.exit_code and str(1 << 30) in out and "unexpected" not in out, out


@pytest.mark.parametrize("value", [".inf", ".nan", "-32", "0"])
def test_a_card_of_inf_nan_or_negative_gb_is_refused(tmp_path: Path, value: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text(encoding="utf-8")
    assert "  vram_gb: 32\n" in text
    path = tmp_path / f"{RECIPE}.yaml"
    path.write_text(text.replace("  vram_gb: 32\n", f"  vram_gb: {value}\n"), encoding="utf-8")
    code, out = _run(["recipe", "check", str(path)], capsys)
    assert code == ConfigError.exit_code and "hardware.vram_gb" in out and "finite" in out, out


def test_a_5000_digit_set_number_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["recipe", "show", RECIPE, "--set", "args.max-model-len=" + "9" * 5000], capsys)
    assert code == 2 and "5000 characters" in out and "unexpected" not in out, out


@pytest.mark.parametrize(("line", "value"), [("block-size: 36:24:32", "36:24:32"),
                                             ("enforce-eager: off", "off"), ("enforce-eager: no", "no"),
                                             ("enforce-eager: yes", "yes"), ("seed: 010", "010")])
def test_yaml_1_1_values_in_a_recipe_are_refused_naming_the_key(tmp_path: Path, line: str, value: str) -> None:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text(encoding="utf-8")
    path = tmp_path / f"{RECIPE}.yaml"
    path.write_text(text.replace("\nargs:\n", f"\nargs:\n  {line}\n", 1), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_recipe(str(path))
    assert f"args.{line.split(':')[0]}" in caught.value.message and repr(value) in caught.value.message
    assert "YAML 1.1" in caught.value.message


def test_quoted_yaml_1_1_words_stay_text(tmp_path: Path) -> None:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text(encoding="utf-8")
    path = tmp_path / f"{RECIPE}.yaml"
    path.write_text(text.replace("\nargs:\n", "\nargs:\n  kv-cache-dtype: 'off'\n", 1), encoding="utf-8")
    assert load_recipe(str(path)).args["kv-cache-dtype"] == "off"


def test_a_recipe_file_that_is_a_fifo_or_huge_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo" / f"{RECIPE}.yaml"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    # recipe_path only takes regular files: the FIFO is named as an unknown recipe, not opened
    with pytest.raises(Exception) as caught:
        within(lambda: load_recipe(str(fifo)), fifos=[fifo])
    assert "unexpected" not in str(caught.value)
    from g4build.util.yamlsafe import load_mapping
    with pytest.raises(ConfigError, match="FIFO"):
        within(lambda: load_mapping(fifo), fifos=[fifo])
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(1 << 30)
    with pytest.raises(ConfigError, match=str(1 << 30)):
        load_mapping(big)


def test_pins_yaml_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    from g4build.util.yamlsafe import load_mapping
    link = tmp_path / "pins.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="/dev"):
        load_mapping(link)


@pytest.mark.parametrize(("option", "value"), [("max-model-len", "-131072"), ("max-num-seqs", "0"),
                                               ("max-num-batched-tokens", "-1")])
def test_a_negative_or_zero_count_in_a_recipe_file_fails_the_check(tmp_path: Path, option: str, value: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text(encoding="utf-8")
    path = tmp_path / f"{RECIPE}.yaml"
    lines = [f"  {option}: {value}" if line.startswith(f"  {option}: ") else line for line in text.splitlines()]
    assert lines != text.splitlines()
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out = _run(["recipe", "check", str(path)], capsys)
    assert code == 11 and f"[counts] {option} must be a whole number from 1" in out, out
    assert option != "max-model-len" or "KV cache not estimated" in out  # no estimate from a negative length
