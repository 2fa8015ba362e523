#!/usr/bin/env bash
# Real `g4build wheel` of vLLM 0.21.0 (our series applied) for sm_120 on Linux, offline, through the product's
# own CLI: plan -> native executor -> pip wheel -> validate -> build-manifest.json. Resumable: run it again with
# the same WORK folder and finished steps are skipped, ninja picks up where it stopped.
# Usage: tests/device/build_vllm_wheel.sh INPUTS [WORK] [LIMIT_S] [RESULTS]
#   INPUTS: wh/ (wheels of g4build's and vLLM's build requirements, for an offline pip), the pin's sdist,
#           deps/<FetchContent name>.tar.xz (prefetched CMake dependencies; missing ones become empty folders:
#           nothing of theirs compiles for sm_120).
#   LIMIT_S: stop the build after this many seconds (SIGINT to the whole build); what finished is kept.
#   RESULTS: folder for the small results (log tail, validate/manifest JSON, wheel listing, cubin archs).
# Environment: G4_ARCH (default sm120), G4_WHEEL_ARGS (more `g4build wheel` options, e.g. "--kernels gemma4
# --flash-attn 2"), G4_JOBS (default: the cores).
set -euo pipefail
arch=${G4_ARCH:-sm120}
read -r -a wheel_args <<< "${G4_WHEEL_ARGS:-}"
inputs=$(cd "$1" && pwd)
work=${2:-$inputs/work}
limit=${3:-3600}
results=${4:-$work/results}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work" "$results"
work=$(cd "$work" && pwd)  # absolute: the build's steps run in other folders
results=$(cd "$results" && pwd)
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$inputs/wh PIP_DISABLE_PIP_VERSION_CHECK=1
export G4BUILD_CACHE=$work/cache
if ! command -v g4build >/dev/null; then
  python -m pip install -q --no-build-isolation "$here"
fi
sdist=$(ls "$inputs"/vllm-*.tar.gz)
mkdir -p "$G4BUILD_CACHE/sdists"
[ -f "$G4BUILD_CACHE/sdists/$(basename "$sdist")" ] || cp "$sdist" "$G4BUILD_CACHE/sdists/"
# Fill g4build's dependency cache from the carried archives, as `g4build prefetch` would leave it.
python "$here/tests/device/fill_deps_cache.py" "$sdist" "$inputs/deps" "$G4BUILD_CACHE/deps"
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GB RAM; $(nvcc --version | tail -1)"
start=$(date +%s)
rc=0
timeout -s INT -k 30 "$limit" g4build wheel --arch "$arch" --os linux --no-flashinfer --jobs "${G4_JOBS:-$(nproc)}" \
  --root "$work/root" --out "$work/wheels" "${wheel_args[@]}" || rc=$?
echo "g4build wheel exited $rc after $(( $(date +%s) - start )) s"
# What the build left, whether it finished or not
state=$work/root/g4build-state.json
[ -f "$state" ] && cp "$state" "$results/"
log=$(find "$work/root/logs" -name "*vllm*.log" 2>/dev/null | head -1 || true)
if [ -n "$log" ]; then
  grep -E '^\[[0-9]+/[0-9]+\]' "$log" | tail -3 || true
  tail -c 200000 "$log" > "$results/vllm-build-log-tail.txt"
fi
for whl in "$work"/wheels/vllm-*.whl; do
  [ -f "$whl" ] || continue
  ls -l "$whl"
  python -m zipfile -l "$whl" | grep -E '\.so|build-manifest|METADATA' > "$results/wheel-listing.txt" || true
  g4build validate "$whl" --arch "$arch" --pin vllm-0.21.0 --json > "$results/validate.json" || true
  d=$(mktemp -d); python -m zipfile -e "$whl" "$d"
  for so in "$d"/vllm/*.so "$d"/vllm/*/*.so; do
    [ -f "$so" ] || continue
    echo "$(basename "$so"): $(cuobjdump --list-elf "$so" 2>/dev/null | grep -o 'sm_[0-9]*[af]*' | sort | uniq -c | tr '\n' ' ')"
  done | tee "$results/cubins.txt"
done
[ -f "$work/wheels/build-manifest.json" ] && cp "$work/wheels/build-manifest.json" "$results/"
exit "$rc"
