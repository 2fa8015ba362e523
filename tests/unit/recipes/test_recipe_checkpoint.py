"""Reading checkpoint folders (config.json, hf_quant_config.json, weight files) and wheel manifests."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from g4build.emit.manifest import make_manifest
from g4build.errors import ConfigError, UsageError
from g4build.pins.model import load_pins
from g4build.recipes.checkpoint import read_checkpoint
from g4build.recipes.context import drafter_dir, read_wheel_info
from g4build.recipes.model import parse_recipe
from g4build.series.model import load_series
from g4build.wheelfile.manifestfile import dumps

GEMMA4_TEXT = {
    "model_type": "gemma4_text",
    "num_hidden_layers": 6,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "num_key_value_heads": 8,
    "num_global_key_value_heads": 2,
    "attention_k_eq_v": True,
    "head_dim": 256,
    "global_head_dim": 512,
    "sliding_window": 1024,
}


def write_dir(root: Path, name: str, config: dict[str, Any], files: dict[str, int] | None = None) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for file, size in (files or {}).items():
        (folder / file).write_bytes(b"\0" * size)
    return folder


def test_gemma4_nvfp4_target_with_text_config_nesting(tmp_path: Path) -> None:
    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        "text_config": GEMMA4_TEXT,
    }
    info = read_checkpoint(write_dir(tmp_path, "target", config, {"a.safetensors": 1000, "b.safetensors": 24,
                                                                   "tokenizer.json": 99}))
    assert info.is_gemma4 and info.is_modelopt_nvfp4
    assert (info.head_dim, info.global_head_dim) == (256, 512)
    assert info.weights_bytes == 1024
    assert info.kv is not None
    assert (info.kv.full_layers, info.kv.full_kv_heads, info.kv.full_head_dim) == (1, 2, 512)
    assert (info.kv.sliding_layers, info.kv.sliding_kv_heads, info.kv.sliding_window) == (5, 8, 1024)


def test_modelopt_quantization_from_hf_quant_config(tmp_path: Path) -> None:
    folder = write_dir(tmp_path, "t", {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text"})
    (folder / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}), encoding="utf-8")
    info = read_checkpoint(folder)
    assert (info.quant_method, info.quant_algo) == ("modelopt", "NVFP4")


def test_nested_quant_algo_and_unquantized(tmp_path: Path) -> None:
    nested = {"quantization_config": {"quant_method": "modelopt", "quantization": {"quant_algo": "nvfp4"}}}
    assert read_checkpoint(write_dir(tmp_path, "a", nested)).is_modelopt_nvfp4
    plain = read_checkpoint(write_dir(tmp_path, "b", {"model_type": "llama", "num_hidden_layers": 2,
                                                     "num_attention_heads": 4, "hidden_size": 256}))
    assert not plain.is_modelopt_nvfp4 and not plain.is_gemma4
    assert plain.kv is not None and (plain.kv.full_layers, plain.kv.full_head_dim) == (2, 64)


def test_kv_shared_layers_hold_no_cache(tmp_path: Path) -> None:
    text = {**GEMMA4_TEXT, "num_kv_shared_layers": 2}
    info = read_checkpoint(write_dir(tmp_path, "t", {"model_type": "gemma4", "text_config": text}))
    assert info.kv is not None and (info.kv.sliding_layers, info.kv.full_layers) == (4, 0)


def test_drafter_config_is_flat(tmp_path: Path) -> None:
    info = read_checkpoint(write_dir(tmp_path, "d", {"model_type": "gemma4_assistant", "head_dim": 256}))
    assert info.model_type == "gemma4_assistant" and info.head_dim == 256 and info.global_head_dim is None


def test_missing_or_broken_config(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"config\.json"):
        read_checkpoint(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_checkpoint(tmp_path / "bad")


def test_drafter_dir_from_the_recipe_when_local(tmp_path: Path) -> None:
    local = write_dir(tmp_path, "drafter", {"model_type": "dflash"})
    base = {"name": "x", "model": "m", "hardware": {"vram_gb": 32, "arch": "sm120"},
            "speculative": {"method": "dflash", "model": str(local)}}
    assert drafter_dir(parse_recipe(base, "t"), None) == local
    remote = {**base, "speculative": {"method": "dflash", "model": "org/not-a-folder"}}
    assert drafter_dir(parse_recipe(remote, "t"), None) is None
    assert drafter_dir(parse_recipe(remote, "t"), tmp_path) == tmp_path
    empty = {**base, "speculative": {"method": "dflash", "model": ""}}
    assert drafter_dir(parse_recipe(empty, "t"), None) is None  # "" is not the current folder


def test_wheel_manifest_names_its_series(tmp_path: Path) -> None:
    folder = tmp_path / "fix"
    (folder / "vllm-0.21.0").mkdir(parents=True)
    (folder / "vllm-0.21.0" / "0001-a.patch").write_text("--- a/x\n+++ b/x\n", encoding="utf-8")
    (folder / "series.yaml").write_text(
        "name: fix\nversion: 3\ntitle: t\npython_only: true\npins:\n"
        "  vllm-0.21.0:\n    patches:\n      - {file: vllm-0.21.0/0001-a.patch, subject: s}\n", encoding="utf-8")
    manifest = make_manifest(load_pins().get("vllm-0.21.0"), [load_series(folder)], route="overlay")
    ours = tmp_path / "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(ours, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm-0.21.0+cu130.g4.abc.dist-info/build-manifest.json", dumps(manifest))
    info = read_wheel_info(ours)
    assert info.pin == "vllm-0.21.0" and info.series == {"fix": 3}
    stock = tmp_path / "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl"
    with zipfile.ZipFile(stock, "w") as z:
        z.writestr("vllm/__init__.py", "")
    assert read_wheel_info(stock).series == {}
    (tmp_path / "junk.whl").write_text("not a zip", encoding="utf-8")
    with pytest.raises(UsageError, match="not a zip"):
        read_wheel_info(tmp_path / "junk.whl")
