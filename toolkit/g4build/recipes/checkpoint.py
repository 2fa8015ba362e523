"""Read what a checkpoint folder says about itself: ``config.json`` (and ``hf_quant_config.json``).

Gemma 4 multimodal checkpoints nest the language model's settings under ``text_config``; a drafter's
config is flat. Both are read the same way: a key is looked up in ``text_config`` first, then at the top.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError, UsageError
from g4build.recipes.model import KvGeometry
from g4build.util.safeload import read_json

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB (a quantization config's module lists, a few hundred)
# The range each geometry number a rule computes with may take (a model outside them is not one vLLM serves): a
# value out of range (negative or zero heads, a 10^9 layer count) is an error, not an estimate.
GEOMETRY_RANGES = {
    "num_hidden_layers": (1, 4096),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "num_global_key_value_heads": (1, 4096),
    "head_dim": (1, 65536),
    "global_head_dim": (1, 65536),
    "hidden_size": (1, 1 << 24),
    "num_kv_shared_layers": (0, 4096),
    "sliding_window": (0, 1 << 31),
}


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    path: str
    architectures: tuple[str, ...]
    model_type: str
    quant_method: str | None
    quant_algo: str | None
    head_dim: int | None
    global_head_dim: int | None
    kv: KvGeometry | None
    weights_bytes: int
    # a multimodal checkpoint whose image tokens attend both ways (text_config.use_bidirectional_attention "vision",
    # vLLM's is_mm_prefix_lm): vLLM then takes a multimodal item in one step (mm_batched.py)
    mm_prefix: bool = False

    @property
    def is_gemma4(self) -> bool:
        return self.model_type.startswith("gemma4") or any(a.startswith("Gemma4") for a in self.architectures)

    @property
    def is_modelopt_nvfp4(self) -> bool:
        return (self.quant_method or "").lower() == "modelopt" and "NVFP4" in (self.quant_algo or "").upper()

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "quant_method": self.quant_method,
            "quant_algo": self.quant_algo,
            "head_dim": self.head_dim,
            "global_head_dim": self.global_head_dim,
            "kv": None if self.kv is None else vars(self.kv).copy(),
            "weights_bytes": self.weights_bytes,
            "mm_prefix": self.mm_prefix,
        }


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path, MAX_CONFIG_BYTES, f"a checkpoint's {path.name}")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    return data


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _quantization(config: dict[str, Any], folder: Path) -> tuple[str | None, str | None]:
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        quant = {}
    method = quant.get("quant_method")
    algo = quant.get("quant_algo")
    nested = quant.get("quantization")
    if isinstance(nested, dict):
        algo = algo or nested.get("quant_algo")
    side = folder / "hf_quant_config.json"  # modelopt's own file, used when config.json has no section
    if side.is_file() and (method is None or algo is None):
        extra = _read_json(side)
        producer = extra.get("producer")
        if method is None and isinstance(producer, dict) and "modelopt" in str(producer.get("name", "")).lower():
            method = "modelopt"
        section = extra.get("quantization")
        if algo is None and isinstance(section, dict):
            algo = section.get("quant_algo")
    return (None if method is None else str(method), None if algo is None else str(algo))


def geometry_int(text: dict[str, Any], key: str, where: str) -> int | None:
    """``text[key]`` when it is a whole number (None when absent or not one), refused when out of its range."""
    value = _int_or_none(text.get(key))
    low, high = GEOMETRY_RANGES[key]
    if value is not None and not low <= value <= high:
        raise ConfigError(f"{where}: {key} is {value}, expected a whole number from {low} to {high}",
                          hint="the rules cannot estimate memory from it; check that this is the model's own config")
    return value


def kv_geometry(text: dict[str, Any], where: str = "config.json") -> KvGeometry | None:
    """KV-holding layers from a (text) config; None when the config lacks the needed keys; ConfigError when one
    of them is out of range (``GEOMETRY_RANGES``)."""
    def get(key: str) -> int | None:
        return geometry_int(text, key, where)

    layers = get("num_hidden_layers")
    kv_heads = get("num_key_value_heads") or get("num_attention_heads")
    head_dim = get("head_dim")
    if head_dim is None:
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        head_dim = hidden // heads if hidden and heads else None
    if not layers or not kv_heads or not head_dim:
        return None
    shared = get("num_kv_shared_layers") or 0
    if shared > layers:  # equal: a drafter whose every layer reads the target's cache (Gemma 4's MTP)
        raise ConfigError(f"{where}: num_kv_shared_layers is {shared}, expected at most num_hidden_layers "
                          f"({layers})", hint="check that this is the model's own config")
    layer_types = text.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        layer_types = ["full_attention"] * layers
    owning = layer_types[: layers - shared]  # shared layers reuse earlier layers' cache
    full = sum(1 for t in owning if t != "sliding_attention")
    sliding = len(owning) - full
    full_head_dim = get("global_head_dim") or head_dim
    full_kv_heads = kv_heads
    if text.get("attention_k_eq_v"):
        full_kv_heads = get("num_global_key_value_heads") or kv_heads
    window = get("sliding_window") or 0
    return KvGeometry(
        full_layers=full,
        full_kv_heads=full_kv_heads,
        full_head_dim=full_head_dim,
        sliding_layers=sliding,
        sliding_kv_heads=kv_heads if sliding else 0,
        sliding_head_dim=head_dim if sliding else 0,
        sliding_window=window if sliding else 0,
    )


def read_checkpoint(folder: Path) -> CheckpointInfo:
    """Read ``folder/config.json``; weights are the sizes of the weight files in the folder."""
    config_path = folder / "config.json"
    if not os.path.lexists(config_path):
        raise UsageError(
            f"{folder}: expected a checkpoint folder with config.json, found none",
            hint="pass the folder that holds the model's config.json and *.safetensors files",
        )
    config = _read_json(config_path)
    text = config.get("text_config")
    if not isinstance(text, dict):
        text = {}
    merged = {**config, **text}  # text_config wins for the language model's geometry
    raw_archs = config.get("architectures") or []
    architectures = tuple(str(a) for a in raw_archs) if isinstance(raw_archs, list) else ()
    method, algo = _quantization(config, folder)
    weights = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return CheckpointInfo(
        path=str(folder),
        architectures=architectures,
        model_type=str(config.get("model_type") or ""),
        quant_method=method,
        quant_algo=algo,
        head_dim=geometry_int(merged, "head_dim", str(config_path)),
        global_head_dim=geometry_int(merged, "global_head_dim", str(config_path)),
        kv=kv_geometry(merged, str(config_path)),
        weights_bytes=weights,
        mm_prefix=isinstance(config.get("vision_config"), dict)
        and merged.get("use_bidirectional_attention") == "vision"
        and any(a.endswith("ForConditionalGeneration") for a in architectures),
    )
