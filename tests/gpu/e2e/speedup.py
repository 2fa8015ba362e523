"""The speed-up of speculative decoding from measured step costs and an acceptance curve; the k that wins.

One speculative step drafts k tokens and verifies them with the target in one pass of k + 1 positions; it emits
tau tokens per request, tau = 1 + the drafts accepted (the "mean acceptance length" vLLM reports, the bonus token
included, 1 <= tau <= k + 1). The target alone emits one token per decode step. At the same concurrency both run the
same requests, so

    speed-up(tau) = tau * target_step / spec_step(k)

(output tokens per second with the drafter over without). Random weights reject every draft, so a run with them
measures spec_step(k) at any acceptance: the cost of a step does not depend on how many drafts survive (vLLM
verifies all k either way). tau comes from elsewhere: a trained drafter's measured acceptance, or a published one.

Pure Python; tests/unit/gpu_scripts/test_speedup.py holds it to hand-computed cases and to published figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise


def speedup(tau: float, target_step_s: float, spec_step_s: float) -> float:
    if target_step_s <= 0 or spec_step_s <= 0:
        raise ValueError(f"step times {target_step_s}, {spec_step_s}: expected both > 0 seconds")
    if tau < 1:
        raise ValueError(f"tau {tau}: expected >= 1 (the verified token is always emitted)")
    return tau * target_step_s / spec_step_s


def implied_step_ratio(tau: float, published_speedup: float) -> float:
    """spec_step / target_step that a published speed-up at a published tau implies: what a measured ratio is
    checked against before the model is trusted."""
    if published_speedup <= 0 or tau < 1:
        raise ValueError(f"tau {tau}, speed-up {published_speedup}: expected tau >= 1 and a speed-up > 0")
    return tau / published_speedup


def tau_geometric(alpha: float, k: int) -> float:
    """Mean acceptance length when each draft is accepted with probability alpha given its predecessors were:
    1 + alpha + ... + alpha^k."""
    if not 0 <= alpha <= 1 or k < 0:
        raise ValueError(f"alpha {alpha}, k {k}: expected 0 <= alpha <= 1 and k >= 0")
    return float(sum(alpha ** i for i in range(k + 1)))


def tau_from_per_position(rates: list[float], k: int) -> float:
    """Mean acceptance length at k drafts from vLLM's per-position acceptance rates
    (spec_decode_num_accepted_tokens_per_pos / num_drafts: position i is accepted only if every earlier one was,
    so each rate is already the probability of reaching it). Positions past the measured ones are not guessed."""
    if k > len(rates):
        raise ValueError(f"k {k}: only {len(rates)} positions were measured; measure at k >= {k}")
    if any(b > a + 1e-9 for a, b in pairwise(rates)):
        raise ValueError(f"per-position rates {rates} rise: expected each position at most as likely as the one "
                         "before (rates from one run, divided by its num_drafts)")
    return 1.0 + sum(rates[:k])


@dataclass(frozen=True)
class StepCosts:
    """Measured at one (card, concurrency, context): the target's decode step and the speculative step per k."""
    target_s: float
    spec_s: Mapping[int, float]


@dataclass(frozen=True)
class Choice:
    k: int  # 0: the target alone beats every k measured
    speedup: float
    by_k: dict[int, float]  # every k measured, its speed-up


def best_k(costs: StepCosts, tau: Mapping[int, float] | Callable[[int], float]) -> Choice:
    """The k of the highest speed-up; the smaller k on a tie (fewer wasted drafts, less drafter memory); k = 0
    (no drafter) unless some k is faster than the target alone."""
    if not costs.spec_s:
        raise ValueError("no speculative step costs: expected at least one k measured")
    at = tau if callable(tau) else tau.__getitem__
    by_k: dict[int, float] = {}
    for k in sorted(costs.spec_s):
        t = at(k)
        if not 1 <= t <= k + 1:
            raise ValueError(f"tau {t} at k {k}: expected 1 <= tau <= k + 1")
        by_k[k] = speedup(t, costs.target_s, costs.spec_s[k])
    k_best, s_best = 0, 1.0
    for k, s in by_k.items():
        if s > s_best:
            k_best, s_best = k, s
    return Choice(k=k_best, speedup=s_best, by_k=by_k)


def best_k_table(table: Mapping[tuple[str, int], StepCosts],
                 tau: Mapping[int, float] | Callable[[int], float]) -> dict[tuple[str, int], Choice]:
    """best_k for every (card, concurrency) measured, with one acceptance curve (acceptance depends on the
    drafter and the text, not on the card or the batch)."""
    return {key: best_k(costs, tau) for key, costs in sorted(table.items())}
