"""TRITON_ATTN's unified attention on a verification step (k + 1 query tokens a request), run by Triton's CPU
interpreter through tests/gpu/run_verify_attention.py, the script the GPU run uses: vLLM 0.21.0's split-KV (3D)
kernel, which it launches only for one query token a request, gives the same attention as its 2D kernel and as
torch for up to 16 query tokens, full and sliding-window layers alike. What the GPU run then measures is only
whether it is faster (tests/gpu/results/verify-attention/: on full layers at 16K tokens, up to 7x). The series'
dispatch (dflash-batched-verification 0007) makes it so on full-attention layers where the buffers hold the rows,
with the attention kernels unchanged and their segments' reduction mended (a segment that held no key a token may see
no longer sets the maximum); its patched tree runs here as it is, against itself set back to the released dispatch."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import patched_tree, sdist_tree

pytest.importorskip("triton", reason="the kernel check needs triton (its CPU interpreter)")
pytest.importorskip("numpy", reason="Triton's interpreter runs on numpy")

pytestmark = pytest.mark.network

SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "run_verify_attention.py"


def _env() -> dict[str, str]:
    """Triton's interpreter, and the series' bound as shipped whatever the caller's environment says."""
    return {k: v for k, v in os.environ.items() if k != "G4B_TRITON_VERIFY_SPLIT_KV"} | {"TRITON_INTERPRET": "1"}


