"""Each rule: one case that triggers it and one that does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from g4build.pins.model import load_pins
from g4build.recipes.checkpoint import CheckpointInfo
from g4build.recipes.model import KvGeometry, Recipe, parse_recipe
from g4build.recipes.rules import CheckContext, Finding, WheelInfo, check
from g4build.recipes.vllm_args import recorded_table
from g4build.series.model import Series, load_series

PINS = load_pins()
PIN = PINS.get("vllm-0.21.0")


def recipe(data: dict[str, Any], **changes: Any) -> Recipe:
    merged = {**data, **changes}
    return parse_recipe(merged, "test.yaml")


def ctx(**changes: Any) -> CheckContext:
    base = CheckContext(pin=PIN, known_pins=tuple(PINS.pins), series=(), transformers_asked=True,
                        transformers_model_types=frozenset({"gemma4", "gemma4_assistant"}))
    return dataclasses.replace(base, **changes)


def found(findings: tuple[Finding, ...], rule: str, severity: str | None = None) -> list[Finding]:
    return [f for f in findings if f.rule == rule and (severity is None or f.severity == severity)]


def checkpoint(**changes: Any) -> CheckpointInfo:
    base = CheckpointInfo(path="m", architectures=("Gemma4ForConditionalGeneration",), model_type="gemma4",
                          quant_method="modelopt", quant_algo="NVFP4", head_dim=256, global_head_dim=512,
                          kv=None, weights_bytes=0)
    return dataclasses.replace(base, **changes)


DFLASH = {"method": "dflash", "model": "d", "num_speculative_tokens": 15, "attention_backend": "flash_attn"}


# --- pin -------------------------------------------------------------------------------------------------
def test_unknown_pin_is_an_error(base_data: dict[str, Any]) -> None:
    assert found(check(recipe(base_data, pin="vllm-9.9.9"), ctx()), "pin", "error")


def test_known_pin_passes(base_data: dict[str, Any]) -> None:
    assert not found(check(recipe(base_data), ctx()), "pin")


def test_wheel_from_another_pin_is_refused(base_data: dict[str, Any]) -> None:
    wheel = WheelInfo(file="w.whl", pin="vllm-0.33.0")
    assert found(check(recipe(base_data), ctx(wheel=wheel)), "pin", "error")
    assert not found(check(recipe(base_data), ctx(wheel=dataclasses.replace(wheel, pin="vllm-0.21.0"))), "pin")


@pytest.mark.parametrize("claimed", [None, "vllm-9.9.9"])
def test_series_claimed_without_a_known_pin_are_refused(base_data: dict[str, Any], claimed: str | None) -> None:
    """As validate: a series is known by its fingerprints for one pin; a manifest naming no known pin claims it
    unchecked."""
    wheel = WheelInfo(file="w.whl", pin=claimed, series={"dflash": 1})
    [finding] = [f for f in found(check(recipe(base_data), ctx(wheel=wheel)), "pin", "error")
                 if "claims series dflash" in f.message]
    assert ("names no pin" if claimed is None else "an unknown pin 'vllm-9.9.9'") in finding.message
    assert not found(check(recipe(base_data), ctx(wheel=dataclasses.replace(wheel, pin="vllm-0.21.0"))), "pin")
    assert not found(check(recipe(base_data), ctx(wheel=dataclasses.replace(wheel, pin=None, series={}))), "pin")


# --- quantization ----------------------------------------------------------------------------------------
def test_forced_modelopt_quantization_on_nvfp4_checkpoint_is_an_error(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, args={"quantization": "modelopt"})
    [finding] = found(check(r, ctx()), "quantization", "error")
    assert "--set args.quantization=null" in finding.hint


def test_forced_quantization_judged_from_the_real_checkpoint(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, args={"quantization": "modelopt"}, checkpoint={})
    assert not found(check(r, ctx()), "quantization")  # recipe declares nothing: nothing known
    assert found(check(r, ctx(target=checkpoint())), "quantization", "error")
    assert not found(check(r, ctx(target=checkpoint(quant_algo="FP8"))), "quantization")


def test_auto_quantization_passes(base_data: dict[str, Any]) -> None:
    assert not found(check(recipe(base_data), ctx()), "quantization")


# --- MoE backend -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cutlass", "flashinfer_cutlass", "flashinfer_trtllm"])
def test_cutlass_or_flashinfer_moe_for_gemma4_is_an_error(base_data: dict[str, Any], backend: str) -> None:
    [finding] = found(check(recipe(base_data, args={"moe-backend": backend}), ctx()), "moe-backend", "error")
    assert "GELU_TANH" in finding.message


@pytest.mark.parametrize(("pin", "refused", "accepted"), [
    ("vllm-0.26.0", ("flashinfer_cutedsl", "flashinfer_b12x"), ("cutlass", "flashinfer_cutlass", "marlin")),
    ("vllm-0.29.0", ("flashinfer_cutedsl", "b12x"), ("flashinfer_b12x", "flashinfer_cutlass", "marlin")),
    ("vllm-0.33.0", ("flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl", "b12x"), ("flashinfer_b12x", "marlin")),
])
def test_later_pins_refuse_the_moe_kernels_that_still_reject_gelu_tanh(
        base_data: dict[str, Any], pin: str, refused: tuple[str, ...], accepted: tuple[str, ...]) -> None:
    on = ctx(pin=PINS.get(pin))
    for backend in refused:
        [finding] = found(check(recipe(base_data, pin=pin, args={"moe-backend": backend}), on), "moe-backend", "error")
        assert "GELU_TANH" in finding.message and pin in finding.message
        spec = recipe(base_data, pin=pin, speculative={**DFLASH, "moe_backend": backend})
        assert found(check(spec, on), "moe-backend", "error")
    for backend in accepted:
        assert not found(check(recipe(base_data, pin=pin, args={"moe-backend": backend}), on), "moe-backend")
    # 0.21.0's switch is not read there: env-names says so, not this rule
    assert not found(check(recipe(base_data, pin=pin, env={"VLLM_USE_FLASHINFER_MOE_FP4": "1"}), on), "moe-backend")


# What each pin's tree says (its NVFP4 MoE oracle's experts without GELU_TANH): the network test
# test_recipe_moe_gelu_tanh.py reads it from the trees; written out here so that a value dropped from (or added
# to) a pin's row fails offline too.
GELU_TANH_REJECTED_BY_THE_TREES = {
    "vllm-0.21.0": {"cutlass", "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_trtllm"},
    "vllm-0.26.0": {"flashinfer_b12x", "flashinfer_cutedsl"},
    "vllm-0.29.0": {"b12x", "flashinfer_cutedsl"},
    "vllm-0.33.0": {"b12x", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl"},
}


@pytest.mark.parametrize("pin", sorted(PINS.pins))
def test_each_pins_moe_row_refuses_exactly_what_its_tree_rejects(base_data: dict[str, Any], pin: str) -> None:
    """Every --moe-backend value the pin accepts (its recorded argument table), one by one: exactly the row's are
    refused, on --moe-backend and on the drafter's moe_backend."""
    table = recorded_table(PINS.get(pin))
    assert table is not None, f"{pin} has no recorded argument table"
    choices = table["args"]["moe-backend"]["choices"]
    expected = GELU_TANH_REJECTED_BY_THE_TREES[pin]
    assert expected <= set(choices), (pin, expected - set(choices))
    on = ctx(pin=PINS.get(pin))
    for backend in choices:
        refused = bool(found(check(recipe(base_data, pin=pin, args={"moe-backend": backend}), on), "moe-backend"))
        spec = recipe(base_data, pin=pin, speculative={**DFLASH, "moe_backend": backend})
        assert refused is (backend in expected), (pin, backend)
        assert bool(found(check(spec, on), "moe-backend", "error")) is (backend in expected), (pin, backend)


