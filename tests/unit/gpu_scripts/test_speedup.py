"""The speed-up model (tests/gpu/e2e/speedup.py): speed-up(tau) = tau x target step / speculative step, acceptance
curves, and the k that wins per (card, concurrency), on hand-computed cases and published figures."""

from __future__ import annotations

from types import ModuleType

import pytest

from .test_acceptance import _load


@pytest.fixture(scope="module")
def su() -> ModuleType:
    return _load("speedup")


def test_speedup_by_hand(su: ModuleType) -> None:
    assert su.speedup(1.0, 0.010, 0.010) == 1.0  # nothing accepted, a step as cheap as the target's: no gain
    assert su.speedup(4.0, 0.010, 0.020) == 2.0
    assert su.speedup(1.0, 0.010, 0.020) == 0.5  # random weights: every draft rejected, the step twice as dear
    with pytest.raises(ValueError, match=r"tau 0\.5"):
        su.speedup(0.5, 0.01, 0.01)
    with pytest.raises(ValueError, match="expected both > 0"):
        su.speedup(2.0, 0.0, 0.01)


def test_published_mtp_figure_implies_a_step_ratio(su: ModuleType) -> None:
    # Published for Gemma 4 MTP: acceptance length 3.68 with 4 drafts, 2.34x sequential speed-up.
    ratio = su.implied_step_ratio(3.68, 2.34)
    assert ratio == pytest.approx(1.5726, abs=1e-4)
    assert su.speedup(3.68, 1.0, ratio) == pytest.approx(2.34)  # the model reproduces the figure it came from


def test_acceptance_curves_by_hand(su: ModuleType) -> None:
    assert su.tau_geometric(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert su.tau_geometric(1.0, 15) == 16.0 and su.tau_geometric(0.0, 15) == 1.0
    assert su.tau_from_per_position([0.9, 0.7, 0.4], 2) == pytest.approx(2.6)
    assert su.tau_from_per_position([0.9, 0.7, 0.4], 0) == 1.0
    with pytest.raises(ValueError, match="only 3 positions were measured"):
        su.tau_from_per_position([0.9, 0.7, 0.4], 4)
    with pytest.raises(ValueError, match="rise"):
        su.tau_from_per_position([0.5, 0.7], 2)  # counts of one run divided by another's drafts


def test_best_k_is_the_middle_one_when_long_drafts_cost_more_than_they_bring(su: ModuleType) -> None:
    # A laptop-like card: verifying 16 positions costs three target steps; at 80% per-token acceptance the
    # tail of a 15-token draft is rarely reached (the published laptop result: k = 8 beat k = 15).
    costs = su.StepCosts(target_s=0.010, spec_s={3: 0.014, 8: 0.020, 15: 0.030})
    choice = su.best_k(costs, lambda k: su.tau_geometric(0.8, k))
    assert choice.k == 8
    assert choice.by_k[3] == pytest.approx(2.952 * 10 / 14)
    assert choice.by_k[8] == pytest.approx((1 - 0.8 ** 9) / 0.2 * 10 / 20)
    assert choice.by_k[15] == pytest.approx((1 - 0.8 ** 16) / 0.2 * 10 / 30)
    assert choice.speedup == choice.by_k[8]


def test_best_k_is_none_when_no_k_beats_the_target(su: ModuleType) -> None:
    choice = su.best_k(su.StepCosts(0.010, {2: 0.030, 4: 0.050}), {2: 2.0, 4: 3.0})
    assert (choice.k, choice.speedup) == (0, 1.0)
    assert choice.by_k == {2: pytest.approx(2 / 3), 4: pytest.approx(0.6)}


def test_best_k_prefers_the_smaller_k_on_a_tie(su: ModuleType) -> None:
    choice = su.best_k(su.StepCosts(0.020, {4: 0.040, 2: 0.020}), {2: 2.0, 4: 4.0})
    assert choice.k == 2 and choice.by_k == {2: 2.0, 4: 2.0}


def test_best_k_refuses_impossible_acceptance(su: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"tau 4\.5 at k 3"):
        su.best_k(su.StepCosts(0.01, {3: 0.02}), {3: 4.5})
    with pytest.raises(ValueError, match="no speculative step costs"):
        su.best_k(su.StepCosts(0.01, {}), {})


def test_best_k_table_per_card_and_concurrency(su: ModuleType) -> None:
    tau = {2: 2.5, 4: 3.5}
    table = {
        ("rtx5090", 1): su.StepCosts(0.010, {2: 0.012, 4: 0.014}),  # batch 1: verification nearly free
        ("rtx5090", 22): su.StepCosts(0.020, {2: 0.040, 4: 0.075}),  # batch 22: compute bound, drafts cost
    }
    out = su.best_k_table(table, tau)
    assert list(out) == [("rtx5090", 1), ("rtx5090", 22)]
    assert out[("rtx5090", 1)].k == 4 and out[("rtx5090", 1)].speedup == pytest.approx(3.5 * 10 / 14)
    assert out[("rtx5090", 22)].k == 2 and out[("rtx5090", 22)].speedup == pytest.approx(2.5 * 20 / 40)
