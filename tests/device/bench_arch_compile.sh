#!/usr/bin/env bash
# The arch-list benchmark on a many-core CUDA machine, offline: every arch-generic unit of vLLM's _C extension
# that the machine has cores for, compiled for upstream's default arch list and for the sm_120 plan, side by side.
# Usage: tests/device/bench_arch_compile.sh INPUTS [PARALLEL] [TIMEOUT_S] [JSON_OUT]
#   INPUTS holds sdists/<the pin's sdist> (a g4build cache layout) and cutlass.tar.xz (CUTLASS at the pin's tag).
set -euo pipefail
inputs=$(cd "$1" && pwd)
parallel=${2:-$(nproc)}
limit=${3:-400}
json=${4:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
mkdir -p "$work/cutlass" && tar xJf "$inputs/cutlass.tar.xz" -C "$work/cutlass"
export G4BUILD_CACHE=$inputs G4BUILD_TEST_TREES=$work/trees
if [ -d "$inputs/wh" ]; then  # an offline machine: g4build's requirements from carried wheels
  python -m pip install -q --no-index --find-links "$inputs/wh" platformdirs filelock pyyaml requests rich typer gitpython
fi
# vLLM's VLLM_EXT_SRC .cu units (compiled for every arch of the list), heaviest families first
units=(
  csrc/attention/paged_attention_v1.cu csrc/attention/paged_attention_v2.cu csrc/mamba/mamba_ssm/selective_scan_fwd.cu
  csrc/cache_kernels.cu csrc/quantization/gguf/gguf_kernel.cu csrc/quantization/gptq/q_gemm.cu
  csrc/layernorm_kernels.cu csrc/layernorm_quant_kernels.cu csrc/activation_kernels.cu csrc/pos_encoding_kernels.cu
  csrc/sampler.cu csrc/topk.cu csrc/attention/merge_attn_states.cu csrc/quantization/w8a8/fp8/common.cu
  csrc/quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu csrc/custom_all_reduce.cu
)
args=()
for u in "${units[@]:0:$parallel}"; do args+=(--unit "$u"); done
cd "$here"
python tests/benchmarks/bench_arch_compile.py --cutlass "$work/cutlass" --torch-headers --parallel "$parallel" \
  --timeout "$limit" "${args[@]}" ${json:+--json "$json"}
