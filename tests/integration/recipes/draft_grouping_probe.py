"""Runs inside a vLLM source tree (PYTHONPATH=<tree>) and prints one JSON line: the KV cache groups the tree's own
grouping (get_kv_cache_groups, hybrid manager on) makes of Gemma 4 26B-A4B's attention layers (25 sliding of head dim
256, 5 full of head dim 512) and a DFlash drafter of N layers, each a full-attention spec of the drafter's geometry
(as dflash-batched-verification's 0005 gives them), for N = 1..8; under "joined", the same with a drafter whose spec
equals the target's full layers' (2 KV heads, head dim 512); under "split", a target of 4 sliding + 10 full layers
and 2 draft layers of the full layers' spec.

Usage: python draft_grouping_probe.py"""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

config = SimpleNamespace(scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False))
facts = {}
for n, joined in [(n, joined) for joined in (False, True) for n in range(1, 9)]:
    specs = {}
    for i in range(30):
        name = f"language_model.model.layers.{i}.self_attn.attn"
        if i % 6 == 5:
            specs[name] = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=512, dtype=torch.bfloat16)
        else:
            specs[name] = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=256, dtype=torch.bfloat16,
                                            sliding_window=1024)
    for j in range(n):
        specs[f"model.layers.{30 + j}.self_attn.attn"] = FullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=512 if joined else 128, dtype=torch.bfloat16)
    groups = get_kv_cache_groups(config, specs)  # type: ignore[arg-type]
    facts[f"joined-{n}" if joined else str(n)] = {
        "groups": len(groups),
        "draft_groups": len([g for g in groups if any(x.startswith("model.") for x in g.layer_names)]),
        "size": max(len(g.layer_names) for g in groups),
    }
specs = {f"language_model.model.layers.{i}.self_attn.attn": SlidingWindowSpec(
    block_size=16, num_kv_heads=8, head_size=256, dtype=torch.bfloat16, sliding_window=1024) for i in range(4)}
for i in range(4, 16):  # 10 target layers, then 2 draft layers of the same spec
    name = f"language_model.model.layers.{i}.self_attn.attn" if i < 14 else f"model.layers.{i}.self_attn.attn"
    specs[name] = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=512, dtype=torch.bfloat16)
groups = get_kv_cache_groups(config, specs)  # type: ignore[arg-type]
facts["split"] = {
    "groups": len(groups),
    "draft_groups": len([g for g in groups if any(x.startswith("model.") for x in g.layer_names)]),
    "size": max(len(g.layer_names) for g in groups),
}
print("DRAFT_GROUPING " + json.dumps(facts))
