#!/usr/bin/env bash
# Whole-wheel compile work on a build machine: upstream's default arch list on the pristine vLLM 0.21.0 tree
# against g4build's sm_120 plan (series + build series, through the product's own commands), both configured by
# the real CMake, units counted from build.ninja, sampled units timed with their generated commands.
# Usage: tests/device/bench_wheel_compile_work.sh INPUTS [WORK] [SAMPLE] [PARALLEL] [RESULTS] [FAMILY...]
#   INPUTS: as for build_vllm_wheel.sh (wh/ wheels for an offline pip, the pin's sdist, deps/<name>.tar.xz).
#   SAMPLE: units timed per family and configuration (default 1; 0: count only); PARALLEL: compiles at once
#           (default: cores). BENCH_TIMEOUT: seconds one sampled compile may take; BENCH_SKIP_UPSTREAM: see below.
#   FAMILY: only time families whose name contains one of these (e.g. _vllm_fa2_C _C:csrc/quantization/marlin);
#           the count still covers every unit, untimed families take their configuration's mean.
set -euo pipefail
inputs=$(cd "$1" && pwd)
work=${2:-$inputs/work-compile}
sample=${3:-1}
parallel=${4:-$(nproc)}
results=${5:-$work/results}
shift $(( $# < 5 ? $# : 5 ))
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work" "$results"
work=$(cd "$work" && pwd)
results=$(cd "$results" && pwd)
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$inputs/wh PIP_DISABLE_PIP_VERSION_CHECK=1
export G4BUILD_CACHE=$work/cache
command -v g4build >/dev/null || python -m pip install -q --no-build-isolation "$here"
sdist=$(ls "$inputs"/vllm-*.tar.gz)
mkdir -p "$G4BUILD_CACHE/sdists"
[ -f "$G4BUILD_CACHE/sdists/$(basename "$sdist")" ] || cp "$sdist" "$G4BUILD_CACHE/sdists/"
python "$here/tests/device/fill_deps_cache.py" "$sdist" "$inputs/deps" "$G4BUILD_CACHE/deps"
pin=vllm-0.21.0
bench="python $here/tests/benchmarks/bench_wheel_compile_work.py"
echo "host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GB RAM; $(nvcc --version | tail -1)"
t0=$(date +%s)
# upstream: the pristine sdist, the pristine dependencies
if [ ! -d "$work/up-src" ]; then
  g4build source fetch --pin $pin --from sdist --dest "$work/up-src"
  # BENCH_SKIP_UPSTREAM="deepgemm flashmla": leave out dependencies whose sources were not carried (upstream's
  # list compiles them for 9.0a/10.0f; the plan builds none of them), so upstream's work is undercounted and
  # every ratio below is a lower bound; said in the output
  for dep in ${BENCH_SKIP_UPSTREAM:-}; do
    sed -i "s|^\( *\)include(cmake/external_projects/$dep.cmake)|\1# bench: $dep not carried|" \
      "$work/up-src/CMakeLists.txt"
    echo "upstream configure without $dep (its units are not counted: ratios are lower bounds)"
  done
fi
g4build prefetch --tree "$work/up-src" --cache "$G4BUILD_CACHE/deps" --write "$work/up-deps.cmake"
# plan: what `g4build wheel --arch sm120` builds (series, prefetch, build series)
if [ ! -d "$work/plan-src" ]; then
  g4build source fetch --pin $pin --from sdist --dest "$work/plan-src"
  g4build patches apply --pin $pin --tree "$work/plan-src"
fi
g4build prefetch --tree "$work/plan-src" --cache "$G4BUILD_CACHE/deps" --write "$work/plan-deps.cmake"
g4build deps apply --pin $pin --tree "$work/plan-src" --cache "$G4BUILD_CACHE/deps" --write "$work/plan-deps.cmake"
plan_json=$(g4build wheel --arch sm120 --os linux --no-flashinfer --dry-run --json)
plan_list=$(python -c 'import json,sys; print(json.load(sys.stdin)["env"]["TORCH_CUDA_ARCH_LIST"])' <<< "$plan_json")
# the kernel profile the bare command resolves to (gemma4 for sm120) and FA2's head dims, as the build passes them
plan_defines=()
while IFS= read -r d; do [ -z "$d" ] || plan_defines+=(--define "$d"); done < <($bench plan-defines <<< "$plan_json")
for tree in up-src plan-src; do  # what vLLM's configure runs in Python (Marlin/Machete generators)
  (cd "$work/$tree" && python use_existing_torch.py >/dev/null && python -m pip install -q -r requirements/build/cuda.txt)
done
$bench configure --tree "$work/up-src" --build "$work/up-build" --arch-list "7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0+PTX" \
  --deps-file "$work/up-deps.cmake" | tee "$results/configure-upstream.txt"
$bench configure --tree "$work/plan-src" --build "$work/plan-build" --arch-list "$plan_list" \
  --deps-file "$work/plan-deps.cmake" "${plan_defines[@]}" | tee "$results/configure-plan.txt"
$bench count --upstream "$work/up-build" --plan "$work/plan-build" --json "$results/count.json" \
  | tee "$results/count.txt"
if [ "$sample" = 0 ]; then echo "SAMPLE=0: counted, nothing timed; done in $(( $(date +%s) - t0 )) s"; exit 0; fi
families=()
for f in "$@"; do families+=(--family "$f"); done
$bench measure --upstream "$work/up-build" --plan "$work/plan-build" --sample "$sample" --parallel "$parallel" \
  --timeout "${BENCH_TIMEOUT:-900}" "${families[@]}" --json "$results/times.json" > "$results/measure.txt"
$bench count --upstream "$work/up-build" --plan "$work/plan-build" --times "$results/times.json" \
  --json "$results/work.json" | tee "$results/work.txt"
echo "done in $(( $(date +%s) - t0 )) s"
