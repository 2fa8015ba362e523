"""Gemma 4 26B-A4B at its published shapes (tests/gpu/e2e/real_size.py) and the pure-Python count of its parameters
and KV cache (size_model.py): held to the published figures, to transformers' own modules built on the meta device,
and to KV sizes computed by hand."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .test_acceptance import _load


@pytest.fixture(scope="module")
def rs() -> ModuleType:
    return _load("real_size")


@pytest.fixture(scope="module")
def sm() -> ModuleType:
    return _load("size_model")


def _within(value: float, published: float, tol: float) -> bool:
    return abs(value - published) <= tol


# --------------------------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------------------------
def test_layer_pattern_is_five_times_five_sliding_then_one_full(rs: ModuleType) -> None:
    kinds = rs.text_config()["layer_types"]
    assert len(kinds) == 30 and kinds.count("sliding_attention") == 25 and kinds[-1] == "full_attention"
    assert [i for i, k in enumerate(kinds) if k == "full_attention"] == [5, 11, 17, 23, 29]
    d = rs.dflash_config()
    assert d["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"] and d["sliding_window"] == 2048
    assert max(d["dflash_config"]["target_layer_ids"]) < len(kinds)  # taps inside the target


def test_drafters_match_the_targets_width_and_the_mtp_reads_only_target_kv(rs: ModuleType) -> None:
    t, d, m = rs.text_config(), rs.dflash_config(), rs.mtp_config()
    assert d["target_hidden_size"] == t["hidden_size"] == m["backbone_hidden_size"]
    assert d["vocab_size"] == t["vocab_size"] == m["text_config"]["vocab_size"]
    mt = m["text_config"]
    assert mt["num_kv_shared_layers"] == mt["num_hidden_layers"] == len(mt["layer_types"])
    # a shared layer reads the target's cache: its geometry must be the target's for its kind
    assert (mt["head_dim"], mt["num_key_value_heads"]) == (t["head_dim"], t["num_key_value_heads"])
    assert (mt["global_head_dim"], mt["num_global_key_value_heads"]) == (512, 2)
    s = rs.mtp_standin_config()["text_config"]
    assert set(s["layer_types"]) == {"full_attention"} and (s["head_dim"], s["num_key_value_heads"]) == (512, 2)


# --------------------------------------------------------------------------------------------------------------
# parameter count against the published figures
# --------------------------------------------------------------------------------------------------------------
def test_target_count_is_the_published_26b_a4b(rs: ModuleType, sm: ModuleType) -> None:
    counts = sm.target_params(rs.target_config())
    text, vision = counts["text"], counts["vision"]
    pub = rs.PUBLISHED
    # The model card gives 25.2B / 3.8B to one decimal (the language model): half a unit of its last digit.
    assert _within(text.total, pub["text_total"], 0.05e9), text.total
    assert _within(text.active, pub["text_active"], 0.05e9), text.active
    # "~550M" for the vision encoder: the card's "~", taken as 5%.
    assert _within(vision.total, pub["vision"], 0.05 * pub["vision"]), vision.total
    # The name: 26B total (text + vision) and A4B, to the nearest billion.
    assert _within(text.total + vision.total, pub["name_total"], 0.5e9)
    assert _within(text.active + vision.total, pub["name_active"], 0.5e9)
    # The experts are what makes it sparse: 8 of 128 active.
    assert text.total - text.active == text.parts["experts"] * 120 // 128


def test_vllm_holds_a_v_slot_on_k_eq_v_layers(rs: ModuleType, sm: ModuleType) -> None:
    assert sm.vllm_extra_params(rs.text_config()) == 5 * 2816 * 2 * 512 == 14_417_920
    assert sm.vllm_extra_params(_load("tiny_models").text_config()) == 0  # no k_eq_v: K and V apart already


def test_mtp_count_is_the_published_checkpoint_exactly(rs: ModuleType, sm: ModuleType) -> None:
    assert sm.mtp_params(rs.mtp_config()).total == rs.PUBLISHED["mtp_params"] == 419_711_236


def test_dflash_count_has_no_embedding_or_head(rs: ModuleType, sm: ModuleType) -> None:
    c = sm.dflash_params(rs.dflash_config())
    # 5 layers of (attention 2816 -> 32x128 q/o, 8x128 k/v; MLP 3 x 2816 x 5632; norms) + fc 6 x 2816 -> 2816
    per_layer = 2 * 2816 * 4096 + 2 * 2816 * 1024 + 2 * 128 + 3 * 2816 * 5632 + 2 * 2816
    assert c.parts["layers"] == 5 * per_layer == 382_104_320
    assert c.parts["fc"] == 6 * 2816 * 2816
    assert c.total == 429_689_088  # ~0.43B: a 262144 x 2816 embedding alone would be 0.74B


def test_a_wrong_layer_count_is_refused(rs: ModuleType, sm: ModuleType) -> None:
    tc = rs.text_config()
    tc["num_hidden_layers"] = 29
    with pytest.raises(ValueError, match="layer_types has 30 entries"):
        sm.text_params(tc)


# --------------------------------------------------------------------------------------------------------------
# the count against transformers' own modules (meta device: shapes only, no memory)
# --------------------------------------------------------------------------------------------------------------
def _transformers_count(module: Any, buffers: tuple[str, ...]) -> int:
    n = sum(int(p.numel()) for p in module.parameters())
    return n + sum(int(b.numel()) for name, b in module.named_buffers() if name.rsplit(".", 1)[-1] in buffers)


def _as_published(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as the published file has it: no per_layer_config null (that is our vLLM 0.21.0 workaround),
    so transformers derives the full layers' 512 x 2 geometry itself."""
    out: dict[str, Any] = json.loads(json.dumps(cfg))
    out["text_config"].pop("per_layer_config")
    for k in ("architectures", "model_type", "transformers_version"):
        out.pop(k, None)
    return out


