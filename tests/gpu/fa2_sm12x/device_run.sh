#!/usr/bin/env bash
# One device call of the FA2 work, within a fixed wall-clock budget (the machine keeps WORK between calls).
#
#   device_run.sh PHASE INPUTS WORK OUT BUDGET_S
#
# PHASE   proxy  : build the SM12x proxy library for sm_90 and run proxy_run.py on it (with compute-sanitizer);
#                  the native sm_120 library builds alongside at the lowest CPU priority, stopped in time.
#         native : go on with the native sm_120 library; when it is complete, read its archs (lib_archs.py).
# INPUTS  folder with vfa-*.tar.xz (vllm-flash-attn + csrc/cutlass/include) and the dependency series' *.patch.
# OUT     results: proxy JSON, build infos, ninja logs (.ninja_log: per-unit compile times), lib archs JSON.
set -uo pipefail
phase=$1 inputs=$2 work=$3 out=$4 budget=$5
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
src_tar=$(ls "$inputs"/vfa-*.tar.xz)
mapfile -t deps < <(ls "$inputs"/*.patch)
mkdir -p "$work" "$out"
left() { echo $((budget - SECONDS)); }
nproc; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer || true

native() {  # $1: seconds ninja may run
  G4_NINJA_LIMIT_S=$1 bash "$here/build_fa2.sh" native "$src_tar" "$work/native" 12.0 16 "${deps[@]}" \
    >>"$out/native-build.log" 2>&1
  echo "native build rc=$?" >>"$out/native-build.log"
}

if [[ $phase == proxy ]]; then
  ( renice -n 19 "$BASHPID" >/dev/null; native $((budget - 60)) ) &
  bg=$!
  G4_NINJA_LIMIT_S=$(( $(left) - 200 )) bash "$here/build_fa2.sh" proxy "$src_tar" "$work/proxy" 9.0 16 \
    "${deps[@]}" >"$out/proxy-build.log" 2>&1
  echo "proxy build rc=$?" | tee -a "$out/proxy-build.log"
  tail -5 "$out/proxy-build.log"
  lib=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["library"] or "")' "$work/proxy/build-info.json")
  if [[ -n $lib ]]; then
    sanitize_s=$(( ($(left) - 90) / 2 ))
    (( sanitize_s > 200 )) && sanitize_s=200
    python3 "$here/proxy_run.py" --lib "$lib" --build-info "$work/proxy/build-info.json" --sanitize --initcheck \
      --sanitize-timeout "$sanitize_s" --out "$out/fa2-sm12x-proxy.json" 2>&1 | tail -30
  fi
  wait "$bg"
  cp "$work/proxy/build-info.json" "$out/proxy-build-info.json" 2>/dev/null
  cp "$work/proxy/build/.ninja_log" "$out/proxy.ninja_log" 2>/dev/null
else
  native $(( $(left) - 40 ))
  tail -4 "$out/native-build.log"
  lib=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["library"] or "")' "$work/native/build-info.json")
  if [[ -n $lib ]]; then
    PYTHONPATH="$repo/toolkit" python3 "$here/lib_archs.py" "$lib" --arch sm_120 --arch sm_90 --arch sm_80 \
      --out "$out/fa2-sm120-lib-archs.json" | head -40
  fi
fi
cp "$work/native/build-info.json" "$out/native-build-info.json" 2>/dev/null
cp "$work/native/build/.ninja_log" "$out/native.ninja_log" 2>/dev/null
cp "$work/native/configure.log" "$out/native-configure.log" 2>/dev/null
cp "$work/proxy/configure.log" "$out/proxy-configure.log" 2>/dev/null
echo "phase $phase done at ${SECONDS}s"
