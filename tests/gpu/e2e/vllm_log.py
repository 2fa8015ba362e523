"""What vLLM 0.21.0 reports about memory at engine start, read from its log (pure: no vLLM, no torch).

The patterns follow the format strings of vLLM v0.21.0 (read in its sdist, not copied):
  vllm/v1/worker/gpu_model_runner.py  "Model loading took %s GiB memory and %.6f seconds"
                                      "Estimated CUDA graph memory: %.2f GiB total"
                                      "Graph capturing finished in %.0f secs, took %.2f GiB"
                                      "Failed to load model - not enough GPU memory. ..."
  vllm/v1/worker/gpu_worker.py        "Available KV cache memory: %s GiB"
                                      its profile result at DEBUG (VLLM_LOGGING_LEVEL=DEBUG), vllm/utils/mem_utils.py
                                      MemoryProfilingResult: "Memory profiling takes %.2f seconds. Total non KV
                                      cache memory: %sGiB; torch peak memory increase: %sGiB; non-torch forward
                                      increase memory: %sGiB; weights memory: %sGiB."
                                      "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: ..."
  vllm/v1/worker/utils.py             "Free memory on device ... is less than desired GPU memory utilization ..."
  vllm/v1/core/kv_cache_utils.py      "GPU KV cache size: %s tokens" (thousands separated by commas)
                                      "Maximum concurrency for %s tokens per request: %.2fx"
                                      "No available memory for the cache blocks. ..."
                                      "To serve at least one request with the models's max seq len (%d), (%s GiB KV
                                       cache is needed, which is larger than the available KV cache memory (%s GiB).
                                       [Based on the available memory, the estimated maximum model length is %d. ]..."
                                      "Cannot auto-fit max_model_len: not enough GPU memory available ..."
  vllm/v1/engine/utils.py             "Engine core initialization failed. See root cause above. ..."
  torch                               "CUDA out of memory. Tried to allocate ..."
GiB figures are vLLM's format_gib: bytes / 2**30 rounded to 2 decimals.
"""

from __future__ import annotations

import re
from typing import Any

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_SIGNED = r"(-?[0-9]+(?:\.[0-9]+)?)"  # the available KV memory is logged before the check, below zero too
INFO = {
    "weights": re.compile(rf"Model loading took {_NUM} GiB memory and {_NUM} seconds"),
    "available_kv": re.compile(rf"Available KV cache memory: {_SIGNED} GiB"),
    "kv_tokens": re.compile(r"GPU KV cache size: ([0-9][0-9,]*) tokens"),
    "concurrency": re.compile(rf"Maximum concurrency for ([0-9][0-9,]*) tokens per request: {_NUM}x"),
    "graph_estimate": re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB total"),
    "graph_pool": re.compile(rf"CUDA graph pool memory: {_NUM} GiB \(actual\), {_NUM} GiB \(estimated\)"),
    "graph_capture": re.compile(rf"Graph capturing finished in {_NUM} secs, took {_NUM} GiB"),
    "profile": re.compile(rf"Total non KV cache memory: {_NUM} ?GiB; torch peak memory increase: {_SIGNED} ?GiB; "
                          rf"non-torch forward increase memory: {_SIGNED} ?GiB"),
}

# First match in this order names the failure: the specific causes before the generic "see above" lines.
ERRORS = (
    ("kv_too_small", re.compile(
        r"To serve at least one request with the models's max seq len \(([0-9]+)\), \(" + _NUM + r" GiB KV cache is "
        r"needed, which is larger than the available KV cache memory \(" + _NUM + r" GiB\)\.(?: Based on the "
        r"available memory, the estimated maximum model length is ([0-9]+)\.)?")),
    ("no_kv_memory", re.compile(r"No available memory for the cache blocks\.")),
    ("load_oom", re.compile(r"Failed to load model - not enough GPU memory\.")),
    ("free_memory", re.compile(r"on startup is less than desired GPU memory utilization")),
    ("auto_fit", re.compile(r"Cannot auto-fit max_model_len: not enough GPU memory")),
    ("oom", re.compile(r"CUDA out of memory\.")),
)
_GENERIC = re.compile(r"\b[A-Za-z_.]*(?:Error|Exception): \S")
_ENGINE_FAILED = re.compile(r"Engine core initialization failed\.")
# "(EngineCore pid=1007) INFO 11-23 19:05:49 [gpu_model_runner.py:6145] " and the like: dropped from error text
_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:[A-Z]+ [0-9]{2}-[0-9]{2} [0-9:.]+ \[[^\]]*\]\s*)?")


def _f(text: str) -> float:
    return float(text.replace(",", ""))


def message(line: str) -> str:
    """A log line without vLLM's process tag, level, time and source location."""
    return _PREFIX.sub("", line.strip())


def parse(text: str) -> dict[str, Any]:
    """The memory figures vLLM logged (None where it did not get that far) and, if it failed, why."""
    out: dict[str, Any] = {"weights_gib": None, "load_s": None, "available_kv_gib": None, "kv_tokens": None,
                           "concurrency_context": None, "max_concurrency": None, "graph_estimate_gib": None,
                           "graph_pool_gib": None, "graph_capture_gib": None, "non_kv_gib": None,
                           "torch_peak_increase_gib": None, "non_torch_increase_gib": None}
    for line in text.splitlines():
        for key, pat in INFO.items():
            m = pat.search(line)
            if m is None:
                continue
            if key == "weights" and out["weights_gib"] is None:
                out["weights_gib"], out["load_s"] = _f(m.group(1)), _f(m.group(2))
            elif key == "available_kv":
                out["available_kv_gib"] = _f(m.group(1))
            elif key == "kv_tokens":
                out["kv_tokens"] = int(_f(m.group(1)))
            elif key == "concurrency":
                out["concurrency_context"], out["max_concurrency"] = int(_f(m.group(1))), _f(m.group(2))
            elif key == "graph_estimate":
                out["graph_estimate_gib"] = _f(m.group(1))
            elif key == "graph_pool":
                out["graph_pool_gib"] = _f(m.group(1))
            elif key == "graph_capture":
                out["graph_capture_gib"] = _f(m.group(2))
            elif key == "profile":  # what the budget less the KV cache went to: weights, activations, the rest
                out["non_kv_gib"], out["torch_peak_increase_gib"], out["non_torch_increase_gib"] = (
                    _f(m.group(1)), _f(m.group(2)), _f(m.group(3)))
    out.update(failure(text))
    return out


def failure(text: str) -> dict[str, Any]:
    """{"error_kind", "error", "estimated_max_model_len", "kv_needed_gib"}: the first known cause in the log,
    else the last exception line, else the engine's "initialization failed"; all None for a clean log."""
    lines = text.splitlines()
    out: dict[str, Any] = {"error_kind": None, "error": None, "estimated_max_model_len": None, "kv_needed_gib": None}
    for kind, pat in ERRORS:
        for line in lines:
            m = pat.search(line)
            if m is None:
                continue
            out["error_kind"], out["error"] = kind, message(line)[:600]
            if kind == "kv_too_small":
                out["kv_needed_gib"] = _f(m.group(2))
                out["estimated_max_model_len"] = int(m.group(4)) if m.group(4) else None
            return out
    generic = [ln for ln in lines if _GENERIC.search(ln)]
    if generic:
        out["error_kind"], out["error"] = "other", message(generic[-1])[:600]
    elif any(_ENGINE_FAILED.search(ln) for ln in lines):
        out["error_kind"], out["error"] = "other", "Engine core initialization failed (no cause in the log)"
    return out