def _run(source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = _env()
    return subprocess.run([sys.executable, str(SCRIPT), "--source", str(source), "--json", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def _probe(tree: Path, body: str) -> str:
    """Run ``body`` in a fresh interpreter (Triton's, on the CPU) where ``tree``'s kernel file is vLLM's
    ``triton_unified_attention`` (the rest stubbed as run_verify_attention.py stubs it) and TRITON_ATTN's backend
    module calls it; ``rva``, ``ops``, ``backend``, ``torch``, ``types`` and ``Path`` are there, and
    ``on_and_off(batch, extra)``: the call with ``extra`` keywords at the series' bound (16), then set back to one
    query token, as ``[(kernel seen, output), ...]``. Its stdout."""
    preamble = f"""
import sys, types
from pathlib import Path
sys.path.insert(0, {str(SCRIPT.parent)!r}); sys.path.insert(0, {str(SCRIPT.parent / "e2e")!r})
import run_verify_attention as rva, torch
tree = Path({str(tree)!r})
rva._stub_vllm(tree)
rva._load(tree / rva.HELPERS_FILE, "vllm.v1.attention.ops.triton_attention_helpers")
ops = rva._load(tree / rva.KERNEL_FILE, "vllm.v1.attention.ops.triton_unified_attention")
backend = types.ModuleType("vllm.v1.attention.backends.triton_attn")
backend.unified_attention = ops.unified_attention
sys.modules["vllm.v1.attention.backends"] = rva._package("vllm.v1.attention.backends")
sys.modules[backend.__name__] = backend

def on_and_off(b, extra):
    runs = []
    for bound in (16, 1):
        ops.verify_split_kv_max_query = bound
        out, segm = torch.zeros_like(b["q"]), rva.buffers(b)
        call = lambda **kw: ops.unified_attention(**(kw | extra))
        rva.launch(types.SimpleNamespace(unified_attention=call), b, out, segm)
        runs.append((rva.kernel_seen(segm), out))
    return runs
"""
    proc = subprocess.run([sys.executable, "-c", preamble + body], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(("shape", "queries"), [("small", "1,9,16"), ("small-sliding", "5,16")])
def test_the_split_kernel_verifies_as_the_released_one(shape: str, queries: str) -> None:
    proc = _run(sdist_tree("vllm-0.21.0"), "--shape", shape, "--queries", queries, "--context", "300")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["device"].startswith("cpu")
    for row in report["rows"]:
        # as released, a request of one query token takes the 3D kernel and a verification the 2D one; the
        # experiment takes the 3D kernel for both (seen: only it writes the segment buffers)
        assert row["released_kernel"] == ("3d" if row["query"] == 1 else "2d")
        assert row["3d_kernel"] == "3d"
        assert row["released_ok"] and row["3d_ok"], row
        # the two are different computations (split softmax rounds otherwise), equal within float32 rounding
        assert row["released_vs_3d"] < 1e-5
    assert [r["query"] for r in report["rows"]] == [int(q) for q in queries.split(",")]


@pytest.mark.parametrize("pin", ["vllm-0.26.0", "vllm-0.29.0"])
def test_the_split_kernel_verifies_on_the_later_pins_that_keep_the_gate(pin: str) -> None:
    """0.26.0 and 0.29.0 keep 0.21.0's gate over a kernel that grew (per-request causality, R-SWA, INT4): their
    split kernel, widened the same way, verifies as their 2D one and as torch; the stub's KVQuantMode is each
    tree's own (both put INT4 at 4 and NVFP4 at 5, where 0.21.0 has NVFP4 at 4)."""
    proc = _run(sdist_tree(pin), "--queries", "1,9,16", "--context", "300")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["dispatch"] == "experiment"
    kernels = [(r["released_kernel"], r["3d_kernel"]) for r in report["rows"]]
    assert kernels == [("3d", "3d"), ("2d", "3d"), ("2d", "3d")]
    import importlib.util

    spec = importlib.util.spec_from_file_location("rva_modes", SCRIPT)
    assert spec and spec.loader
    rva = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rva)
    modes = rva.kv_quant_mode(sdist_tree(pin))
    assert modes.NONE == 0 and modes.FP8_PER_TENSOR == 1
    assert (modes.INT4_PER_TOKEN_HEAD, modes.NVFP4) == (4, 5)
    assert rva.kv_quant_mode(sdist_tree("vllm-0.21.0")).NVFP4 == 4


def test_a_tree_without_the_released_condition_is_refused() -> None:
    """0.33.0 already lets short queries take the split kernel (its own bound): nothing for the experiment to widen."""
    proc = _run(sdist_tree("vllm-0.33.0"), "--queries", "4")
    assert proc.returncode == 2 and "is not 0.21.0's" in proc.stderr
    missing = _run(Path(__file__).parent, "--queries", "4")  # no vLLM here at all
    assert missing.returncode == 2 and "expected a vLLM source tree" in missing.stderr


def test_the_widened_dispatch_keeps_2d_where_the_buffers_lack_rows() -> None:
    """vLLM 0.21.0 sizes the segment buffers for one query token a request: where a verification has more rows than
    they hold, the widened dispatch keeps the released 2D kernel rather than write past them."""
    proc = _run(sdist_tree("vllm-0.21.0"), "--queries", "1,4", "--context", "100", "--buffer-rows", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["query"], r["3d_kernel"]) for r in rows] == [(1, "3d"), (4, "2d")]  # 2 requests x 4 rows > 4


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.29.0"])
@pytest.mark.parametrize(("shape", "args", "expected"), [
    # a full-attention layer: the split kernel up to 16 query tokens a request, the 2D one past it
    ("small", ("--queries", "1,9,16,17"), [(1, "3d", "3d"), (9, "2d", "3d"), (16, "2d", "3d"), (17, "2d", "2d")]),
    # a sliding-window layer keeps the 2D kernel for a verification (measured no faster there)
    ("small-sliding", ("--queries", "1,9"), [(1, "3d", "3d"), (9, "2d", "2d")]),
    # buffers without a row for every query token keep it too (2 requests x 4 tokens > 4 rows)
    ("small", ("--queries", "4", "--buffer-rows", "4"), [(4, "2d", "2d")]),
    # a verification beside a decode and a short chunk, and padded rows past the last request (a CUDA graph's
    # batch): the split kernel, equal to torch on every real row
    ("small", ("--queries", "9,16", "--seqs", "3", "--mixed", "--pad", "3"), [(9, "2d", "3d"), (16, "2d", "3d")]),
])
def test_the_series_dispatch_of_the_patched_tree(pin: str, shape: str, args: tuple[str, ...],
                                                  expected: list[tuple[int, str, str]]) -> None:
    """dflash-batched-verification 0007 on 0.21.0 and 0.29.0: the patched tree's own kernel file, run as it is and
    with its bound set back to one query token (the released dispatch), both equal to torch."""
    proc = _run(patched_tree(pin), "--shape", shape, "--context", "300", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["dispatch"] == "series" and report["max_3d_query"] == 16 and report["ok"]
    assert report["split_taken"] == sum(q > 1 and k == "3d" for q, _, k in expected)
    assert [(r["query"], r["released_kernel"], r["3d_kernel"]) for r in report["rows"]] == expected
    assert all(r["released_vs_3d"] < 1e-5 for r in report["rows"])


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.29.0"])
def test_the_split_kernel_keeps_scores_far_below_zero(pin: str) -> None:
    """Every score about -110: with several query tokens a request, a segment can hold only later tokens' keys for
    an earlier token; its online softmax ends at maximum 0, sum 0, and the released reduction scaled every other
    segment by exp(max - 0), which underflowed (up to 81% of the largest output wrong at 129 keys, series v5).
    0007's reduction leaves such segments out of the maximum: the split kernel equals torch and the 2D kernel."""
    proc = _run(patched_tree(pin), "--queries", "4,9,16", "--context", "129", "--low-scores")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["split_taken"] == 3
    assert all(r["low_scores"] and r["3d_relative_error"] < 1e-4 for r in report["rows"])


@pytest.mark.parametrize("value", ["0", "1", "many"])
def test_the_series_dispatch_turns_off_by_its_variable(value: str) -> None:
    env = _env() | {"G4B_TRITON_VERIFY_SPLIT_KV": value}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--source", str(patched_tree("vllm-0.21.0")), "--json",
                           "--queries", "4", "--context", "100"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["max_3d_query"] == 1 and report["rows"][0]["3d_kernel"] == "2d"
    assert ("not a whole number" in proc.stderr) == (value == "many")


def test_the_widened_source_of_each_pin_that_has_the_gate() -> None:
    """The text step_costs.py --verify-split-kv loads in vLLM's place: the released condition replaced, the buffer
    guard beside it at the same indentation, valid Python; 0.33.0, whose own bound replaced the gate, is refused."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rva_under_test", SCRIPT)
    assert spec and spec.loader
    rva = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rva)
    for pin in ("vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0"):
        text = (sdist_tree(pin) / rva.KERNEL_FILE).read_text(encoding="utf-8")
        wide = rva.widened(text, 16)
        ast.parse(wide)
        assert "or max_seqlen_q > 1\n" not in wide and wide.count("or max_seqlen_q > 16\n") == 1
        guard = next(line for line in wide.splitlines() if "softmax_segm_output.shape[0]" in line)
        gate = next(line for line in wide.splitlines() if "or max_seqlen_q > 16" in line)
        assert len(guard) - len(guard.lstrip()) == len(gate) - len(gate.lstrip())
    with pytest.raises(ValueError, match=r"not 0\.21\.0's"):
        rva.widened((sdist_tree("vllm-0.33.0") / rva.KERNEL_FILE).read_text(encoding="utf-8"), 16)


def test_step_costs_gives_tritons_backend_the_widened_attention(tmp_path: Path) -> None:
    """step_costs.py --verify-split-kv: in a process whose vLLM is the pinned tree's kernel file (the rest stubbed
    as run_verify_attention.py stubs it), TRITON_ATTN's backend module calls the widened unified_attention: a
    verification of 4 tokens through it takes the split kernel, and the run's counts say so."""
    out = _probe(sdist_tree("vllm-0.21.0"), """
import step_costs
path, counts = step_costs.install_verify_split(16)
src = Path(path).read_text()
b = rva.make_batch("small", 2, 4, 100, torch.float32, "cpu")
out, segm = torch.zeros_like(b["q"]), rva.buffers(b)
rva.launch(types.SimpleNamespace(unified_attention=backend.unified_attention), b, out, segm)
print(backend.unified_attention is not ops.unified_attention, "max_seqlen_q > 16" in src,
      "max_seqlen_q > 1\\n" not in src, rva.kernel_seen(segm), counts)
""")
    words = out.split(maxsplit=4)
    assert words[:4] == ["True", "True", "True", "3d"], out  # a verification through the backend: split
    assert ast.literal_eval(words[4]) == {"calls": 1, "verify_calls": 1, "verify_calls_eligible": 1}


@pytest.mark.parametrize(("bound", "kernel"), [(16, "3d"), (1, "2d")])
def test_step_costs_sets_the_series_bound_on_a_patched_wheel(bound: int, kernel: str) -> None:
    """On a wheel that carries 0007, step_costs.py --verify-split-kv Q keeps vLLM's own file and sets its bound:
    16 verifies through the split kernel, 1 (the baseline beside it) through the released 2D dispatch; the
    counts say which calls were eligible either way."""
    out = _probe(patched_tree("vllm-0.21.0"), f"""
import step_costs
path, counts = step_costs.install_verify_split({bound})
b = rva.make_batch("small", 2, 4, 100, torch.float32, "cpu")
out, segm = torch.zeros_like(b["q"]), rva.buffers(b)
rva.launch(types.SimpleNamespace(unified_attention=backend.unified_attention), b, out, segm)
print(path == ops.__file__, ops.verify_split_kv_max_query, rva.kernel_seen(segm), counts)
""")
    words = out.split(maxsplit=3)
    assert words[:3] == ["True", str(bound), kernel], out
    eligible = 1 if bound >= 4 else 0
    assert ast.literal_eval(words[3]) == {"calls": 1, "verify_calls": 1, "verify_calls_eligible": eligible}


def test_the_series_dispatch_keeps_multimodal_prefix_ranges_on_2d() -> None:
    """A call that carries multimodal prefix ranges (bidirectional image spans) keeps the released 2D kernel
    for a verification: the split kernel was not checked with them. Seen as which kernel wrote the buffers."""
    out = _probe(patched_tree("vllm-0.21.0"), """
b = rva.make_batch("small", 2, 4, 100, torch.float32, "cpu")
seen = []
for ranges in (None, torch.zeros((2, 1, 2), dtype=torch.int32)):
    out, segm = torch.zeros_like(b["q"]), rva.buffers(b)
    call = lambda **kw: ops.unified_attention(**kw, mm_prefix_range=ranges)
    rva.launch(types.SimpleNamespace(unified_attention=call), b, out, segm)
    seen.append(rva.kernel_seen(segm))
print(*seen)
""")
    assert out.split() == ["3d", "2d"]


def test_the_later_pins_carry_the_same_dispatch() -> None:
    """0.26.0 and 0.29.0 release one kernel file; 0007 makes the same file of both (so the runs above on 0.29.0's
    patched tree are 0.26.0's too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rva_same", SCRIPT)
    assert spec and spec.loader
    rva = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rva)
    texts = [(patched_tree(pin) / rva.KERNEL_FILE).read_text(encoding="utf-8")
             for pin in ("vllm-0.26.0", "vllm-0.29.0")]
    assert texts[0] == texts[1] and rva.SERIES_DISPATCH in texts[0]


def test_the_later_pins_keep_their_other_cases_on_2d() -> None:
    """On 0.29.0 a verification keeps the released 2D kernel for what its split kernel was not checked with here:
    multimodal prefix ranges, a non-causal call and per-request causality (0.33.0's own dispatch keeps these off
    it too), and R-SWA (ours). A plain causal one takes the split kernel. Seen as which kernel wrote the buffers;
    each run is also compared with the 2D kernel's output."""
    out = _probe(patched_tree("vllm-0.29.0"), """
b = rva.make_batch("small", 2, 4, 100, torch.float32, "cpu")
cases = {"causal": {}, "mm-prefix": {"mm_prefix_range": torch.zeros((2, 1, 2), dtype=torch.int32)},
         "bidirectional": {"causal": False}, "per-request": {"causal": torch.ones(2, dtype=torch.bool)},
         "r-swa": {"rswa_prefix_lens": torch.zeros(2, dtype=torch.int32), "rswa_window": 32}}
for name, extra in cases.items():
    (k3, o3), (k2, o2) = on_and_off(b, extra)
    print(name, k3, k2, float((o3 - o2).abs().max()))
""")
    rows = {name: (kernel, off, float(diff)) for name, kernel, off, diff in (line.split() for line in out.splitlines())}
    assert {name: row[:2] for name, row in rows.items()} == {
        "causal": ("3d", "2d"), "mm-prefix": ("2d", "2d"), "bidirectional": ("2d", "2d"),
        "per-request": ("2d", "2d"), "r-swa": ("2d", "2d")}
    assert all(row[2] < 1e-5 for row in rows.values()), rows


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.29.0"])
def test_what_the_guards_let_through_verifies_as_the_2d_kernel(pin: str) -> None:
    """A verification's other call options reach the split kernel too: attention sinks, ALiBi slopes and a softcap.
    Each, on a batch that mixes a verification, a decode and a short chunk with padded rows after them, takes the
    split kernel and gives the 2D kernel's output on every real row; the padded rows are left as they were
    (0.33.0's reduction skips them too). A tree drafter's query-query bias is not checked here: its helper masks
    with Python's ``and``, which Triton compiles elementwise but its CPU interpreter does not (it keeps the right
    operand), so the interpreter reads outside the bias for context keys and both kernels see garbage."""
    out = _probe(patched_tree(pin), """
gen = torch.Generator().manual_seed(7)
b = rva.make_batch("small", 3, 9, 100, torch.float32, "cpu", mixed=True, pad=2)
heads, real = b["heads"], b["real_rows"]
cases = {"plain": {}, "sinks": {"sinks": torch.randn(heads, generator=gen) * 3},
         "alibi": {"alibi_slopes": torch.rand(heads, generator=gen) * 0.5}, "softcap": {"softcap": 2.0}}
for name, extra in cases.items():
    (k3, o3), (k2, o2) = on_and_off(b, extra)
    untouched = bool((o3[real:] == 0).all() and (o2[real:] == 0).all())
    print(name, k3, k2, float((o3[:real] - o2[:real]).abs().max() / o2[:real].abs().max()), untouched)
""")
    rows = {name: (k3, k2, float(diff), untouched) for name, k3, k2, diff, untouched in
            (line.split() for line in out.splitlines())}
    assert set(rows) == {"plain", "sinks", "alibi", "softcap"}, out
    assert all(r[:2] == ("3d", "2d") and r[2] < 1e-5 and r[3] == "True" for r in rows.values()), rows


def test_the_tuned_large_head_launch_keeps_2d() -> None:
    """0.29.0 tunes a 256-wide head's launch for several query tokens on capability family 100 (B200) and keeps
    that launch on its 2D kernel: 0007 does too. The platform stub answers family 100 here; the same call with
    the ordinary launch (another family) takes the split kernel."""
    out = _probe(patched_tree("vllm-0.29.0"), """
rva.SHAPES["full-256"] = (8, 2, 256, 16, -1)
b = rva.make_batch("full-256", 2, 4, 64, torch.float32, "cpu")
platform = sys.modules["vllm.platforms"].current_platform
seen = []
for family in (100, 90):
    platform.is_device_capability_family = lambda f, family=family: f == family
    out, segm = torch.zeros_like(b["q"]), rva.buffers(b)
    rva.launch(types.SimpleNamespace(unified_attention=ops.unified_attention), b, out, segm)
    seen.append(rva.kernel_seen(segm))
print(*seen)
""")
    assert out.split() == ["2d", "3d"]
