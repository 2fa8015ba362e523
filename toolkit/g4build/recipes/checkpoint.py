"""Read what a checkpoint folder says about itself: ``config.json`` (and ``hf_quant_config.json``).

Gemma 4 multimodal checkpoints nest the language model's settings under ``text_config``; a drafter's
config is flat. Both are read the same way: a key is looked up in ``text_config`` first, then at the top.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError, UsageError
from g4build.recipes.model import KvGeometry

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


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
        }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
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


def kv_geometry(text: dict[str, Any]) -> KvGeometry | None:
    """KV-holding layers from a (text) config; None when the config lacks the needed keys."""
    layers = _int_or_none(text.get("num_hidden_layers"))
    kv_heads = _int_or_none(text.get("num_key_value_heads")) or _int_or_none(text.get("num_attention_heads"))
    head_dim = _int_or_none(text.get("head_dim"))
    if head_dim is None:
        hidden, heads = _int_or_none(text.get("hidden_size")), _int_or_none(text.get("num_attention_heads"))
        head_dim = hidden // heads if hidden and heads else None
    if not layers or not kv_heads or not head_dim:
        return None
    shared = _int_or_none(text.get("num_kv_shared_layers")) or 0
    layer_types = text.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        layer_types = ["full_attention"] * layers
    owning = layer_types[: layers - shared]  # shared layers reuse earlier layers' cache
    full = sum(1 for t in owning if t != "sliding_attention")
    sliding = len(owning) - full
    full_head_dim = _int_or_none(text.get("global_head_dim")) or head_dim
    full_kv_heads = kv_heads
    if text.get("attention_k_eq_v"):
        full_kv_heads = _int_or_none(text.get("num_global_key_value_heads")) or kv_heads
    window = _int_or_none(text.get("sliding_window")) or 0
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
    if not config_path.is_file():
        raise UsageError(
            f"{folder}: expected a checkpoint folder with config.json, found none",
            hint="pass the folder that holds the model's config.json and *.safetensors files",
        )
    config = _read_json(config_path)
    text = config.get("text_config")
    if not isinstance(text, dict):
        text = {}
    merged = {**config, **text}  # text_config wins for the language model's geometry
    architectures = config.get("architectures") or []
    method, algo = _quantization(config, folder)
    weights = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return CheckpointInfo(
        path=str(folder),
        architectures=tuple(str(a) for a in architectures) if isinstance(architectures, list) else (),
        model_type=str(config.get("model_type") or ""),
        quant_method=method,
        quant_algo=algo,
        head_dim=_int_or_none(merged.get("head_dim")),
        global_head_dim=_int_or_none(merged.get("global_head_dim")),
        kv=kv_geometry(merged),
        weights_bytes=weights,
    )