@pytest.mark.parametrize("spelled", ["flashinfer-cutedsl", "FlashInfer_CuteDSL", "FLASHINFER-CUTEDSL",
                                     " flashinfer_cutedsl"])
@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.33.0"])
def test_the_moe_rule_reads_the_value_as_vllms_parser_does(base_data: dict[str, Any], pin: str,
                                                          spelled: str) -> None:
    """vLLM lower-cases --moe-backend and turns '-' into '_': flashinfer-cutedsl is flashinfer_cutedsl there."""
    on = ctx(pin=PINS.get(pin))
    [finding] = found(check(recipe(base_data, pin=pin, args={"moe-backend": spelled}), on), "moe-backend", "error")
    assert "GELU_TANH" in finding.message
    spec = recipe(base_data, pin=pin, speculative={**DFLASH, "moe_backend": spelled})
    assert found(check(spec, on), "moe-backend", "error")
    assert not found(check(recipe(base_data, pin=pin, args={"moe-backend": "Marlin"}), on), "moe-backend")


def test_flashinfer_moe_env_for_gemma4_is_an_error(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, env={"VLLM_USE_FLASHINFER_MOE_FP4": "1"})
    assert found(check(r, ctx()), "moe-backend", "error")


def test_drafter_moe_backend_is_checked_too(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, speculative={**DFLASH, "moe_backend": "cutlass"})
    assert found(check(r, ctx()), "moe-backend", "error")


