"""Run inside a patched vLLM tree (0.26.0 on; PYTHONPATH=<tree>): the tree's own FlashAttentionMetadataBuilder for
two KV groups of one step (FA2, as SM120 has), built on CPU from one CommonAttentionMetadata with image ranges. Prints
one JSON line: whether the groups share the rows and the calls cache, how often rows were placed, what a step
without prefill rows places, and what a step without seq_lens_cpu_upper_bound does.

Usage: python builder_step_probe.py TARGET_DIR"""

from __future__ import annotations

import json
import sys

import torch
import vllm.utils.torch_utils as torch_utils
from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import flash_attn, mm_prefix_fa
from vllm.v1.kv_cache_interface import SlidingWindowSpec

torch_utils.PIN_MEMORY = False  # no pinned memory allocator on a CPU machine
if hasattr(flash_attn, "PIN_MEMORY"):
    flash_attn.PIN_MEMORY = False
flash_attn.is_flash_attn_varlen_func_available = lambda: True
flash_attn.is_fa_version_supported = lambda version: version != 4
flash_attn.get_flash_attn_version = lambda *args, **kwargs: 2

placed = [0]
real_spans = mm_prefix_fa.mm_prefix_spans


def counted(*args: object, **kwargs: object) -> object:
    placed[0] += 1
    return real_spans(*args, **kwargs)  # type: ignore[arg-type]


mm_prefix_fa.mm_prefix_spans = counted
config = VllmConfig(model_config=ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=1024),
                    device_config=DeviceConfig(device="cpu"))
spec = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=256, dtype=torch.bfloat16, sliding_window=64)
with set_current_vllm_config(config):
    builders = [flash_attn.FlashAttentionMetadataBuilder(spec, [f"layers.{i}"], config, torch.device("cpu"))
                for i in range(2)]


def step(ranges: dict[int, list[tuple[int, int]]], query_lens: list[int], seq_lens: list[int],
         prefilling: list[bool], upper: bool = True) -> list[object]:
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=starts, query_start_loc_cpu=starts, seq_lens=seq, num_reqs=len(seq_lens),
        num_actual_tokens=sum(query_lens), max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_table_tensor=torch.zeros((len(seq_lens), 32), dtype=torch.int32),
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.long), causal=True,
        seq_lens_cpu_upper_bound=seq if upper else None, is_prefilling=torch.tensor(prefilling),
        mm_req_doc_ranges=ranges)
    with set_current_vllm_config(config):
        return [b.build(0, common) for b in builders]


facts: dict[str, object] = {}
# a prefill step: request 0 prefills its image rows, request 1 decodes after its own
metas = step({0: [(2, 30)], 1: [(0, 9)]}, [40, 1], [40, 300], [True, False])
facts["prefill"] = {
    "rows": [[s.req_idx, s.num_rows] for s in metas[0].mm_prefix_spans],
    "spans_shared": metas[0].mm_prefix_spans is metas[1].mm_prefix_spans,
    "calls_cache_shared": metas[0].mm_prefix_calls_cache is metas[1].mm_prefix_calls_cache,
    "placed": placed[0],
}
placed[0] = 0
metas = step({0: [(2, 30)], 1: [(0, 9)]}, [1, 1], [41, 301], [False, False])
facts["decode_only"] = {"rows": len(metas[0].mm_prefix_spans or []), "placed": placed[0]}
try:
    step({0: [(2, 30)]}, [40], [40], [True], upper=False)
    facts["without_upper_bound"] = "built"
except AssertionError as exc:
    facts["without_upper_bound"] = f"refused: {exc}"
print("BUILDER_STEP " + json.dumps(facts))
