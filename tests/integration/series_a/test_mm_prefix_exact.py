"""mm-prefix-fa: the patched trees' own mm_prefix_fa module against a dense masked reference, their
FlashAttentionImpl.forward end to end, the text-only path unchanged, and supports_mm_prefix per head size."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytestmark = pytest.mark.network

PINS = ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"]
Facts = Callable[[str, str], dict[str, Any]]


def _exact_rows(mm: ModuleType, ref: ModuleType, batch: Any, window: int | None, clamp: bool) -> torch.Tensor:
    """The decomposition as the backend runs it: the causal call, then the mm rows replaced."""
    scale = batch.query.shape[-1] ** -0.5
    out = torch.zeros_like(batch.query)
    starts = torch.tensor(batch.query_starts, dtype=torch.int32)
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int32)
    ref.varlen_attention(
        q=batch.query,
        k=batch.key_cache,
        v=batch.value_cache,
        out=out,
        cu_seqlens_q=starts,
        max_seqlen_q=max(batch.query_lens),
        seqused_k=seq_lens,
        max_seqlen_k=max(batch.seq_lens),
        causal=True,
        window_size=[window - 1, 0] if window else [-1, -1],
        block_table=batch.block_table,
        softmax_scale=scale,
    )
    spans = mm.mm_prefix_spans(batch.ranges, starts, seq_lens)
    calls = mm.cached_mm_prefix_calls({}, spans, window, clamp, "cpu")
    mm.run_mm_prefix_calls(
        ref.varlen_attention,
        calls,
        query=batch.query,
        key_cache=batch.key_cache,
        value_cache=batch.value_cache,
        output=out,
        block_table=batch.block_table,
        softmax_scale=scale,
    )
    return out


@pytest.mark.parametrize("pin", PINS)
def test_decomposition_matches_dense_mask(attn_ref: ModuleType, mm_prefix_module: Any, pin: str) -> None:
    mm = mm_prefix_module(pin)
    rng = random.Random(20260611)
    worst, rows_in_ranges = 0.0, 0
    for trial in range(150):
        batch = attn_ref.random_batch(rng)
        window = [None, 3, 8, 17][trial % 4]
        clamp = trial % 3 == 0
        got = _exact_rows(mm, attn_ref, batch, window, clamp)
        expected = attn_ref.dense_mm_prefix(batch, window, clamp, batch.query.shape[-1] ** -0.5)
        worst = max(worst, (got - expected).abs().max().item())
        spans = mm.mm_prefix_spans(batch.ranges, torch.tensor(batch.query_starts), torch.tensor(batch.seq_lens))
        rows_in_ranges += sum(sp.num_rows for sp in spans)
    assert worst <= 1e-5
    assert rows_in_ranges > 500  # the batches exercise many mm rows, not only causal ones


def test_causal_only_would_fail_the_same_check(attn_ref: ModuleType, mm_prefix_module: Any) -> None:
    """The comparison is sensitive: without the replaced rows the output is far from the dense mask."""
    rng = random.Random(5)
    mm = mm_prefix_module("vllm-0.21.0")
    batch = attn_ref.random_batch(rng)
    while not mm.mm_prefix_spans(batch.ranges, torch.tensor(batch.query_starts), torch.tensor(batch.seq_lens)):
        batch = attn_ref.random_batch(rng)
    causal = torch.zeros_like(batch.query)
    attn_ref.varlen_attention(
        q=batch.query,
        k=batch.key_cache,
        v=batch.value_cache,
        out=causal,
        cu_seqlens_q=torch.tensor(batch.query_starts),
        max_seqlen_q=max(batch.query_lens),
        seqused_k=torch.tensor(batch.seq_lens),
        max_seqlen_k=max(batch.seq_lens),
        causal=True,
        window_size=[-1, -1],
        block_table=batch.block_table,
        softmax_scale=batch.query.shape[-1] ** -0.5,
    )
    expected = attn_ref.dense_mm_prefix(batch, None, False, batch.query.shape[-1] ** -0.5)
    assert (causal - expected).abs().max().item() > 1e-2


def test_chunk_boundaries_are_placed_exactly(mm_prefix_module: Any) -> None:
    mm = mm_prefix_module("vllm-0.21.0")
    # Request 0: chunk covers positions 10..19 (seq_len 20, 10 new tokens); range 5..14 began in the
    # previous chunk, range 18..30 runs past this chunk, range 40..50 is not reached yet.
    # Request 1: a decode at position 99, past its range.
    spans = mm.mm_prefix_spans(
        {0: [(5, 14), (18, 30), (40, 50)], 1: [(2, 9)]},
        torch.tensor([0, 10, 11]),
        torch.tensor([20, 100]),
    )
    assert [tuple(sp) for sp in spans] == [(0, 0, 10, 5, 5, 14), (0, 8, 18, 2, 18, 19)]
    groups = mm.mm_prefix_segments(spans, 4, False)
    # Range 5..14 with window 4: rows 10..14 are deeper than s + W = 9, so they see exactly [5, 14].
    assert groups[(9, 0)] == [mm.MMPrefixSegment(0, k, 1, 15) for k in range(5)]
    assert groups[(3, -1)] == [mm.MMPrefixSegment(0, 8, 2, 20)]


@pytest.mark.parametrize("pin", PINS)
def test_forward_is_exact_and_text_only_calls_are_unchanged(tree_facts: Facts, pin: str) -> None:
    patched = tree_facts(pin, "patched")["forward"]
    pristine = tree_facts(pin, "pristine")["forward"]
    assert patched["mm_max_err"] is not None and patched["mm_max_err"] <= 1e-5
    assert patched["mm_extra_calls"] > 0
    # Text-only batches: exactly the calls the unpatched forward makes (one causal call each).
    assert patched["text_only"] == pristine["text_only"]
    assert all(len(calls) == 1 and calls[0]["causal"] is True for calls in patched["text_only"])


@pytest.mark.parametrize("pin", PINS)
def test_supports_mm_prefix_follows_head_size_without_fa4(tree_facts: Facts, pin: str) -> None:
    facts = tree_facts(pin, "patched")
    assert facts["fa_supports_mm_prefix"] is True
    assert facts["fa_mm_prefix_for_head"] == {"64": True, "128": True, "256": True, "512": False}
    assert facts["fa_refuses_mm_256"] is False
    assert facts["fa_refuses_mm_512"] is True
    before = tree_facts(pin, "pristine")
    assert before["fa_supports_mm_prefix"] is False
    assert before["fa_refuses_mm_256"] is True


@pytest.mark.parametrize("pin", PINS)
def test_mixed_batches_of_mm_prefix_models_stay_out_of_full_cuda_graphs(tree_facts: Facts, pin: str) -> None:
    # The exact rows are recomputed from Python, which a full-graph replay would skip.
    assert tree_facts(pin, "patched")["fa_cudagraph"] == {"True": "UNIFORM_BATCH", "False": "ALWAYS"}
    assert tree_facts(pin, "pristine")["fa_cudagraph"] == {"True": "ALWAYS", "False": "ALWAYS"}


@pytest.mark.parametrize("pin", PINS)
def test_no_model_changes_backend_unless_flash_attn_is_named(tree_facts: Facts, pin: str) -> None:
    """Automatic selection for an mm-prefix model is what the pristine tree picks (the recompute is opt-in), text
    models are untouched, and naming FLASH_ATTN is what the series adds (the pristine tree refuses it)."""
    pristine, patched = tree_facts(pin, "pristine"), tree_facts(pin, "patched")
    assert patched["auto_backend"] == pristine["auto_backend"]
    assert {k: v for k, v in patched["auto_backend"].items() if k.endswith("-mm")} == {
        "sm80-mm": "TRITON_ATTN", "sm90-mm": "TRITON_ATTN", "sm120-mm": "TRITON_ATTN"}
    assert patched["auto_backend"]["sm120-text"] == "FLASH_ATTN"
    assert "partial multimodal token full attention not supported" in pristine["explicit_flash_attn_mm_refused"]
    assert patched["explicit_flash_attn_mm_refused"] is None


@pytest.mark.parametrize("pin", PINS)
def test_mm_rows_refuse_dcp_and_alibi(tree_facts: Facts, pin: str) -> None:
    """Where the recompute cannot be exact the forward refuses, naming what to do, instead of computing rows
    that are silently causal (DCP returned before the recompute) or misaligned (ALiBi)."""
    refusals = tree_facts(pin, "patched")["forward"]["refusals"]
    for what in ("dcp", "alibi"):
        assert refusals[what] is not None and "TRITON_ATTN" in refusals[what], (what, refusals[what])


def test_full_cuda_graphs_stay_capped_where_fa4_is_installed_but_fa3_runs(tree_facts: Facts) -> None:
    """0.33.0 on SM90: FA4 can be installed while the layers run FA3, whose mm rows need the Python recompute."""
    assert tree_facts("vllm-0.33.0", "patched")["fa_cudagraph_fa4_installed_fa3_running"] == "UNIFORM_BATCH"


def test_batches_without_rows_in_ranges_run_as_text_only_on_0_21_0(tree_facts: Facts) -> None:
    """0.21.0's runner writes a range list for every request (empty for text-only ones, the prompt's ranges for a
    request decoding after its image). Such batches make one causal call per layer, refuse neither DCP nor ALiBi, and
    a text-only batch never scans for rows (README: text-only batches pay nothing)."""
    facts = tree_facts("vllm-0.21.0", "patched")["forward"]["runner_ranges"]
    assert facts["calls"] == [3] * 6  # one causal call per layer, three layers
    assert facts["refused"] == [{"dcp": False, "alibi": False}] * 6
    assert facts["text_scans"] == 0


class _Transfers(TorchFunctionMode):
    """Records tensors made from Python data directly on a device, and host-to-device copies (with their
    non_blocking flag): what a forward that builds index tensors mid-step costs in synchronous copies."""

    def __init__(self) -> None:
        super().__init__()
        self.made_on_device: list[str] = []
        self.copies: list[bool] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        device = kwargs.get("device")
        if name in ("tensor", "as_tensor") and device is not None and torch.device(device).type != "cpu":
            self.made_on_device.append(name)
        if name == "to":
            target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
            if target is not None and torch.device(target).type != "cpu" and args[0].device.type == "cpu":
                self.copies.append(bool(kwargs.get("non_blocking", False)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("pin", PINS)
def test_recompute_indices_reach_the_device_in_one_async_copy(mm_prefix_module: Any, pin: str) -> None:
    """Third review, 3: the index tensors of the recompute calls were four torch.tensor(list, device=...) per call,
    each a synchronous pageable host-to-device copy in the middle of the forward. They are built on the host and
    moved in one non-blocking copy per batch and layer kind (from pinned memory on CUDA). A device that is not
    the CPU stands in for the GPU here (meta: shapes only)."""
    mm = mm_prefix_module(pin)
    spans = mm.mm_prefix_spans({0: [(2, 30)], 1: [(0, 9), (12, 40)]}, torch.tensor([0, 40, 80]),
                               torch.tensor([40, 50]))
    groups = mm.mm_prefix_segments(spans, 8, False)
    assert len(groups) >= 2  # near rows and far rows: several calls
    with _Transfers() as seen:
        on_device = mm.prepare_mm_prefix_calls(groups, torch.device("meta"))
    assert seen.made_on_device == []
    assert seen.copies == [True]
    on_host = mm.prepare_mm_prefix_calls(groups, "cpu")
    for dev, host in zip(on_device, on_host, strict=True):
        assert dev.window == host.window and dev.num_seqs == host.num_seqs
        for field in ("rows", "cu_seqlens_q", "seqused_k", "req_indices"):
            a, b = getattr(dev, field), getattr(host, field)
            assert (a.dtype, a.shape, a.device.type) == (b.dtype, b.shape, "meta"), field
    # the host build is what the calls read (rows of each call in order, int32 offsets and key lengths)
    first = on_host[0]
    assert first.cu_seqlens_q.dtype == torch.int32 and first.rows.dtype == torch.long
    assert int(first.cu_seqlens_q[-1]) == first.rows.shape[0]


@pytest.mark.parametrize("pin", PINS)
def test_backends_with_a_forward_of_their_own_claim_no_mm_prefix(tree_facts: Facts, pin: str) -> None:
    """Third review, 5: FlashAttention subclasses whose layers run a forward of their own (DiffKV on every pin;
    Qwen4Exp's QSA and Step5's on newer ones) never recompute the mm rows, so (without FA4, as on SM120) they
    must not claim mm-prefix support: named for an mm-prefix model their image rows would be silently causal.
    Subclasses that keep FlashAttentionImpl.forward keep the support."""
    facts = tree_facts(pin, "patched")["fa_subclasses"]
    classes = facts["classes"]
    assert any(name.endswith("FlashAttentionDiffKVBackend") for name in classes), facts
    own = {name: c for name, c in classes.items() if c["own_forward"]}
    assert own, classes
    assert all(c["supports_mm_prefix"] is False and c["for_head_128"] in (False, None) for c in own.values()), own
    kept = {name: c for name, c in classes.items() if not c["own_forward"]}
    assert all(c["supports_mm_prefix"] is True for c in kept.values()), kept


@pytest.mark.parametrize("pin", PINS)
def test_no_mm_prefix_recompute_on_xpu(tree_facts: Facts, pin: str) -> None:
    """Third review, 4: XPU takes FLASH_ATTN by default without validating the configuration, so a claimed
    support would put every mm-prefix model on XPU through the recompute (a kernel wrapper whose window handling
    was never checked and which drops softcap). There FlashAttention stays as the pristine tree has it: no
    mm-prefix support claimed by recompute, and the pristine forward's calls (no non-causal recompute), with
    or without rows in ranges."""
    xpu = tree_facts(pin, "patched")["xpu"]
    pristine = tree_facts(pin, "pristine")["xpu"]
    assert xpu["supports_mm_prefix"] is False
    assert xpu["for_head_256"] is False
    assert xpu["forward_calls"] == pristine["forward_calls"]
    assert all(False not in calls for calls in xpu["forward_calls"])  # no non-causal recompute call


@pytest.mark.parametrize("pin", ["vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_cuda_graph_cap_follows_the_config_the_layers_run_under(tree_facts: Facts, pin: str) -> None:
    """Third review, 9: the cap asked the FlashAttention version of whatever config was current; with none current
    (as when the runner computes it) a config forcing FA2 on an SM100 with FA4 gave FA4, no cap, and full-graph
    replays of mixed batches without the recompute, while the layers (built under the config) run FA2."""
    cap = tree_facts(pin, "patched")["fa_cudagraph_config_forces_fa2"]
    assert cap["layer_version"] == 2
    assert cap["config_current"] == "UNIFORM_BATCH"
    assert cap["no_current_config"] == "UNIFORM_BATCH"


STEP_PINS = ["vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"]


@pytest.mark.parametrize("pin", PINS)
def test_rows_are_placed_once_per_step_for_every_kv_group(mm_prefix_module: Any, pin: str) -> None:
    """Fourth review, 6: every KV group's builder asks for the step's rows with the runner's same objects; the
    spans are computed once, and the groups' layers share one calls cache (one device copy per window kind per step,
    not one per group). A new step (a new range dict, as the runners make each step) is placed again."""
    mm = mm_prefix_module(pin)
    placed = [0]
    real = mm.mm_prefix_spans

    def counted(*args: Any, **kwargs: Any) -> Any:
        placed[0] += 1
        return real(*args, **kwargs)

    mm.mm_prefix_spans = counted
    try:
        starts, seq_lens = torch.tensor([0, 40, 80]), torch.tensor([40, 50])
        ranges = {0: [(2, 30)], 1: [(0, 9), (12, 40)]}
        groups = [mm.step_mm_prefix_spans(ranges, starts, seq_lens) for _ in range(5)]  # five sliding groups
        assert placed[0] == 1
        assert all(g[0] is groups[0][0] and g[1] is groups[0][1] for g in groups)
        assert groups[0][0] == real(ranges, starts, seq_lens)
        first = mm.cached_mm_prefix_calls(groups[1][1], groups[1][0], 8, False, "cpu")
        assert mm.cached_mm_prefix_calls(groups[4][1], groups[4][0], 8, False, "cpu") is first
        same_content = {0: [(2, 30)], 1: [(0, 9), (12, 40)]}  # the next step's dict
        later = mm.step_mm_prefix_spans(same_content, starts, seq_lens)
        assert placed[0] == 2 and later[1] is not groups[0][1] and later[0] == groups[0][0]
        # the drafter's metadata: the same ranges, its own query rows
        mm.step_mm_prefix_spans(same_content, torch.tensor([0, 4, 8]), seq_lens)
        assert placed[0] == 3
    finally:
        mm.mm_prefix_spans = real


@pytest.mark.parametrize("pin", STEP_PINS)
def test_a_step_without_prefill_rows_places_none_and_no_upper_bound_is_refused(mm_prefix_module: Any,
                                                                              pin: str) -> None:
    """Fourth review, 4 and 6: 0.26.0's runner hands its ranges on every step of an image request, decode-only steps
    included: with no request prefilling nothing is placed. Without seq_lens_cpu_upper_bound the rows cannot be
    placed: refused (0.26.0 skipped them silently, leaving image rows causal; 0.29.0 and 0.33.0 assert)."""
    mm = mm_prefix_module(pin)
    starts, seq_lens = torch.tensor([0, 1, 2]), torch.tensor([300, 410])
    ranges = {0: [(2, 30)], 1: [(0, 9)]}
    real = mm.mm_prefix_spans

    def not_on_a_decode_step(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("rows placed on a step without prefill rows")

    mm.mm_prefix_spans = not_on_a_decode_step
    try:
        spans, cache = mm.step_mm_prefix_spans(ranges, starts, seq_lens, torch.tensor([False, False]))
    finally:
        mm.mm_prefix_spans = real
    assert spans == [] and cache == {}
    prefill_starts, prefill_lens = torch.tensor([0, 40, 41]), torch.tensor([40, 411])
    spans, _ = mm.step_mm_prefix_spans(ranges, prefill_starts, prefill_lens, torch.tensor([True, False]))
    assert [(s.req_idx, s.num_rows) for s in spans] == [(0, 29)]
    with pytest.raises(AssertionError, match="mm_prefix requires seq_lens_cpu_upper_bound"):
        mm.step_mm_prefix_spans(ranges, prefill_starts, None)
    assert mm.step_mm_prefix_spans({}, prefill_starts, None)[0] == []  # no ranges: nothing to place


@pytest.mark.parametrize("pin", PINS)
def test_the_builder_places_rows_through_the_step_and_never_skips_them(pin: str) -> None:
    """The patched builders call step_mm_prefix_spans unguarded (0.26.0 no longer behind `upper bound is not
    None`; 0.21.0 places them in the forward, once per metadata), and hand the layers its shared calls cache;
    mm_prefix_spans is no longer called per group."""
    from tests.support.trees import patched_tree

    text = (patched_tree(pin) / "vllm" / "v1" / "attention" / "backends" / "flash_attn.py").read_text()
    assert text.count("= step_mm_prefix_spans(") == 1
    shared = "attn_metadata.mm_prefix_calls_cache = cache" if pin == "vllm-0.21.0" else (
        "attn_metadata.mm_prefix_calls_cache,\n")
    assert shared in text
    assert " mm_prefix_spans(" not in text
    assert "seq_lens_cpu_upper_bound is not None:\n                attn_metadata.mm_prefix_spans" not in text


@pytest.mark.parametrize("pin", ["vllm-0.26.0", "vllm-0.29.0"])
def test_cascade_stays_off_for_fa4_too_because_its_call_has_no_mask_mod(pin: str) -> None:
    """Fourth review, 5: the series turns cascade attention off for every mm-prefix model on FlashAttention, FA4
    included. The reason, in the pristine trees (the trees with a cascade path): their cascade call passes no
    mask_mod, so FA4's bidirectional image rows would be causal under cascade. The series says so."""
    import ast

    from tests.support.trees import sdist_tree

    from g4build.series.model import load_all

    text = (sdist_tree(pin) / "vllm" / "v1" / "attention" / "backends" / "flash_attn.py").read_text()
    cascade = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "cascade_attention")
    calls = [c for c in ast.walk(cascade)
             if isinstance(c, ast.Call) and ast.unparse(c.func) == "flash_attn_varlen_func"]
    assert len(calls) == 2 and all(kw.arg != "mask_mod" for c in calls for kw in c.keywords)
    why = " ".join(next(s for s in load_all() if s.name == "mm-prefix-fa").why.split())
    assert "Cascade attention stays off for every mm-prefix model on FlashAttention, FA4 included" in why


@pytest.mark.parametrize("pin", STEP_PINS)
def test_the_trees_own_builders_place_rows_once_per_step_and_refuse_without_the_bound(
        probe_inputs: Any, pin: str) -> None:
    """Fourth review, 4 and 6, on the patched tree's own FlashAttentionMetadataBuilder (two KV groups, one step, on
    CPU): the groups share the rows and the calls cache, placed once; a step without prefill rows places none
    (0.29.0/0.33.0 upstream find no rows there first); a step without seq_lens_cpu_upper_bound is refused (0.26.0
    skipped its rows silently before)."""
    from tests.integration.series_a.conftest import run_probe

    boot, target, _, _ = probe_inputs
    facts = run_probe(pin, "patched", boot, "builder_step_probe.py", [str(target)], "BUILDER_STEP ", target.parent)
    assert facts["prefill"] == {"rows": [[0, 29]], "spans_shared": True, "calls_cache_shared": True, "placed": 1}
    assert facts["decode_only"] == {"rows": 0, "placed": 0}
    assert facts["without_upper_bound"] == "refused: mm_prefix requires seq_lens_cpu_upper_bound"