def test_auto_or_marlin_moe_passes_and_other_families_are_left_alone(base_data: dict[str, Any]) -> None:
    for backend in ("auto", "marlin"):
        assert not found(check(recipe(base_data, args={"moe-backend": backend}), ctx()), "moe-backend")
    other = recipe(base_data, family="qwen3", model="Qwen/Qwen3-30B-A3B", args={"moe-backend": "cutlass"})
    assert not found(check(other, ctx()), "moe-backend")
    assert found(check(other, ctx(target=checkpoint())), "moe-backend")  # the checkpoint says Gemma 4


# --- DFlash backend --------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [None, "triton_attn", "FLASHINFER"])
def test_dflash_without_flash_attn_is_an_error(base_data: dict[str, Any], backend: str | None) -> None:
    spec = {k: v for k, v in DFLASH.items() if k != "attention_backend"}
    if backend is not None:
        spec["attention_backend"] = backend
    [finding] = found(check(recipe(base_data, speculative=spec, needs_series=["s"]), ctx()), "dflash-backend")
    assert finding.severity == "error" and "flash_attn" in finding.hint


def test_dflash_with_flash_attn_passes(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, speculative={**DFLASH, "attention_backend": "FLASH_ATTN"}, needs_series=["s"])
    assert not found(check(r, ctx()), "dflash-backend")


def test_dflash_drafter_head_dim_above_fa2_limit_is_an_error(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, speculative=DFLASH, needs_series=["s"])
    drafter = checkpoint(model_type="dflash", head_dim=512, global_head_dim=None)
    assert found(check(r, ctx(drafter=drafter)), "dflash-backend", "error")
    assert not found(check(r, ctx(drafter=dataclasses.replace(drafter, head_dim=128))), "dflash-backend")


def test_dflash_naming_no_series_warns(base_data: dict[str, Any]) -> None:
    assert found(check(recipe(base_data, speculative=DFLASH), ctx()), "dflash-backend", "warning")


