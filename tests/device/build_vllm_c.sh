#!/usr/bin/env bash
# Real build of vLLM 0.21.0's _C extension for sm_120 through g4build (plan env + native executor), offline.
# Usage: tests/device/build_vllm_c.sh INPUTS_DIR [WORK_DIR] [JOBS] [TARGET] [LIMIT_S]
#   INPUTS_DIR holds the pin's sdist, deps/<name>.tar.xz (prefetched CMake dependencies) and patches/*.patch;
#   it may also hold toolkit/ and patches-data/ (a g4build checkout to use instead of this one).
set -euo pipefail
inputs=$(cd "$1" && pwd)
work=${2:-$(mktemp -d)}
jobs=${3:-16}
target=${4:-_C}
limit=${5:-3600}  # seconds for the compile step; what compiled so far is still reported
here=$(cd "$(dirname "$0")/../.." && pwd)
toolkit=$here/toolkit
if [ -d "$inputs/toolkit" ]; then toolkit=$inputs/toolkit; export G4BUILD_HOME=$inputs/home; fi
mkdir -p "$work"
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GB RAM; $(nvcc --version | tail -1)"
cmake --version | head -1; ninja --version
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
PYTHONPATH=$toolkit python "$here/tests/device/build_vllm_c.py" "$inputs" "$work" "$jobs" "$target" "$limit"
