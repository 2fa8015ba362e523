#!/usr/bin/env bash
# Issue 51, point 2: the sm_90 build of the recipes' FlashInfer modules, installed beside the pin's
# flashinfer-python on the H200, serves the sampler with FlashInfer's JIT unavailable (nvcc off PATH,
# FLASHINFER_DISABLE_JIT=1, an empty JIT workspace): nothing is compiled, the library loaded is the jit-cache's.
# Usage: tests/device/flashinfer_aot_gpu_check.sh INPUTS [WORK] [RESULTS]
#   INPUTS/wh: flashinfer-python of the pin's version, apache-tvm-ffi (installed without their requirements:
#              torch, numpy, einops, nvidia-ml-py, tabulate come from the machine's Python), and
#              flashinfer_jit_cache-<ver>+g4jit.*-cp39-abi3-linux_x86_64.whl built with
#              `g4build flashinfer-aot --arch 9.0` (its record flashinfer-aot.json beside it, if any).
#   RESULTS: folder for flashinfer-aot-gpu.json (the probe's verdict) and the validate JSON.
# Optional: VLLM_MODEL=<tiny Gemma 4 folder> with vLLM installed also serves it twice in one engine: greedy
# (temperature 0: vLLM's argmax, FlashInfer not called) and temperature 1 with top_k=1, top_p=0.9 (FlashInfer's
# top_k_top_p_sampling_from_logits); the token ids must be equal. (Temperature 0 alone never reaches the sampler.)
set -euo pipefail
inputs=$(cd "$1" && pwd)
work=${2:-$inputs/work}
results=${3:-$work/results}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work" "$results"
work=$(cd "$work" && pwd)
results=$(cd "$results" && pwd)
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$inputs/wh PIP_DISABLE_PIP_VERSION_CHECK=1
jit=$(ls "$inputs"/wh/flashinfer_jit_cache-*.whl)
version=$(basename "$jit" | sed -E 's/^flashinfer_jit_cache-([^+]+)\+.*/\1/')
# a folder on PYTHONPATH, not a venv: the machine's python3 is itself a venv's, and a venv made over it with
# --system-site-packages sees the base interpreter's packages, not that venv's torch, filelock, ...
rm -rf "$work/site" && mkdir -p "$work/site"
export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
# --no-deps: wh/ holds what the machine lacks (flashinfer-python, apache-tvm-ffi of the version the jit-cache was
# built against); the rest FlashInfer imports (torch, numpy, einops, nvidia-ml-py, tabulate, click, tqdm) is the
# machine's. nvidia-cutlass-dsl and cudnn-frontend, which pip would pull in, are not imported by the sampler.
python -m pip install -q --no-deps --target "$work/site" "$inputs"/wh/flashinfer_python-"$version"-*.whl "$jit" "$inputs"/wh/apache_tvm_ffi-*.whl
python -c 'import flashinfer, flashinfer.sampling' || { echo "flashinfer does not import from wh/" >&2; exit 1; }
if command -v g4build >/dev/null; then
  g4build validate "$jit" --arch sm90a --trust-fatbin --json > "$results/flashinfer-jit-cache-validate.json" || true
fi
# JIT unavailable: no nvcc reachable, FlashInfer's own switch, no CUDA_HOME, a fresh workspace (no old cache)
clean_path=""
IFS=: read -ra parts <<< "$PATH"
for d in "${parts[@]}"; do
  [ -x "$d/nvcc" ] || clean_path="${clean_path:+$clean_path:}$d"
done
export PATH=$clean_path FLASHINFER_DISABLE_JIT=1 FLASHINFER_WORKSPACE_BASE=$work/fi-workspace
unset CUDA_HOME CUDA_PATH
rm -rf "$FLASHINFER_WORKSPACE_BASE" && mkdir -p "$FLASHINFER_WORKSPACE_BASE"
if command -v nvcc >/dev/null; then echo "nvcc still on PATH: $(command -v nvcc)" >&2; exit 1; fi
python "$here/tests/device/flashinfer_aot_probe.py" "$results/${G4_PROBE_NAME:-flashinfer-aot-gpu}.json" ${G4_PROBE_ARGS:-}
if [ -n "${VLLM_MODEL:-}" ]; then
  VLLM_USE_FLASHINFER_SAMPLER=1 python - "$VLLM_MODEL" "$results/flashinfer-aot-vllm.json" <<'EOF'
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True)
prompts = ["The capital of France is", "def fibonacci(n):"]
greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32))
sampled = llm.generate(prompts, SamplingParams(temperature=1.0, top_k=1, top_p=0.9, max_tokens=32, seed=0))
same = [list(g.outputs[0].token_ids) == list(s.outputs[0].token_ids) for g, s in zip(greedy, sampled)]
json.dump({"equal": same, "greedy": [g.outputs[0].text for g in greedy]}, open(sys.argv[2], "w"), indent=1)
print("vLLM: FlashInfer sampler (top_k=1) equal to greedy:", same)
sys.exit(0 if all(same) else 1)
EOF
  find "$FLASHINFER_WORKSPACE_BASE" -name '*.so' | tee "$results/compiled-during-vllm.txt"
  [ ! -s "$results/compiled-during-vllm.txt" ]
fi