# --- series / wheel --------------------------------------------------------------------------------------
def make_series(root: Path, name: str, pins: dict[str, list[str]], applied: str | None = None,
                version: int = 1) -> Series:
    folder = root / name
    lines = [f"name: {name}", f"version: {version}", "title: t", "python_only: true",
             f"applied_upstream: {applied or 'null'}", "pins:"]
    for pin, patches in pins.items():
        (folder / pin).mkdir(parents=True, exist_ok=True)
        lines.append(f"  {pin}:")
        lines.append("    patches:" + ("" if patches else " []"))
        for patch in patches:
            (folder / pin / patch).write_text("--- a/x\n+++ b/x\n", encoding="utf-8")
            lines.append(f"      - {{file: {pin}/{patch}, subject: s}}")
    (folder / "series.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_series(folder)


def test_needed_series_without_a_wheel_warns(base_data: dict[str, Any], tmp_path: Path) -> None:
    s = make_series(tmp_path, "fix", {"vllm-0.21.0": ["0001-a.patch"]})
    [finding] = found(check(recipe(base_data, needs_series=["fix"]), ctx(series=(s,))), "series")
    assert finding.severity == "warning" and "g4build wheel" in finding.hint


def test_wheel_missing_a_needed_series_is_an_error(base_data: dict[str, Any], tmp_path: Path) -> None:
    s = make_series(tmp_path, "fix", {"vllm-0.21.0": ["0001-a.patch"]})
    stock = WheelInfo(file="vllm-0.21.0.whl", pin=None, series={})
    assert found(check(recipe(base_data, needs_series=["fix"]), ctx(series=(s,), wheel=stock)), "series", "error")


def test_wheel_carrying_the_series_passes(base_data: dict[str, Any], tmp_path: Path) -> None:
    s = make_series(tmp_path, "fix", {"vllm-0.21.0": ["0001-a.patch"]}, version=2)
    ours = WheelInfo(file="w.whl", pin="vllm-0.21.0", series={"fix": 2})
    assert not found(check(recipe(base_data, needs_series=["fix"]), ctx(series=(s,), wheel=ours)), "series")
    older = dataclasses.replace(ours, series={"fix": 1})
    assert found(check(recipe(base_data, needs_series=["fix"]), ctx(series=(s,), wheel=older)), "series", "warning")


def test_series_upstream_in_the_pin_needs_no_wheel(base_data: dict[str, Any], tmp_path: Path) -> None:
    by_version = make_series(tmp_path, "fixed", {"vllm-0.21.0": ["0001-a.patch"]}, applied="0.21.0")
    by_empty_variant = make_series(tmp_path, "empty", {"vllm-0.21.0": []})
    r = recipe(base_data, needs_series=["fixed", "empty"])
    assert not found(check(r, ctx(series=(by_version, by_empty_variant))), "series")


def test_series_without_a_variant_for_the_pin_is_an_error(base_data: dict[str, Any], tmp_path: Path) -> None:
    s = make_series(tmp_path, "fix", {"vllm-0.33.0": ["0001-a.patch"]})
    [finding] = found(check(recipe(base_data, needs_series=["fix"]), ctx(series=(s,))), "series")
    assert finding.severity == "error" and "vllm-0.33.0" in finding.hint


def test_series_not_in_the_order_warns_and_an_empty_order_is_fine(base_data: dict[str, Any]) -> None:
    assert found(check(recipe(base_data, needs_series=["missing"]), ctx(series=())), "series", "warning")
    assert not found(check(recipe(base_data), ctx(series=())), "series")


# --- MTP / transformers ----------------------------------------------------------------------------------
MTP = {"method": "mtp", "model": "google/gemma-4-26B-A4B-it-assistant", "num_speculative_tokens": 4}


def test_mtp_with_a_transformers_that_lacks_gemma4_assistant_warns(base_data: dict[str, Any]) -> None:
    old = ctx(transformers_model_types=frozenset({"gemma3"}))
    assert found(check(recipe(base_data, speculative=MTP), old), "mtp-transformers", "warning")
    none = ctx(transformers_model_types=None)
    assert found(check(recipe(base_data, speculative=MTP), none), "mtp-transformers", "warning")


def test_mtp_with_a_transformers_that_knows_it_passes(base_data: dict[str, Any]) -> None:
    assert not found(check(recipe(base_data, speculative=MTP), ctx()), "mtp-transformers")


def test_mtp_drafter_of_the_wrong_type_warns(base_data: dict[str, Any]) -> None:
    bad = checkpoint(model_type="gemma4", architectures=())
    assert found(check(recipe(base_data, speculative=MTP), ctx(drafter=bad)), "mtp-transformers", "warning")
    good = checkpoint(model_type="gemma4_assistant")
    assert not found(check(recipe(base_data, speculative=MTP), ctx(drafter=good)), "mtp-transformers")


# --- speculative token count -----------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "severity"), [(0, "error"), (-1, "error"), ("15", "error"), (True, "error"),
                                             (32, "warning"), (None, "warning")])
def test_num_speculative_tokens_out_of_range(base_data: dict[str, Any], n: Any, severity: str) -> None:
    spec = {**DFLASH, "num_speculative_tokens": n}
    assert found(check(recipe(base_data, speculative=spec, needs_series=["s"]), ctx()), "spec-tokens", severity)


@pytest.mark.parametrize("n", [1, 4, 15, 16])
def test_num_speculative_tokens_in_range(base_data: dict[str, Any], n: int) -> None:
    spec = {**DFLASH, "num_speculative_tokens": n}
    assert not found(check(recipe(base_data, speculative=spec, needs_series=["s"]), ctx()), "spec-tokens")


# --- batched tokens --------------------------------------------------------------------------------------
def test_batched_below_model_len_without_chunked_prefill_is_an_error(base_data: dict[str, Any]) -> None:
    args = {"max-model-len": 131072, "max-num-batched-tokens": 32768, "enable-chunked-prefill": False}
    assert found(check(recipe(base_data, args=args), ctx()), "batched-tokens", "error")


def test_batched_below_model_len_with_chunked_prefill_passes(base_data: dict[str, Any]) -> None:
    args = {"max-model-len": 131072, "max-num-batched-tokens": 32768, "enable-chunked-prefill": True}
    assert not found(check(recipe(base_data, args=args), ctx()), "batched-tokens")
    args = {"max-model-len": 8192, "max-num-batched-tokens": 8192, "enable-chunked-prefill": False}
    assert not found(check(recipe(base_data, args=args), ctx()), "batched-tokens")


# --- VRAM budget -----------------------------------------------------------------------------------------
GEOMETRY = {"full_layers": 5, "full_kv_heads": 2, "full_head_dim": 512, "sliding_layers": 25,
            "sliding_kv_heads": 8, "sliding_head_dim": 256, "sliding_window": 1024}


