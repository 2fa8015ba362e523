"""Runs inside vLLM 0.29.0's source tree (PYTHONPATH=<tree>) and prints one JSON line: the tokens a prompt sent a
second time reads back from the prefix cache, by 0.29.0's own KVCacheManager, for Gemma 4 26B-A4B's two KV kinds
(full attention, block 32 after page-size unification; sliding window 1024, block 16), with and without an
EAGLE-family drafter (use_eagle), under prefix_cache_retention_interval 0 (0.29.0's default), None (dense), the
scheduler block size, and 1024; and what 0.29.0's command line reads "None" as.

Usage: python prefix_retention_probe.py [26b|tiny]"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import replace

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request

init_none_hash(sha256)
# (full block, sliding block, window, sliding groups): 26B-A4B (pages 2x512 < 8x256: full blocks doubled) and the
# GPU run's tiny target (1 KV head, 512 > 256: sliding blocks doubled; window 128; 2 + 2 layers)
SHAPES = {"26b": (32, 16, 1024, 5), "tiny": (16, 32, 128, 1)}
full_block, sliding_block, window, sliding_groups = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "26b"]
FULL = FullAttentionSpec(block_size=full_block, num_kv_heads=2, head_size=512, dtype=torch.bfloat16)
SLIDING = SlidingWindowSpec(block_size=sliding_block, num_kv_heads=8, head_size=256, dtype=torch.bfloat16,
                            sliding_window=window)
GROUPS = [KVCacheGroupSpec(["full"], FULL)] + [KVCacheGroupSpec([f"sliding.{g}"], SLIDING)
                                               for g in range(sliding_groups)]
SCHEDULER = math.lcm(*(g.kv_cache_spec.block_size for g in GROUPS))
HASH = math.gcd(*(g.kv_cache_spec.block_size for g in GROUPS))
LENGTHS = [101, 220, 339, 458, 577, 696, 815, 934, 1053, 1172, 1291, 1410]


def request(rid: str, tokens: list[int]) -> Request:
    params = SamplingParams(max_tokens=17)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(request_id=rid, prompt_token_ids=tokens, mm_features=None, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(HASH, sha256))


def hit(retention: int | None, eagle: bool, length: int) -> int:
    config = KVCacheConfig(num_blocks=4096, kv_cache_tensors=[], kv_cache_groups=GROUPS)
    config = replace(config, prefix_cache_retention_interval=retention)
    manager = KVCacheManager(config, max_model_len=8192, scheduler_block_size=SCHEDULER, hash_block_size=HASH,
                             enable_caching=True, use_eagle=eagle)
    tokens = [(7 * i + length) % 251 for i in range(length)]
    cold = request("cold", tokens)  # prefilled whole, cached, finished
    blocks, computed, *_ = manager.get_computed_blocks(cold)
    assert manager.allocate_slots(cold, length - computed, computed, blocks) is not None
    cold.num_computed_tokens = length
    manager.free(cold)
    manager.new_step_starts()
    again = request("again", tokens)
    _, computed, *_ = manager.get_computed_blocks(again)
    return int(computed)


facts = {"scheduler_block_size": SCHEDULER, "hash_block_size": HASH, "lengths": LENGTHS}
for label, retention in (("0", 0), ("None", None), ("scheduler", SCHEDULER), ("1024", 1024)):
    for eagle in (False, True):
        facts[f"{label}-{'eagle' if eagle else 'target'}"] = [hit(retention, eagle, n) for n in LENGTHS]
# what the rendered option's text becomes on 0.29.0's command line: get_kwargs gives an `int | None` field the type
# optional_type(int), which reads "None" as None
from vllm.engine.arg_utils import EngineArgs, optional_type  # noqa: E402

field = next(f for f in dataclasses.fields(EngineArgs) if f.name == "prefix_cache_retention_interval")
facts["annotation"] = str(field.type)
facts["cli"] = {text: optional_type(int)(text) for text in ("None", "32")}
print("PREFIX_RETENTION " + json.dumps(facts))