def test_count_equals_transformers_gemma4(rs: ModuleType, sm: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Gemma4Config"):
        pytest.skip(f"transformers {transformers.__version__} has no Gemma 4")
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForConditionalGeneration

    cfg = transformers.Gemma4Config(**_as_published(rs.target_config()))
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(cfg)
    ours = sm.target_params(rs.target_config())
    lm = model.model.language_model
    assert _transformers_count(lm, ("layer_scalar",)) == ours["text"].total
    vision = _transformers_count(model.model.vision_tower, ("std_bias", "std_scale"))
    assert vision + _transformers_count(model.model.embed_vision, ()) == ours["vision"].total
    full = lm.layers[5].self_attn
    assert (full.q_proj.out_features, full.k_proj.out_features, full.v_proj) == (16 * 512, 2 * 512, None)


def test_count_equals_transformers_assistant_and_qwen3(rs: ModuleType, sm: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Gemma4AssistantConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no gemma4_assistant")
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

    for make in (rs.mtp_config, rs.mtp_standin_config):
        cfg = transformers.Gemma4AssistantConfig(**_as_published(make()))
        with torch.device("meta"):
            model = Gemma4AssistantForCausalLM(cfg)
        # lm_head is tied to the embedding: parameters() yields the shared tensor once
        assert _transformers_count(model, ("layer_scalar",)) == sm.mtp_params(make()).total, make.__name__
    d = rs.dflash_config()
    qcfg = transformers.Qwen3Config(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        qwen = transformers.Qwen3Model(qcfg)
    layers = sum(p.numel() for p in qwen.layers.parameters())
    assert layers == sm.dflash_params(d).parts["layers"]


# --------------------------------------------------------------------------------------------------------------
# KV cache: hand-computed
# --------------------------------------------------------------------------------------------------------------
def test_kv_bytes_of_the_target_by_hand(rs: ModuleType, sm: ModuleType) -> None:
    layers = sm.kv_layers(rs.text_config())
    sliding = 2 * 8 * 256 * 2  # K and V, 8 heads of 256, bf16: 8192 bytes per token per sliding layer
    full = 2 * 2 * 512 * 2  # 2 heads of 512: 4096 bytes per token per full layer
    assert sm.kv_bytes_per_token(layers, 1) == 25 * sliding + 5 * full == 225_280  # 220 KiB
    assert sm.kv_bytes_per_token(layers, 1024) == 225_280  # every token still inside the window
    # past the window the 25 sliding layers stop growing at 1024 tokens; the 5 full ones do not
    assert sm.kv_cache_bytes(layers, 4096) == 25 * sliding * 1024 + 5 * full * 4096 == 293_601_280
    assert sm.kv_bytes_per_token(layers, 4096) == 71_680
    assert sm.kv_cache_bytes(layers, 131_072) == 209_715_200 + 2_684_354_560
    assert sm.kv_cache_bytes(layers, 131_072, dtype_bytes=1) == (209_715_200 + 2_684_354_560) // 2


def test_kv_bytes_of_the_tiny_target_and_the_drafters_by_hand(rs: ModuleType, sm: ModuleType) -> None:
    tiny = _load("tiny_models")
    layers = sm.kv_layers(tiny.text_config())  # S, F, S, F; 1 KV head; 256 / 512; window 128
    assert sm.kv_cache_bytes(layers, 100) == 2 * (2 * 256 * 2 * 100) + 2 * (2 * 512 * 2 * 100) == 614_400
    assert sm.kv_cache_bytes(layers, 1000) == 2 * (2 * 256 * 2 * 128) + 2 * (2 * 512 * 2 * 1000) == 4_358_144
    dflash = sm.kv_layers(rs.dflash_config())  # 4 sliding (window 2048) + 1 full, 8 heads of 128
    assert sm.kv_cache_bytes(dflash, 4096) == 4 * (4096 * 2048) + 4096 * 4096 == 50_331_648
    assert sm.kv_layers(rs.mtp_config()["text_config"]) == []  # every layer reads the target's cache
    with pytest.raises(ValueError, match="context_tokens 0"):
        sm.kv_bytes_per_token(layers, 0)


# --------------------------------------------------------------------------------------------------------------
# the folders
# --------------------------------------------------------------------------------------------------------------
def test_written_folders_load_with_transformers(rs: ModuleType, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoTokenizer

    assert rs.main([str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["published"]["mtp_params"] == 419_711_236 and meta["not_published"]
    cfg = AutoConfig.from_pretrained(tmp_path / "target")
    text = cfg.text_config
    assert (text.hidden_size, text.num_experts, text.top_k_experts, text.sliding_window) == (2816, 128, 8, 1024)
    # transformers drops what the overrides put back (vLLM reads both as attributes of text_config)
    for key, value in meta["target_hf_overrides"]["text_config"].items():
        setattr(text, key, value)
    assert (text.global_head_dim, text.num_global_key_value_heads, text.head_dim) == (512, 2, 256)
    assert AutoConfig.from_pretrained(tmp_path / "dflash").sliding_window == 2048
    if "gemma4_assistant" in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        for name in ("mtp", "mtp-standin"):
            assert AutoConfig.from_pretrained(tmp_path / name).backbone_hidden_size == 2816
    tok = AutoTokenizer.from_pretrained(tmp_path / "target")
    assert len(tok) == 262_144  # every id a random-weights model samples decodes
    assert tok("w20 <|image|> w262143").input_ids == [2, 20, 5, 262_143]
