"""Draft block tables kept at the CUDA-graph padded request count (24 rows) reach FlashAttention cut to the real
request count (17), through the patched proposers' own metadata code.

The proposers are the tree's own, imported for real in the tree's interpreter (tests/integration/series_dflash/
in_tree.py), CommonAttentionMetadata included. The metadata builder passes the block table and query_start_loc
through as FlashAttention's builder does, and the FlashAttention call is a recorder that checks the block table the
way flash_attn_varlen_func does."""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.in_tree import PATCHED, PRISTINE_021, Tree, scenario

pytestmark = pytest.mark.network

NUM_REQS, PADDED_REQS, NUM_SPEC, MAX_BLOCKS = 17, 24, 3, 12
FA_SHAPE_ERROR = "block_table must have shape (batch_size, max_num_blocks_per_seq)"


@dataclass
class FlashAttentionRecorder:
    """Stands in for flash_attn_varlen_func: checks block_table as FlashAttention does, records each call."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(
        self, *, cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor, causal: bool
    ) -> None:
        batch_size = cu_seqlens_q.numel() - 1
        if block_table.dim() != 2 or block_table.shape[0] != batch_size:
            raise RuntimeError(FA_SHAPE_ERROR)
        if seqused_k.shape[0] != batch_size:
            raise RuntimeError("seqused_k must have shape (batch_size)")
        self.calls.append({"block_table": block_table, "causal": causal})


class PassThroughBuilder:
    """Builds draft metadata like FlashAttention's builder (block table and query_start_loc passed through) and
    runs the attention call on it."""

    def __init__(self, fa: FlashAttentionRecorder, kv_cache_spec: Any) -> None:
        self.fa = fa
        self.kv_cache_spec = kv_cache_spec

    def build_for_drafting(self, common_attn_metadata: Any, draft_index: int = 0) -> Any:
        cm = common_attn_metadata
        self.fa(
            cu_seqlens_q=cm.query_start_loc, seqused_k=cm.seq_lens, block_table=cm.block_table_tensor, causal=cm.causal
        )
        return types.SimpleNamespace(causal=cm.causal, block_table=cm.block_table_tensor, slot_mapping=cm.slot_mapping)


@dataclass
class StandInAttentionGroup:
    """The fields and methods of vllm.v1.worker.utils.AttentionGroup that the proposers use."""

    backend: Any
    layer_names: list[str]
    kv_cache_spec: Any
    kv_cache_group_id: int
    fa: FlashAttentionRecorder = field(default_factory=FlashAttentionRecorder)
    builder: PassThroughBuilder | None = None

    def create_metadata_builders(self, vllm_config: Any, device: Any, kernel_block_size: int | None = None) -> None:
        self.builder = PassThroughBuilder(self.fa, self.kv_cache_spec)

    def get_metadata_builder(self, ubatch_id: int = 0) -> PassThroughBuilder:
        if self.builder is None:
            self.create_metadata_builders(None, None)
        assert self.builder is not None
        return self.builder

    def build_metadata_for_drafting(self, common_attn_metadata: Any, draft_index: int = 0) -> Any:
        return self.get_metadata_builder().build_for_drafting(common_attn_metadata, draft_index)


def _padded_tables() -> dict[int, torch.Tensor]:
    """Per KV cache group block tables as the runner keeps them: 24 rows, rows past 17 the null block 0."""
    tables = {}
    for gid in (0, 1):
        table = torch.zeros(PADDED_REQS, MAX_BLOCKS, dtype=torch.int32)
        table[:NUM_REQS] = torch.arange(NUM_REQS * MAX_BLOCKS, dtype=torch.int32).view(NUM_REQS, MAX_BLOCKS) + 1
        table[:NUM_REQS] += 1000 * gid
        tables[gid] = table
    return tables


def _cad(block_table: torch.Tensor, slot_mapping: torch.Tensor) -> Any:
    """Unpadded draft metadata for 17 requests of 1 + NUM_SPEC query tokens (what DFlash hands its builders), as
    the tree's own CommonAttentionMetadata."""
    backend = importlib.import_module("vllm.v1.attention.backend")
    q = 1 + NUM_SPEC
    qsl = torch.arange(NUM_REQS + 1, dtype=torch.int32) * q
    return backend.CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.full((NUM_REQS,), 40, dtype=torch.int32),
        num_reqs=NUM_REQS,
        num_actual_tokens=NUM_REQS * q,
        max_query_len=q,
        max_seq_len=40,
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
        causal=False,
    )


@scenario(PATCHED, PRISTINE_021)
def gemma4_mtp_calls(tree: Path) -> list[list[dict[str, Any]]]:
    """The FlashAttention calls of each draft group when the tree's Gemma4Proposer builds its draft metadata."""
    proposer_cls = importlib.import_module("vllm.v1.spec_decode.gemma4").Gemma4Proposer
    proposer = proposer_cls.__new__(proposer_cls)  # its __init__ allocates device buffers from a full VllmConfig
    tables = _padded_tables()
    proposer.draft_attn_groups = [
        StandInAttentionGroup(
            backend=None, layer_names=[f"draft.{gid}.attn"], kv_cache_spec=None, kv_cache_group_id=gid
        )
        for gid in (0, 1)
    ]
    proposer._per_group_block_tables = {}
    for gid, table in tables.items():
        proposer.set_per_group_block_table(gid, table)
    proposer.build_per_group_and_layer_attn_metadata(_cad(tables[0][:NUM_REQS], torch.zeros(NUM_REQS * 4)))
    return [g.fa.calls for g in proposer.draft_attn_groups]


def test_gemma4_mtp_draft_tables_cut_to_real_requests(patched: Tree) -> None:
    per_group = patched.result(gemma4_mtp_calls)
    tables = _padded_tables()
    assert len(per_group) == 2
    for gid, calls in enumerate(per_group):
        (call,) = calls
        assert tuple(call["block_table"].shape) == (NUM_REQS, MAX_BLOCKS)
        assert torch.equal(call["block_table"], tables[gid][:NUM_REQS])


def test_unpatched_gemma4_mtp_hands_padded_table_to_flash_attention(pristine_021: Tree) -> None:
    """Negative control: 0.21.0 as released passes the 24-row table with 17 requests, and FlashAttention refuses."""
    failure = pristine_021.failure(gemma4_mtp_calls)
    assert failure.type == "builtins.RuntimeError" and failure.message == FA_SHAPE_ERROR, failure.traceback

