#!/usr/bin/env bash
# Build vllm-flash-attn's FA2 library (_vllm_fa2_C) from source with its own CMake, offline, resumable.
#
#   build_fa2.sh MODE SRC_TAR WORK ARCHS JOBS [DEP_PATCH ...]
#
# MODE     proxy : apply tests/gpu/fa2_sm12x/fa2-sm12x-proxy.patch and keep only the head-128/256 units
#                  (the SM12x proxy of proxy_run.py); native : the whole library, no proxy patch.
# SRC_TAR  vllm-flash-attn at the commit the pin names, with csrc/cutlass/include (tar, any compression).
# WORK     build folder; running again with the same WORK continues where ninja stopped.
# ARCHS    TORCH_CUDA_ARCH_LIST, e.g. "9.0" (proxy on an H100) or "12.0" (native SM120 library).
# DEP_PATCH the dependency series' patches (g4build's patches for vllm-flash-attn), applied in order first.
# Writes WORK/build-info.json: source sha256, patches, configure/ninja times, step counts, the library path.
set -euo pipefail
mode=$1 src_tar=$2 work=$3 archs=$4 jobs=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
src_tar=$(realpath "$src_tar")
patches=()
for p in "$@"; do patches+=("$(realpath "$p")"); done
set -- "${patches[@]}"
proxy_patch=""
[[ $mode == proxy ]] && proxy_patch="$here/fa2-sm12x-proxy.patch"
mkdir -p "$work"
work=$(cd "$work" && pwd)
src="$work/src" build="$work/build" info="$work/build-info.json"
now() { date +%s.%N; }

if [[ ! -f "$src/.g4-ready" ]]; then
  rm -rf "$src" && mkdir -p "$src"
  tar -xf "$src_tar" -C "$src" --strip-components=1
  (cd "$src" && git init -q && git add -A && git -c user.email=g4@localhost -c user.name=g4 commit -qm pinned)
  for p in "$@" ${proxy_patch:+"$proxy_patch"}; do
    git -C "$src" apply "$p" || { echo "patch does not apply: $p" >&2; exit 4; }
    echo "applied $(basename "$p")"
  done
  if [[ $mode == proxy ]]; then
    # The proxy needs FA2 only (and the tar carries no FA3 sources): FA3 off whatever the arch list.
    sed -i 's/^set(FA3_ENABLED ON)$/set(FA3_ENABLED OFF)/' "$src/CMakeLists.txt"
    grep -q '^set(FA3_ENABLED OFF)$' "$src/CMakeLists.txt" || { echo "FA3 switch not found" >&2; exit 4; }
    find "$src/csrc/flash_attn/src" -name 'flash_fwd_*.cu' \
      ! -name '*hdim128_*' ! -name '*hdim256_*' -delete
  fi
  touch "$src/.g4-ready"
fi
units=$(find "$src/csrc/flash_attn/src" -name 'flash_fwd_*.cu' | wc -l)
echo "FA2 units: $units"

py=$(command -v python3)
t0=$(now)
if [[ ! -f "$build/build.ninja" ]]; then
  TORCH_CUDA_ARCH_LIST="$archs" cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DVLLM_PYTHON_EXECUTABLE="$py" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$work/configure.log" 2>&1 \
    || { tail -40 "$work/configure.log"; exit 3; }
fi
t1=$(now)
grep -E "FA2_ARCHS|FA3|CUDA supported target|CUDA target" "$work/configure.log" || true
set +e
# G4_NINJA_LIMIT_S stops ninja with SIGINT after that many seconds (finished objects stay; run again to go on).
TORCH_CUDA_ARCH_LIST="$archs" timeout -s INT "${G4_NINJA_LIMIT_S:-0}" ninja -C "$build" -j "$jobs" _vllm_fa2_C \
  >"$work/ninja.log" 2>&1
rc=$?
set -e
t2=$(now)
grep -oE '^\[[0-9]+/[0-9]+\]' "$work/ninja.log" | tail -1 || true
tail -3 "$work/ninja.log"
lib=$(find "$build" -name '_vllm_fa2_C*.so' | head -1)
fa3=$(grep -c 'hopper/' "$build/build.ninja" || true)
"$py" - "$info" "$src_tar" "$mode" "$archs" "$jobs" "$units" "$t0" "$t1" "$t2" "$rc" "${lib:-}" "$fa3" "$@" <<'EOF'
import hashlib, json, os, sys
info, tar, mode, archs, jobs, units, t0, t1, t2, rc, lib, fa3, *patches = sys.argv[1:]
old = json.load(open(info)) if os.path.exists(info) else {"runs": []}
old["runs"].append({"configure_s": round(float(t1) - float(t0), 1), "ninja_s": round(float(t2) - float(t1), 1),
                    "ninja_rc": int(rc)})
h = hashlib.sha256(open(tar, "rb").read()).hexdigest()
old.update({"mode": mode, "archs": archs, "jobs": int(jobs), "fa2_units": int(units), "source_sha256": h,
            "dep_patches": [{"name": os.path.basename(p), "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()}
                            for p in patches],
            "fa3_build_lines": int(fa3), "library": lib or None,
            "library_bytes": os.path.getsize(lib) if lib else None, "nproc": os.cpu_count()})
json.dump(old, open(info, "w"), indent=1)
EOF
exit $rc