@pytest.mark.parametrize(
    ("weights", "args", "needle"),
    [
        (40.0, {"max-model-len": 8192}, "the weights alone exceed the budget"),
        (27.0, {"max-model-len": 8192}, "no memory is left for the KV cache"),
        (16.0, {"max-model-len": 1_000_000, "max-num-seqs": 1}, "refuse to start"),
    ],
)
def test_vram_budget_warns(base_data: dict[str, Any], weights: float, args: dict[str, Any], needle: str) -> None:
    r = recipe(base_data, args=args, footprint={"weights_gib": weights, "kv": GEOMETRY})
    [finding] = found(check(r, ctx()), "vram", "warning")
    assert needle in finding.message


def test_vram_budget_that_fits_only_informs(base_data: dict[str, Any]) -> None:
    args = {"max-model-len": 32768, "max-num-seqs": 2, "gpu-memory-utilization": 0.9}
    r = recipe(base_data, args=args, footprint={"weights_gib": 16.0, "kv": GEOMETRY})
    assert not found(check(r, ctx()), "vram", "warning")
    assert found(check(r, ctx()), "vram", "info")


def test_vram_budget_from_the_checkpoint_files(base_data: dict[str, Any]) -> None:
    args = {"max-model-len": 8192, "max-num-seqs": 1}
    r = recipe(base_data, args=args)
    heavy = checkpoint(weights_bytes=40 * 1024**3, kv=KvGeometry(**GEOMETRY))
    assert found(check(r, ctx(target=heavy)), "vram", "warning")
    light = dataclasses.replace(heavy, weights_bytes=10 * 1024**3)
    assert not found(check(r, ctx(target=light)), "vram", "warning")


def test_fp8_kv_cache_halves_the_estimate(base_data: dict[str, Any]) -> None:
    # vLLM's need for one request of 131072 at max-num-batched-tokens 8192 (kv_need.py): 4.26 GiB at 2 bytes
    args = {"max-model-len": 131072, "max-num-batched-tokens": 8192, "max-num-seqs": 2, "gpu-memory-utilization": 0.8}
    fp16 = recipe(base_data, args=args, footprint={"weights_gib": 16.0, "kv": GEOMETRY})
    fp8 = recipe(base_data, args={**args, "kv-cache-dtype": "fp8"}, footprint={"weights_gib": 16.0, "kv": GEOMETRY})
    [half] = found(check(fp16, ctx()), "vram", "info")
    [full] = found(check(fp8, ctx()), "vram", "info")
    # 25.6 - 16.0 - 3.71 GiB of runtime at 8192 tokens leave 5.9 GiB
    assert "needs 8.5 GiB" in half.message and "1 full-length request fit" in half.message  # 2 x 4.26
    assert "KV cache 2.13 GiB per full-length request" in full.message  # half of it: both fit


def test_vram_fewer_full_length_sequences_than_max_num_seqs_only_informs(base_data: dict[str, Any]) -> None:
    """A 32 GB card at 22 x 131072 (max-num-batched-tokens 8192) serves: vLLM admits requests while KV blocks
    last, it only refuses a start that cannot hold one request of max-model-len."""
    args = {"max-model-len": 131072, "max-num-seqs": 22, "max-num-batched-tokens": 8192,
            "gpu-memory-utilization": 0.8}
    r = recipe(base_data, args=args, footprint={"weights_gib": 16.0, "kv": GEOMETRY})
    assert not found(check(r, ctx()), "vram", "warning")
    [info] = found(check(r, ctx()), "vram", "info")
    assert "1 full-length request fit at once" in info.message and "max-num-seqs 22" in info.message


def test_shipped_recipes_render_without_warnings_on_their_card() -> None:
    from g4build.recipes import load_recipe, recipe_names

    for name in recipe_names():
        warnings = [f for f in check(load_recipe(name), ctx()) if f.severity == "warning" and f.rule == "vram"]
        assert not warnings, (name, warnings)


def test_bad_gpu_memory_utilization_is_an_error(base_data: dict[str, Any]) -> None:
    r = recipe(base_data, args={"gpu-memory-utilization": 80}, footprint={"weights_gib": 1.0})
    assert found(check(r, ctx()), "vram", "error")


def test_shipped_recipes_have_no_errors() -> None:
    from g4build.recipes import load_recipe, recipe_names

    for name in recipe_names():
        r = load_recipe(name)
        assert not [f for f in check(r, ctx()) if f.severity == "error"], name
