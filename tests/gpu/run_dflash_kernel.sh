#!/usr/bin/env bash
# Check the DFlash input-expansion kernel with real Triton on a CUDA GPU, once per kernel source given
# (each a vllm/v1/spec_decode/utils.py, e.g. from trees patched by `g4build patches apply`).
#   tests/gpu/run_dflash_kernel.sh TREE/vllm/v1/spec_decode/utils.py [...]
# Prefix a source with "expect-fail:" for a negative control: a kernel that must FAIL a check (e.g. one whose
# rejected context rows get slot -1, as the dropped 0002 of dflash-batched-verification v1 did).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"' || exit 2
status=0
for arg in "$@"; do
  src=${arg#expect-fail:}
  python "$here/run_dflash_kernel.py" --kernel-source "$src" --device cuda
  rc=$?
  if [ "$arg" != "$src" ]; then
    if [ $rc -eq 1 ]; then echo "expected failure: ok"; else echo "expected a failed check, got rc=$rc"; status=1; fi
  elif [ $rc -ne 0 ]; then
    status=1
  fi
done
exit $status
