"""The patched DFlash drafter (qwen3_dflash.py) on a Gemma 4 target scales its shared embeddings by sqrt(hidden_size)
and soft-caps its logits (tanh(x / c) * c) through the tree's real LogitsProcessor; on other targets nothing
changes. On 0.21.0 the backported per-layer attention resolves Gemma 4 style sliding/full layer types.

The drafter module and LogitsProcessor are the patched tree's files; the embedding table and LM head are small
torch stand-ins for the vocab-parallel layers (tensor parallel size 1)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.dflash_stubs import patched_modules
from torch import nn

pytestmark = pytest.mark.network

VOCAB, HIDDEN, SOFTCAP = 64, 32, 30.0
MODULES = ["vllm.model_executor.layers.logits_processor", "vllm.model_executor.models.qwen3_dflash"]


class Embedding(nn.Embedding):
    """VocabParallelEmbedding at tensor parallel size 1."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(num_embeddings, embedding_dim)


class LMHead(nn.Module):
    """ParallelLMHead at tensor parallel size 1: logits = hidden @ weight.T through its quant method."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_embeddings, embedding_dim), requires_grad=False)
        self.tp_size = 1
        self.quant_method = types.SimpleNamespace(apply=lambda layer, x, bias=None: x @ layer.weight.t())


class PluggableLayer(nn.Module):
    @classmethod
    def register(cls, name: str) -> Any:
        return lambda layer_cls: layer_cls


def _identity(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


OVERRIDES = {
    "vllm.compilation.decorators.support_torch_compile": _identity,
    "vllm.model_executor.layers.vocab_parallel_embedding.VocabParallelEmbedding": Embedding,
    "vllm.model_executor.layers.vocab_parallel_embedding.ParallelLMHead": LMHead,
    "vllm.model_executor.custom_op.PluggableLayer": PluggableLayer,
    "vllm.model_executor.models.qwen3.Qwen3ForCausalLM": nn.Module,
    "vllm.distributed.tensor_model_parallel_gather": _identity,
    "vllm.distributed.tensor_model_parallel_all_gather": _identity,
    "vllm.config.get_current_vllm_config": lambda: types.SimpleNamespace(model_config=None),
}


def _vllm_config(target_type: str) -> Any:
    """Target model config (Gemma 4 or Qwen3) plus a zero-layer DFlash draft config: only embeddings and head."""
    text = types.SimpleNamespace(
        model_type=f"{target_type}_text" if target_type == "gemma4" else target_type,
        hidden_size=HIDDEN,
        final_logit_softcapping=SOFTCAP if target_type == "gemma4" else None,
    )
    draft = types.SimpleNamespace(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=0,
        rms_norm_eps=1e-6,
        dflash_config={"use_aux_hidden_state": False},
        eagle_config={},
    )

    class TargetModelConfig:
        hf_config = types.SimpleNamespace(model_type=target_type)
        hf_text_config = text
        dtype = torch.float32

        def get_num_layers(self, parallel_config: Any) -> int:
            return 4

        def get_total_num_hidden_layers(self) -> int:
            return 4

        def get_vocab_size(self) -> int:
            return VOCAB

    return types.SimpleNamespace(
        model_config=TargetModelConfig(),
        speculative_config=types.SimpleNamespace(draft_model_config=types.SimpleNamespace(hf_config=draft)),
        parallel_config=None,
    )


def _embed_and_logits(tree: Path, target_type: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    with patched_modules(tree, MODULES, OVERRIDES) as mods:
        drafter = mods["vllm.model_executor.models.qwen3_dflash"].DFlashQwen3ForCausalLM(
            vllm_config=_vllm_config(target_type)
        )
        ids = torch.randint(0, VOCAB, (9,))
        hidden = torch.randn(9, HIDDEN) * 8  # raw logits well past the cap
        return (
            drafter.embed_input_ids(ids),
            drafter.model.embed_tokens(ids),
            drafter.compute_logits(hidden),
            hidden @ drafter.lm_head.weight.t(),
        )


def test_gemma4_target_scales_embeddings_and_softcaps_logits(patched: Path) -> None:
    embeds, table_rows, logits, raw = _embed_and_logits(patched, "gemma4")
    torch.testing.assert_close(embeds, table_rows * HIDDEN**0.5)
    torch.testing.assert_close(logits, torch.tanh(raw / SOFTCAP) * SOFTCAP)
    assert raw.abs().max() > SOFTCAP and logits.abs().max() < SOFTCAP


def test_other_targets_are_untouched(patched: Path) -> None:
    embeds, table_rows, logits, raw = _embed_and_logits(patched, "qwen3")
    torch.testing.assert_close(embeds, table_rows)
    torch.testing.assert_close(logits, raw)


def test_unpatched_drafter_ignores_gemma4_normalisation(pristine_021: Path) -> None:
    """Negative control: 0.21.0 as released hands the raw table rows and uncapped logits to a Gemma 4 target."""
    embeds, table_rows, logits, raw = _embed_and_logits(pristine_021, "gemma4")
    torch.testing.assert_close(embeds, table_rows)
    torch.testing.assert_close(logits, raw)


def test_backported_layer_attention_on_021(patched_021: Path) -> None:
    with patched_modules(patched_021, MODULES[1:], OVERRIDES) as mods:
        q = mods["vllm.model_executor.models.qwen3_dflash"]
        gemma_like = types.SimpleNamespace(
            num_hidden_layers=4,
            sliding_window=512,
            dflash_config={},
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        )
        assert [q.dflash_layer_attention(gemma_like, i) for i in range(4)] == [
            (512, True),
            (None, False),
            (512, True),
            (None, False),
        ]
        all_swa = types.SimpleNamespace(num_hidden_layers=2, dflash_config={"use_swa": True, "swa_window_size": 128})
        assert [q.dflash_layer_attention(all_swa, i) for i in range(2)] == [(128, False), (128, False)]
        plain = types.SimpleNamespace(num_hidden_layers=2)
        assert [q.dflash_layer_attention(plain, i) for i in range(2)] == [(None, False), (None, False)]
        forced = types.SimpleNamespace(num_hidden_layers=1, is_causal=True, dflash_config={})
        assert q.dflash_layer_attention(forced, 0) == (None, True)
        no_window = types.SimpleNamespace(num_hidden_layers=1, dflash_config={"use_swa": True})
        with pytest.raises(ValueError, match="swa_window_size"):
            q.dflash_layer_attention(no_window, 0)
