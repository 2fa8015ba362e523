"""Draft block tables kept at the CUDA-graph padded request count (24 rows) reach FlashAttention cut to the real
request count (17), through the patched proposers' own metadata code.

The proposer modules are the patched files, loaded with stand-ins for their vLLM imports (tests/integration/
series_dflash/dflash_stubs.py); CommonAttentionMetadata is the tree's real class. The metadata builder passes the
block table and query_start_loc through as FlashAttention's builder does, and the FlashAttention call is a recorder
that checks the block table the way flash_attn_varlen_func does."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.integration.series_dflash.dflash_stubs import auto_stub, patched_modules

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


def _cad(backend_module: Any, block_table: torch.Tensor, slot_mapping: torch.Tensor) -> Any:
    """Unpadded draft metadata for 17 requests of 1 + NUM_SPEC query tokens (what DFlash hands its builders)."""
    q = 1 + NUM_SPEC
    qsl = torch.arange(NUM_REQS + 1, dtype=torch.int32) * q
    return backend_module.CommonAttentionMetadata(
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


GEMMA4 = ["vllm.v1.attention.backend", "vllm.v1.spec_decode.gemma4"]


def _gemma4_build(tree: Path) -> list[FlashAttentionRecorder]:
    with patched_modules(tree, GEMMA4, {"vllm.v1.worker.utils.AttentionGroup": StandInAttentionGroup}) as mods:
        proposer_cls = mods["vllm.v1.spec_decode.gemma4"].Gemma4Proposer
        proposer = proposer_cls.__new__(proposer_cls)
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
        cad = _cad(mods["vllm.v1.attention.backend"], tables[0][:NUM_REQS], torch.zeros(NUM_REQS * 4))
        proposer.build_per_group_and_layer_attn_metadata(cad)
        return [g.fa for g in proposer.draft_attn_groups]


def test_gemma4_mtp_draft_tables_cut_to_real_requests(patched: Path) -> None:
    recorders = _gemma4_build(patched)
    tables = _padded_tables()
    for gid, fa in enumerate(recorders):
        (call,) = fa.calls
        assert tuple(call["block_table"].shape) == (NUM_REQS, MAX_BLOCKS)
        assert torch.equal(call["block_table"], tables[gid][:NUM_REQS])


def test_unpatched_gemma4_mtp_hands_padded_table_to_flash_attention(pristine_021: Path) -> None:
    """Negative control: 0.21.0 as released passes the 24-row table with 17 requests, and FlashAttention refuses."""
    with pytest.raises(RuntimeError, match=r"block_table must have shape"):
        _gemma4_build(pristine_021)


class BaseProposerStandIn:
    """SpecDecodeBaseProposer, as far as the DFlash metadata path uses it: one slot buffer for all layers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def _get_slot_mapping(self, num_tokens: int, slot_mapping: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        view = self._slot_mapping_buffer[:num_tokens]  # type: ignore[attr-defined]
        return {name: view for name in self._draft_attn_layer_names}  # type: ignore[attr-defined]


class _Backend:
    def __init__(self, name: str) -> None:
        self.name = name

    def full_cls_name(self) -> str:
        return self.name


class _DraftLayer:
    def get_attn_backend(self) -> _Backend:
        return _Backend("FLASH_ATTN")


def test_dflash_sliding_and_full_groups_get_their_own_cut_tables(patched_021: Path) -> None:
    """0.21.0's backported multi-group DFlash: a Gemma 4 style drafter (layers 0, 2 sliding and causal; 1, 3 full
    and non-causal) in two KV cache groups gets one metadata per group, each with its own block table cut to the
    17 real requests, its own query slots, and its own causality."""
    names = [f"model.layers.{60 + i}.self_attn.attn" for i in range(4)]
    sliding = {names[0], names[2]}
    layers = {name: _DraftLayer() for name in names}
    overrides = {
        "vllm.v1.worker.utils.AttentionGroup": StandInAttentionGroup,
        "vllm.config.get_layers_from_vllm_config": lambda vllm_config, layer_type, layer_names=None: layers,
        "vllm.v1.spec_decode.utils.PADDING_SLOT_ID": -1,
        "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer": BaseProposerStandIn,
        "vllm.v1.kv_cache_interface.UniformTypeKVCacheSpecs": auto_stub("UniformTypeKVCacheSpecs"),
    }
    real = ["vllm.v1.attention.backend", "vllm.v1.spec_decode.dflash"]
    with patched_modules(patched_021, real, overrides) as mods:
        proposer_cls = mods["vllm.v1.spec_decode.dflash"].DFlashProposer
        proposer = proposer_cls.__new__(proposer_cls)
        # What SpecDecodeBaseProposer.__init__ would have set; the real DFlashProposer.__init__ runs below.
        proposer.max_batch_size, proposer.num_speculative_tokens, proposer.max_num_tokens = PADDED_REQS, NUM_SPEC, 256
        spec_config = types.SimpleNamespace(method="dflash")
        proposer_cls.__init__(proposer, types.SimpleNamespace(speculative_config=spec_config), torch.device("cpu"))
        proposer.vllm_config, proposer.device = None, torch.device("cpu")
        proposer._draft_attn_layer_names = set(names)
        proposer.model = types.SimpleNamespace(
            get_draft_kv_cache_layer_names=lambda: names,
            get_draft_attn_causal=lambda: [n in sliding for n in names],
        )
        spec = types.SimpleNamespace(block_size=16)
        kv_cache_config = types.SimpleNamespace(
            kv_cache_groups=[
                types.SimpleNamespace(
                    layer_names=["model.layers.0.attn", *sorted(set(names) - sliding)], kv_cache_spec=spec
                ),
                types.SimpleNamespace(layer_names=["model.layers.1.attn", *sorted(sliding)], kv_cache_spec=spec),
            ]
        )
        proposer.initialize_attn_backend(kv_cache_config)
        assert proposer.kv_cache_gid == 0, "the runner must hand DFlash the full-attention group's metadata"

        tables = _padded_tables()
        for gid, table in tables.items():
            proposer.set_per_group_block_table(gid, table)
        q_total = NUM_REQS * (1 + NUM_SPEC)
        proposer._extra_query_slots[1][:q_total] = 7  # as the kernel would have written the sliding group's slots
        cad = _cad(mods["vllm.v1.attention.backend"], tables[0][:NUM_REQS], proposer._slot_mapping_buffer[:q_total])
        _, per_layer = proposer.build_per_group_and_layer_attn_metadata(cad)

        by_gid = {g.kv_cache_group_id: g for g in proposer.draft_attn_groups}
        assert set(by_gid) == {0, 1}
        for gid, group in by_gid.items():
            (call,) = group.fa.calls
            assert tuple(call["block_table"].shape) == (NUM_REQS, MAX_BLOCKS)
            assert torch.equal(call["block_table"], tables[gid][:NUM_REQS])
            assert call["causal"] is (gid == 1)
        assert set(per_layer) == set(names)
        assert all(per_layer[n].causal for n in sliding)
        assert not any(per_layer[n].causal for n in set(names) - sliding)
        assert bool((per_layer[names[0]].slot_mapping == 7).all()), "the sliding group must use its own slots"
        assert per_layer[names[1]].slot_mapping.data_ptr() == proposer._slot_mapping_buffer.data_ptr()
        # The forward pass's per-layer slot mappings follow the same split.
        slots = proposer._get_slot_mapping(q_total)
        assert bool((slots[names[2]] == 7).all())
        assert slots[names[3]].data_ptr() == proposer._slot_mapping_buffer.data_ptr()
