"""The rule for a DFlash drafter's layers in vLLM 0.21.0's KV cache groups: with the series, every draft layer has a
full-attention KV spec of the drafter's own geometry, and the V1 proposer requires all of them in one KV cache group.

0.21.0's hybrid grouping (``_get_kv_cache_groups_uniform_page_size``) gives every group the same number of layers:
the smallest layer count among the KV kinds (the largest, when it is under 1.5 times the smallest), and splits each
kind into ``ceil(count / size)`` groups, padding the last. Beside Gemma 4 26B-A4B (25 sliding + 5 full layers) a
drafter of more than 5 layers is split over two groups and stops at startup; a drafter of fewer layers shrinks the
group size for everyone (1 layer: 31 groups, 2: 17, 3: 12) and adds padding layers. A drafter whose spec equals
the target's full-attention layers' (same KV heads and head size) is no kind of its own: vLLM groups layers by
spec, so its layers join that kind, which is then split as one (strided: layer i to group i % groups), and the
draft layers stay in one group only when the joined kind fits one group. Pure, like every rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from g4build.recipes.findings import CheckContext, Finding
from g4build.recipes.model import Recipe

GROUPING_PIN = "vllm-0.21.0"  # later pins' V1 refuses mixed drafters; their V2 groups draft layers itself
SPLIT_FACTOR = 1.5  # 0.21.0: use the largest count as the group size when it is under 1.5 x the smallest


@dataclass(frozen=True)
class Grouping:
    size: int  # layers per KV cache group
    groups: tuple[int, ...]  # groups per kind, in the order given

    @property
    def total(self) -> int:
        return sum(self.groups)


def kv_groups(layer_counts: Sequence[int]) -> Grouping:
    """How 0.21.0 groups KV kinds of these layer counts (each count > 0)."""
    lo, hi = min(layer_counts), max(layer_counts)
    size = hi if hi < lo * SPLIT_FACTOR else lo
    return Grouping(size=size, groups=tuple(math.ceil(n / size) for n in layer_counts))


def _same_spec_as_full(ctx: CheckContext) -> bool:
    """With the series every draft layer has a full-attention spec of the drafter's KV heads and head_dim (its
    sliding layers included); the same as the target's full layers' spec makes them one kind."""
    assert ctx.target is not None and ctx.target.kv is not None and ctx.drafter is not None
    assert ctx.drafter.kv is not None
    draft = ctx.drafter.kv
    heads = draft.full_kv_heads if draft.full_layers else draft.sliding_kv_heads
    head_dim = ctx.drafter.head_dim or (draft.full_head_dim if draft.full_layers else draft.sliding_head_dim)
    return (heads, head_dim) == (ctx.target.kv.full_kv_heads, ctx.target.kv.full_head_dim)


def _joined(ctx: CheckContext, target: list[int], draft: int) -> list[Finding]:
    """The drafter's layers counted with the target's full layers (the last kind of ``target``)."""
    assert ctx.drafter is not None
    alone, beside = kv_groups(target), kv_groups([*target[:-1], target[-1] + draft])
    if beside.groups[-1] > 1 and draft > 1:
        return [Finding(rule="draft-groups", severity="error",
                        message=f"on {GROUPING_PIN} the drafter's {draft} layers ({ctx.drafter.path}) have the same KV "
                                f"spec as the target's {target[-1]} full-attention layers, so they join them: "
                                f"{target[-1] + draft} layers in {beside.groups[-1]} KV cache groups of {beside.size} "
                                "(each layer to group i % groups) split the drafter, and the V1 proposer requires "
                                "one group and stops at startup",
                        hint=f"use a drafter of another KV geometry (it gets a group of its own) or of one layer "
                             f"on {GROUPING_PIN}, or a later pin")]
    padding = sum(g * beside.size for g in beside.groups) - sum(target) - draft
    if padding > sum(g * alone.size for g in alone.groups) - sum(target) or beside.total > alone.total:
        return [Finding(rule="draft-groups", severity="warning",
                        message=f"on {GROUPING_PIN} the drafter's {draft} layers join the target's full-attention "
                                f"layers (same KV spec): {beside.total} KV cache groups of {beside.size} layers "
                                f"(the target alone: {alone.total} of {alone.size}), with {padding} padding layers",
                        hint="KV memory and step time lost; a drafter of another KV geometry keeps its own group")]
    return []


def rule_draft_groups(recipe: Recipe, ctx: CheckContext) -> list[Finding]:
    if recipe.method != "dflash" or ctx.pin is None or ctx.pin.name != GROUPING_PIN:
        return []
    if ctx.target is None or ctx.target.kv is None or ctx.drafter is None or ctx.drafter.kv is None:
        return []
    kv = ctx.target.kv
    target = [n for n in (kv.sliding_layers, kv.full_layers) if n > 0]
    draft = ctx.drafter.kv.full_layers + ctx.drafter.kv.sliding_layers
    if not target or draft <= 0:
        return []
    if kv.full_layers > 0 and _same_spec_as_full(ctx):
        return _joined(ctx, target, draft)
    alone, beside = kv_groups(target), kv_groups([*target, draft])
    if beside.groups[-1] > 1:
        return [Finding(rule="draft-groups", severity="error",
                        message=f"on {GROUPING_PIN} the drafter's {draft} layers ({ctx.drafter.path}) are split over "
                                f"{beside.groups[-1]} KV cache groups of {beside.size} layers (the target's layers "
                                f"{'+'.join(map(str, target))} set the size): the V1 proposer requires one group "
                                "and stops at startup",
                        hint=f"use a drafter of at most {alone.size} layers on {GROUPING_PIN} (the published "
                             "Gemma 4 drafters have 5), or a later pin")]
    if beside.size < alone.size:
        padding = sum(g * beside.size for g in beside.groups) - sum(target) - draft
        return [Finding(rule="draft-groups", severity="warning",
                        message=f"on {GROUPING_PIN} the drafter's {draft} layers shrink the KV cache groups to "
                                f"{beside.size} layers each: {beside.total} groups instead of {alone.total + 1}, "
                                f"with {padding} padding layers (KV memory and step time lost)",
                        hint=f"a drafter of {alone.size} layers fits the target's grouping exactly")]
    return []
