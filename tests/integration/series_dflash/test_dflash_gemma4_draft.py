"""The patched DFlash drafter (qwen3_dflash.py) on a Gemma 4 target scales its shared embeddings by sqrt(hidden_size)
and soft-caps its logits (tanh(x / c) * c) through the tree's real LogitsProcessor; on other targets nothing
changes. On 0.21.0 the backported per-layer attention resolves Gemma 4 style sliding/full layer types.

The drafter module and LogitsProcessor are the tree's own, run in the tree's interpreter with everything they import
(tests/integration/series_dflash/in_tree.py); the embedding table and LM head are small torch stand-ins for the
vocab-parallel layers and the gathers identities (tensor parallel size 1, no process group)."""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.in_tree import (
    PATCHED,
    PATCHED_021,
    PRISTINE_021,
    Tree,
    default_vllm_config,
    scenario,
    under_test,
)
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
        # an unquantised draft: the tree's own get_draft_quant_config reads quantization and load_config
        speculative_config=types.SimpleNamespace(
            draft_model_config=types.SimpleNamespace(hf_config=draft, quantization=None)
        ),
        load_config=None,
        parallel_config=None,
    )


Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@scenario(PATCHED, PRISTINE_021)
def embed_and_logits(tree: Path) -> dict[str, Tensors]:
    """Per target type: the drafter's input embeddings, the raw table rows, its logits and the raw logits."""
    out = {}
    for target_type in ("gemma4", "qwen3"):
        torch.manual_seed(0)
        # vLLM's own layers (RMSNorm is a CustomOp) read the current config
        with under_test(MODULES, OVERRIDES) as mods, default_vllm_config():
            drafter = mods["vllm.model_executor.models.qwen3_dflash"].DFlashQwen3ForCausalLM(
                vllm_config=_vllm_config(target_type)
            )
            ids = torch.randint(0, VOCAB, (9,))
            hidden = torch.randn(9, HIDDEN) * 8  # raw logits well past the cap
            out[target_type] = (
                drafter.embed_input_ids(ids),
                drafter.model.embed_tokens(ids),
                drafter.compute_logits(hidden),
                hidden @ drafter.lm_head.weight.t(),
            )
    return out


def test_gemma4_target_scales_embeddings_and_softcaps_logits(patched: Tree) -> None:
    embeds, table_rows, logits, raw = patched.result(embed_and_logits)["gemma4"]
    torch.testing.assert_close(embeds, table_rows * HIDDEN**0.5)
    torch.testing.assert_close(logits, torch.tanh(raw / SOFTCAP) * SOFTCAP)
    assert raw.abs().max() > SOFTCAP and logits.abs().max() < SOFTCAP


def test_other_targets_are_untouched(patched: Tree) -> None:
    embeds, table_rows, logits, raw = patched.result(embed_and_logits)["qwen3"]
    torch.testing.assert_close(embeds, table_rows)
    torch.testing.assert_close(logits, raw)


def test_unpatched_drafter_ignores_gemma4_normalisation(pristine_021: Tree) -> None:
    """Negative control: 0.21.0 as released hands the raw table rows and uncapped logits to a Gemma 4 target."""
    embeds, table_rows, logits, raw = pristine_021.result(embed_and_logits)["gemma4"]
    torch.testing.assert_close(embeds, table_rows)
    torch.testing.assert_close(logits, raw)
    assert raw.abs().max() > SOFTCAP


@scenario(PATCHED_021)
def layer_attention(tree: Path) -> dict[str, Any]:
    """The backported per-layer attention of 0.21.0's drafter, for several drafter configs."""
    q = importlib.import_module("vllm.model_executor.models.qwen3_dflash")
    gemma_like = types.SimpleNamespace(
        num_hidden_layers=4,
        sliding_window=512,
        dflash_config={},
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )
    all_swa = types.SimpleNamespace(num_hidden_layers=2, dflash_config={"use_swa": True, "swa_window_size": 128})
    plain = types.SimpleNamespace(num_hidden_layers=2)
    forced = types.SimpleNamespace(num_hidden_layers=1, is_causal=True, dflash_config={})
    no_window = types.SimpleNamespace(num_hidden_layers=1, dflash_config={"use_swa": True})
    try:
        q.dflash_layer_attention(no_window, 0)
        no_window_error = None
    except ValueError as exc:
        no_window_error = str(exc)
    return {
        "gemma_like": [q.dflash_layer_attention(gemma_like, i) for i in range(4)],
        "all_swa": [q.dflash_layer_attention(all_swa, i) for i in range(2)],
        "plain": [q.dflash_layer_attention(plain, i) for i in range(2)],
        "forced": q.dflash_layer_attention(forced, 0),
        "no_window_error": no_window_error,
    }


def test_backported_layer_attention_on_021(patched_021: Tree) -> None:
    got = patched_021.result(layer_attention)
    assert got["gemma_like"] == [(512, True), (None, False), (512, True), (None, False)]
    assert got["all_swa"] == [(128, False), (128, False)]
    assert got["plain"] == [(None, False), (None, False)]
    assert got["forced"] == (None, True)
    assert got["no_window_error"] is not None and "swa_window_size" in got["no_window_error"]
