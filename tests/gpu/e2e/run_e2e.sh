#!/usr/bin/env bash
# Gemma 4 + DFlash on the registry vLLM 0.21.0 wheel, pristine and overlaid by g4build, on a CUDA machine with
# torch 2.11 (vLLM 0.21.0's torch) and no network. Run from the repository root:
#
#   tests/gpu/e2e/run_e2e.sh STEP [STEP...]
#
# Steps (each can be its own call; state lives in $G4E2E_STAGE, default /tmp/g4e2e):
#   stash          copy the wheel parts carried in .device/e2e/<n>/ (G4E2E_PARTS names another folder) into the
#                  stage (parts.py checks each); the parts of a pin's torch bundle too (G4E2E_TORCH_PARTS)
#   torch          a pin with its own torch (tests/gpu/e2e/torch-wheels-<pin>.txt: 0.29.0, 0.33.0): cut the bundle
#                  into its wheels, check each against the list, install them into $stage/torch-site, which every
#                  later engine step puts first on PYTHONPATH; then probe
#   probe          the torch, triton, NCCL, cuDNN and vLLM the engine steps import, and a CUDA matmul
#   deps           install the carried dependency wheels (.whl/, listed in tests/gpu/e2e/device-wheels.txt)
#   prepare        join the parts (sha256 against patches/pins.yaml), install g4build, install the pristine
#                  wheel, make the overlaid wheel with `g4build overlay` + `g4build validate`, install it,
#                  write the tiny models
#   built          instead of prepare: install g4build and the wheel `g4build wheel` built (G4E2E_WHEEL: its
#                  path), validate it, record its file name, sha256 and manifest digest (runs/built.json); the
#                  engine and serve steps then run it, and serve renders its launch script with --wheel
#   pristine       DFlash with attention_backend flash_attn on the pristine wheel (expected to fail)
#   baseline       the target alone on the overlaid wheel (greedy reference)
#   dflash | mtp   speculative decoding on the overlaid wheel
#   kernel         mm-prefix-fa against a dense reference on the wheel's FlashAttention kernels
#   report         tests/gpu/results/vllm-0.21.0-e2e.json from the runs (also copied to $OUT when set)
#   sliding-fa     the target alone, every layer on Triton, then its sliding layers on FlashAttention (two engine
#                  starts, sliding_fa_runs.py; G4E2E_FA_VERSION=2 forces FA2, results NAME-fa2; G4E2E_REPEAT=N
#                  names a repetition of a pair, NAME-rN)
#   sliding-fa-report  tests/gpu/results/vllm-0.21.0-sliding-fa.json from those runs (sliding_fa_report.py)
#   train          train the tiny target and its DFlash drafter, reference acceptance (train_models.py)
#   train-bg       the same in the background: bg:train (it outlives the call; keep the machine with calls back to back)
#   train-wait     wait for train-bg: wait:train (G4E2E_TRAIN_WAIT seconds, default 480)
#   reference      the reference acceptance of $stage/trained (copied from a carried .device/trained if absent)
#   reference-mtp  the MTP drafter's reference acceptance of a carried, already trained $stage/trained/mtp
#   per-layer-config  drop the explicit `per_layer_config: null` from the targets' text_config (trained and tiny):
#                  vLLM 0.33.0 builds each Gemma 4 layer from per_layer_config[i].head_dim, and the null that keeps
#                  0.21.0 able to read head_dim makes it build the full layers at 256 instead of 512
#   train-mtp      train the gemma4_assistant MTP drafter on the trained target, and its reference (train_mtp.py)
#   acc:VARIANT:PHASES  one engine start with the trained models (acceptance_runs.py; phases comma-separated):
#                  results under $stage/acc/, brought back as acc.tgz
#   bg:A+B+...     run steps A, B, ... in the background, in order (they outlive the call; keep the machine with
#                  calls back to back); wait:A+B+... waits for them (G4E2E_TRAIN_WAIT seconds, default 480)
#   serve-deps     install the server's dependency wheels (.device/serve-whl/, tests/gpu/e2e/serve-wheels.txt; carried
#                  with any transfer: stash keeps them)
#   fit:RECIPE:CARD_GIB  RECIPE's launch script as rendered, in CARD_GIB's share of this GPU, stepping context and
#                  max-num-seqs down until it starts (card_fit.py; real_size.py's folders in $stage/real; results
#                  $stage/acc/fit-RECIPE-CARD[-$G4E2E_FIT_LABEL].json; more card_fit.py arguments in G4E2E_FIT_ARGS)
#   cost:VARIANT   step costs of real_size.py's 26B-A4B shapes with random weights, VARIANT target, dflash-K or
#                  mtp-K (step_costs.py run; results $stage/acc/cost-VARIANT[-$G4E2E_COST_LABEL].json; more
#                  step_costs.py arguments in G4E2E_COST_ARGS, e.g. --mtp-folder mtp-standin); fold them here;
#                  cost:VARIANT:LABEL names the result cost-VARIANT-LABEL and adds G4E2E_COST_ARGS_<LABEL>
#   serve:RECIPE:DRAFTER  render RECIPE's bash launch script with `g4build recipe render`, run it, talk to the
#                  `vllm serve` it starts (serve_route.py; results in $stage/acc/serve-DRAFTER.json)
#
# G4E2E_NUMERICS=batch-invariant runs the engine steps under vLLM's VLLM_BATCH_INVARIANT=1 (results NAME-bi);
# batch-invariant-casts adds Inductor's emulate_precision_casts (NAME-bi-casts), batch-invariant-eager the
# "eager" compile backend (NAME-bi-eager): the bit-exact lossless checks (engine_runs.py says why).
# G4E2E_DTYPE=float16 runs them in fp16 (results NAME-float16).
# G4E2E_RETENTION=rendered runs the acc: steps with the --prefix-cache-retention-interval that `g4build recipe
# render` writes into the pin's DFlash and MTP launch scripts (results NAME-retention); None or a number of tokens
# sets that value (NAME-retentionVALUE).
#
# Every step writes its JSON and log under the stage; a failed run is recorded, not fatal, so one call
# brings back everything that could run.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here=$repo/tests/gpu/e2e
stage=${G4E2E_STAGE:-/tmp/g4e2e}
pin=${G4E2E_PIN:-vllm-0.21.0}
py=${PYTHON:-python3}
run_limit=${G4E2E_RUN_LIMIT:-420}
mkdir -p "$stage/runs" "$stage/logs"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
export CUDA_CACHE_PATH=$stage/cuda-cache CUDA_CACHE_MAXSIZE=4294967296
export VLLM_CACHE_ROOT=$stage/vllm-cache TRITON_CACHE_DIR=$stage/triton-cache
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# FlashInfer is not installed (its kernels do not serve this check); 0.21.0 imports it for the sampler by default.
# VLLM_USE_FLASHINFER_SAMPLER=1 from the caller, with FlashInfer staged in $stage/flashinfer (flashinfer-python and
# a g4build jit-cache: wheel_runs_session.sh flashinfer), runs the acc: steps on FlashInfer's sampler (NAME-fi; the sampler phase alone: NAME-sampler)
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
if [ -f "$repo/tests/gpu/e2e/torch-wheels-$pin.txt" ]; then
  # the pin's carried torch runs on the machine's cuDNN 9.19, older than the one it was built with, which torch
  # refuses by default; the pin's results are made on that pairing (probe records both versions)
  export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
fi

runpath() {  # WHEEL [MORE...]: PYTHONPATH of an engine step: the pin's own torch stack first once the torch
  # step installed it, then the installed vLLM wheel (pristine | patched), the dependency wheels and MORE
  local out=
  [ ! -d "$stage/torch-site" ] || out=$stage/torch-site:
  out=$out$stage/$1:$stage/deps
  [ "$VLLM_USE_FLASHINFER_SAMPLER" != 1 ] || [ ! -d "$stage/flashinfer" ] || out=$out:$stage/flashinfer
  shift
  local more
  for more in "$@"; do out=$out:$more; done
  printf '%s' "$out"
}

say() { printf '[e2e %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

publish() {  # small results back to the caller when $OUT exists (the device tool's return folder)
  [ -n "${OUT:-}" ] || return 0
  cp "$stage"/runs/*.json "$OUT"/ 2>/dev/null || true
  (cd "$stage" && tar -czf "$OUT/logs.tgz" logs runs/*.log 2>/dev/null) || true
  [ ! -d "$stage/acc" ] || (cd "$stage" && tar -czf "$OUT/acc.tgz" acc) || true
}
trap publish EXIT
trap 'exit 143' TERM INT

step_stash() {
  if [ -d "$repo/.device/serve-whl" ]; then mkdir -p "$stage/whl-serve" && cp "$repo"/.device/serve-whl/*.whl "$stage/whl-serve/"; fi
  "$py" "$here/parts.py" stash "$repo/${G4E2E_PARTS:-.device/e2e}" --stage "$stage/parts" || return $?
  if [ -n "${G4E2E_TORCH_PARTS:-}" ]; then
    "$py" "$here/parts.py" stash "$repo/$G4E2E_TORCH_PARTS" --stage "$stage/torch-parts" || return $?
  fi
}

step_torch() {  # the pin's torch stack: bundle -> wheels (each checked against the list) -> $stage/torch-site
  local list=$here/torch-wheels-$pin.txt
  [ -f "$list" ] || { echo "step torch: no $(basename "$list"); $pin runs on the machine's own torch"; return 7; }
  "$py" "$here/parts.py" unbundle --stage "$stage/torch-parts" --dest "$stage/torch-whl" || return $?
  install_listed "$list" "$stage/torch-whl" "$stage/torch-site" "$stage/logs/torch.log" || return $?
  step_probe
}

step_probe() {  # what the engine steps will import, written to runs/probe.json
  PYTHONPATH=$(runpath patched) "$py" - "$stage/runs/probe.json" <<'PY'
import json, sys
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "torch_file": torch.__file__}
import triton
out["triton"] = triton.__version__
out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
out["cudnn"] = torch.backends.cudnn.version()
out["device"] = torch.cuda.get_device_name()
x = torch.randn(512, 512, device="cuda")
out["matmul_ok"] = bool(torch.allclose((x @ x).cpu(), x.cpu() @ x.cpu(), atol=1e-2, rtol=1e-2))
try:
    import torchvision
    out["torchvision"] = torchvision.__version__
except Exception as exc:  # recorded: the engine steps may not need it
    out["torchvision"] = f"{type(exc).__name__}: {exc}"
try:
    import vllm
    out["vllm"] = vllm.__version__
except Exception as exc:
    out["vllm"] = f"{type(exc).__name__}: {exc}"
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out))
PY
}

step_serve_deps() {  # the server's wheels (uvicorn, aiohttp, mistral_common, ...), stashed by any transfer
  install_listed "$(wheel_list serve-wheels)" "$stage/whl-serve" "$stage/deps-serve" "$stage/logs/serve-deps.log"
}

wheel_list() {  # BASENAME: the pin's own list (BASENAME-<pin>.txt) where there is one, else BASENAME.txt
  if [ -f "$here/$1-$pin.txt" ]; then echo "$here/$1-$pin.txt"; else echo "$here/$1.txt"; fi
}

install_listed() {  # LIST DIR TARGET LOG: check every listed wheel's sha256, install exactly those
  local list=$1 dir=$2 target=$3 log=$4 name sum missing=0
  local -a files=()
  while read -r name sum; do
    case $name in ''|'#'*) continue ;; esac
    if [ ! -f "$dir/$name" ]; then echo "missing wheel: $dir/$name ($(basename "$list"))"; missing=1; continue; fi
    if [ "$(sha256sum "$dir/$name" | cut -d' ' -f1)" != "$sum" ]; then
      echo "wheel $name: sha256 differs from $(basename "$list")"; missing=1; continue
    fi
    files+=("$dir/$name")
  done < "$list"
  [ "$missing" -eq 0 ] || return 4
  rm -rf "$target.tmp"
  "$py" -m pip install -q --no-deps --no-compile --target "$target.tmp" "${files[@]}" > "$log" 2>&1 \
    || { tail -20 "$log"; return 9; }
  rm -rf "$target" && mv "$target.tmp" "$target"
  say "installed ${#files[@]} wheels of $(basename "$list") into $target"
}

step_deps() {
  install_listed "$(wheel_list device-wheels)" "$repo/.whl" "$stage/deps" "$stage/logs/deps.log"
}

g4build() { PYTHONPATH=$stage/g4:$stage/deps "$py" -m g4build "$@"; }

install_wheel() {  # WHEEL DEST
  rm -rf "$2.tmp" && "$py" -m pip install -q --no-deps --no-compile --target "$2.tmp" "$1" \
    && rm -rf "$2" && mv "$2.tmp" "$2"
}

step_built() {  # the wheel `g4build wheel` built, as the engine steps' "patched" wheel
  local whl=${G4E2E_WHEEL:-}
  [ -f "$whl" ] || { echo "step built: G4E2E_WHEEL names no file ($whl)"; return 7; }
  if [ -d "$stage/patched" ] && [ "$(cat "$stage/built-wheel" 2>/dev/null)" = "$whl" ]; then
    say "built wheel $(basename "$whl") already installed"; return 0
  fi
  if [ ! -d "$stage/g4" ]; then
    "$py" -m pip install -q --no-deps --no-build-isolation --target "$stage/g4" "$repo" \
      > "$stage/logs/g4build-install.log" 2>&1 || { tail -20 "$stage/logs/g4build-install.log"; return 9; }
  fi
  g4build validate "$whl" --pin "$pin" --json > "$stage/runs/validate.json" 2> "$stage/logs/validate.log" \
    || { tail -20 "$stage/logs/validate.log"; return 10; }
  say "installing the built wheel $(basename "$whl")"
  install_wheel "$whl" "$stage/patched" || return 9
  "$py" - "$whl" "$stage/runs/built.json" <<'PY'
import hashlib, json, sys, zipfile
from pathlib import Path
whl = Path(sys.argv[1])
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/build-manifest.json"))
    manifest = json.loads(z.read(name))
out = {"file": whl.name, "sha256": hashlib.sha256(whl.read_bytes()).hexdigest(), "bytes": whl.stat().st_size,
       "manifest_digest": manifest.get("digest"), "build_options": manifest.get("build_options"),
       "arch": manifest.get("arch") or manifest.get("target", {}).get("arch")}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(out))
PY
  printf '%s\n' "$whl" > "$stage/built-wheel"
}

step_prepare() {
  "$py" "$here/parts.py" join --stage "$stage/parts" --pin "$pin" --dest "$stage/wheel" || return $?
  local whl
  whl=$(ls "$stage"/wheel/vllm-*.whl)
  if [ ! -d "$stage/g4" ]; then
    "$py" -m pip install -q --no-deps --no-build-isolation --target "$stage/g4" "$repo" \
      > "$stage/logs/g4build-install.log" 2>&1 || { tail -20 "$stage/logs/g4build-install.log"; return 9; }
  fi
  say "installing the pristine wheel"
  [ -d "$stage/pristine" ] || install_wheel "$whl" "$stage/pristine" || return 9
  say "g4build overlay"
  rm -rf "$stage/overlaid"
  g4build overlay "$whl" --pin "$pin" --out "$stage/overlaid" --json > "$stage/runs/overlay.json" \
    2> "$stage/logs/overlay.log" || { tail -20 "$stage/logs/overlay.log"; return 10; }
  local patched
  patched=$(ls "$stage"/overlaid/vllm-*.whl)
  g4build validate "$patched" --pin "$pin" --json > "$stage/runs/validate.json" 2> "$stage/logs/validate.log" \
    || { tail -20 "$stage/logs/validate.log"; return 10; }
  say "installing the overlaid wheel $(basename "$patched")"
  install_wheel "$patched" "$stage/patched" || return 9
  "$py" "$here/tiny_models.py" "$stage/models" > "$stage/logs/models.log" 2>&1 \
    || { tail -20 "$stage/logs/models.log"; return 1; }
  say "prepared: $(du -sh "$stage/pristine" "$stage/patched" | tr '\n' ' ')"
}

run_suffix() {  # the result-name suffix of G4E2E_DTYPE and G4E2E_NUMERICS (-float16, -bi, ...)
  local suffix=
  [ -z "${G4E2E_DTYPE:-}" ] || [ "$G4E2E_DTYPE" = bfloat16 ] || suffix=-$G4E2E_DTYPE
  case ${G4E2E_NUMERICS:-default} in
    default) ;;
    batch-invariant) suffix=$suffix-bi ;;
    batch-invariant-casts) suffix=$suffix-bi-casts ;;
    batch-invariant-eager) suffix=$suffix-bi-eager ;;
    *) echo "G4E2E_NUMERICS=$G4E2E_NUMERICS: expected default, batch-invariant, batch-invariant-casts or" \
         "batch-invariant-eager" >&2; return 2 ;;
  esac
  printf '%s' "$suffix"
}

engine_run() {  # NAME VARIANT MODE (G4E2E_DTYPE=float16: NAME-float16; G4E2E_NUMERICS=batch-invariant: NAME-bi)
  local name=$1 variant=$2 mode=$3 start rc=0 suffix
  suffix=$(run_suffix) || return 2
  name=$name$suffix
  [ -d "$stage/$variant" ] || { echo "step $name: $variant wheel not installed (run prepare first)"; return 7; }
  say "run $name ($mode on the $variant wheel)"
  start=$(date +%s)
  PYTHONPATH=$(runpath "$variant") timeout -k 20 "$run_limit" "$py" "$here/engine_runs.py" \
    --mode "$mode" --models "$stage/models" --json "$stage/runs/$name.json" \
    ${G4E2E_GPU_MEM:+--gpu-memory-utilization "$G4E2E_GPU_MEM"} > "$stage/logs/$name.log" 2>&1 || rc=$?
  say "run $name exited $rc after $(( $(date +%s) - start )) s"
  tail -5 "$stage/logs/$name.log"
  if [ ! -s "$stage/runs/$name.json" ]; then  # killed before the script could write: record that much
    "$py" - "$stage/runs/$name.json" "$mode" "$rc" "$stage/logs/$name.log" <<'PY'
import json, sys
path, mode, rc, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-4000:]
json.dump({"mode": mode, "ok": False, "error": f"runner exited {rc} without a result", "log_tail": tail},
          open(path, "w"), indent=1)
PY
  fi
}

sliding_fa_suffix() {  # run_suffix, then -faN (G4E2E_FA_VERSION) and -rN (G4E2E_REPEAT): one name per pair
  local suffix
  suffix=$(run_suffix) || return 2
  case ${G4E2E_FA_VERSION:-} in
    '') ;;
    2|3) suffix=$suffix-fa$G4E2E_FA_VERSION ;;
    *) echo "G4E2E_FA_VERSION=$G4E2E_FA_VERSION: expected 2 or 3 (or unset: vLLM's choice)" >&2; return 2 ;;
  esac
  case ${G4E2E_REPEAT:-1} in
    1) ;;
    [2-9]|[1-9][0-9]) suffix=$suffix-r$G4E2E_REPEAT ;;
    *) echo "G4E2E_REPEAT=$G4E2E_REPEAT: expected a repetition number from 1 to 99" >&2; return 2 ;;
  esac
  printf '%s' "$suffix"
}

sliding_fa_run() {  # VARIANT (triton | fa): the target alone on the overlaid wheel, one engine start
  local variant=$1 name start rc=0 suffix
  suffix=$(sliding_fa_suffix) || return 2
  name=sliding-fa-$variant$suffix
  [ -d "$stage/patched" ] || { echo "step $name: overlaid wheel not installed (run prepare first)"; return 7; }
  say "run $name"
  start=$(date +%s)
  # the e2e folder on the path: the engine core process unpickles the functions sent to it by reference too
  PYTHONPATH=$(runpath patched "$here") timeout -k 20 "$run_limit" "$py" "$here/sliding_fa_runs.py" \
    --variant "$variant" --models "$stage/models" --json "$stage/runs/$name.json" > "$stage/logs/$name.log" 2>&1 \
    || rc=$?
  say "run $name exited $rc after $(( $(date +%s) - start )) s"
  tail -3 "$stage/logs/$name.log"
}

step_sliding_fa() {  # Triton first, then FlashAttention: side by side in one call, on one warm machine
  sliding_fa_run triton
  sliding_fa_run fa
}

step_sliding_fa_report() {
  "$py" "$here/sliding_fa_report.py" --runs "$stage/runs" --out "$repo/tests/gpu/results" || return $?
  [ -z "${OUT:-}" ] || cp "$repo"/tests/gpu/results/vllm-0.21.0-sliding-fa.json "$OUT"/
}

# --- trained models and acceptance (train_models.py, acceptance_runs.py) ---
step_train() {  # in the foreground
  mkdir -p "$stage/acc"
  say "training the tiny target and its DFlash drafter"
  "$py" "$here/train_models.py" "$stage/trained" ${G4E2E_TRAIN_ARGS:-} > "$stage/logs/train.log" 2>&1 \
    || { tail -30 "$stage/logs/train.log"; return 1; }
  cp "$stage/trained/train.json" "$stage/trained/reference.json" "$stage/acc/"
  say "trained: $(tail -1 "$stage/logs/train.log")"
}

step_reference() {  # the reference acceptance of the checkpoints in $stage/trained (carried: .device/trained)
  mkdir -p "$stage/acc"
  if [ ! -f "$stage/trained/dflash/model.safetensors" ] && [ -d "$repo/.device/trained" ]; then
    cp -r "$repo/.device/trained" "$stage/trained.tmp" && mv "$stage/trained.tmp" "$stage/trained"
  fi
  "$py" "$here/train_models.py" "$stage/trained" --reference-only > "$stage/logs/reference.log" 2>&1 \
    || { tail -20 "$stage/logs/reference.log"; return 1; }
  cp "$stage/trained/reference.json" "$stage/acc/"
  [ ! -f "$stage/trained/train.json" ] || cp "$stage/trained/train.json" "$stage/acc/"
  say "$(tail -1 "$stage/logs/reference.log" | cut -c1-400)"
}

step_per_layer_config() {  # vLLM 0.33.0 reads Gemma 4's heterogeneous per_layer_config (see the header)
  "$py" - "$stage/trained/target/config.json" "$stage/models/target/config.json" <<'PY'
import json, os, sys
for path in sys.argv[1:]:
    if not os.path.isfile(path):
        continue
    config = json.load(open(path))
    text = config.get("text_config", {})
    if "per_layer_config" in text and text["per_layer_config"] is None:
        del text["per_layer_config"]
        json.dump(config, open(path + ".tmp", "w"), indent=2)
        os.replace(path + ".tmp", path)
        print(f"{path}: per_layer_config left to transformers (full layers at global_head_dim)")
PY
}

step_train_mtp() {  # [--reference-only]: the MTP drafter on the trained target (from train or a carried
  # .device/trained); --reference-only: a carried, already trained drafter's reference alone
  mkdir -p "$stage/acc"
  [ -f "$stage/trained/target/model.safetensors" ] || { echo "no trained target (run train or reference)"; return 7; }
  if [ "${1:-}" = --reference-only ] && [ ! -f "$stage/trained/mtp/model.safetensors" ]; then
    echo "no trained MTP drafter (carry .device/trained, run reference)"; return 7
  fi
  say "MTP drafter: ${1:-training}"
  "$py" "$here/train_mtp.py" "$stage/trained" "$@" ${G4E2E_MTP_ARGS:-} > "$stage/logs/train-mtp.log" 2>&1 \
    || { tail -30 "$stage/logs/train-mtp.log"; return 1; }
  cp "$stage/trained/train-mtp.json" "$stage/trained/reference-mtp.json" "$stage/acc/"
  rm -rf "$stage/acc/mtp-checkpoint" && cp -r "$stage/trained/mtp" "$stage/acc/mtp-checkpoint"  # 2 MB: brought back
  say "$(tail -1 "$stage/logs/train-mtp.log" | cut -c1-300)"
}

step_bg() {  # STEPS ('+'-separated) in a session of their own, after one another; $OUT is not theirs
  local steps=$1 tag=${1//+/-}
  mkdir -p "$stage/acc"
  rm -f "$stage/acc/bg-$tag.rc"
  OUT='' setsid nohup bash -c "'$0' ${steps//+/ } > '$stage/logs/bg-$tag.log' 2>&1; echo \$? > '$stage/acc/bg-$tag.rc'" \
    < /dev/null > /dev/null 2>&1 &
  say "in the background: ${steps//+/ }"
}

step_wait() {  # STEPS as given to bg:
  local tag=${1//+/-} waited=0 limit=${G4E2E_TRAIN_WAIT:-480}
  while [ ! -f "$stage/acc/bg-$tag.rc" ] && [ $waited -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
  tail -6 "$stage/logs/bg-$tag.log" 2>/dev/null
  [ -f "$stage/acc/bg-$tag.rc" ] || { echo "background steps $1 still running after $limit s"; return 1; }
  return "$(cat "$stage/acc/bg-$tag.rc")"
}

serve_run() {  # RECIPE DRAFTER
  local recipe=$1 drafter=$2 rc=0 start
  [ -d "$stage/patched" ] || { echo "serve: overlaid wheel not installed (run prepare first)"; return 7; }
  [ -d "$stage/deps-serve" ] || { echo "serve: server dependencies not installed (run serve-deps)"; return 7; }
  [ -f "$stage/trained/$drafter/model.safetensors" ] || { echo "serve: no trained $drafter drafter"; return 7; }
  mkdir -p "$stage/acc"
  say "serve route: $recipe with the trained $drafter drafter"
  start=$(date +%s)
  local -a extra=()
  local kv
  for kv in ${G4E2E_SERVE_SET:-}; do extra+=(--set "$kv"); done  # space-separated KEY=VALUE recipe settings
  rm -rf "$stage/serve-$drafter"
  # a built wheel: the script is rendered with --wheel (pin, torch and arguments from its manifest) and finds it
  # installed; the launch scripts serve from an active venv, so one is made over this Python's packages
  local served=$py
  if [ -f "$stage/built-wheel" ]; then
    extra+=(--wheel "$(cat "$stage/built-wheel")")
    if [ -z "${VIRTUAL_ENV:-}" ] && [ "${G4E2E_SERVE_VENV:-0}" = 1 ]; then
      [ -x "$stage/venv/bin/python" ] || "$py" -m venv --system-site-packages "$stage/venv" || return 9
      served=$stage/venv/bin/python
    fi
  fi
  local -a venv_env=()  # the venv's python first on PATH, as an activated venv has it
  [ "$served" = "$py" ] || venv_env=(PATH="$(dirname "$served"):$PATH" VIRTUAL_ENV="$stage/venv")
  env "${venv_env[@]}" PYTHONPATH="$(runpath patched "$stage/deps-serve" "$here")" timeout -k 30 "$run_limit" "$served" \
    "$here/serve_route.py" --recipe "$recipe" --drafter "$drafter" --models "$stage/trained" \
    --work "$stage/serve-$drafter" --json "$stage/acc/serve-$drafter.json" \
    --g4build "env PYTHONPATH=$stage/g4:$stage/deps $py -m g4build" --set "pin=$pin" "${extra[@]}" \
    > "$stage/logs/serve-$drafter.log" 2>&1 || rc=$?
  say "serve route $drafter exited $rc after $(( $(date +%s) - start )) s"
  tail -4 "$stage/logs/serve-$drafter.log"
}


fit_run() {  # RECIPE CARD_GIB: RECIPE's launch script in the card's share of this GPU (card_fit.py, issue 52)
  local recipe=$1 card=$2 rc=0 kv
  [ -d "$stage/patched" ] || { echo "fit: overlaid wheel not installed (run prepare first)"; return 7; }
  [ -d "$stage/deps-serve" ] || { echo "fit: server dependencies not installed (run serve-deps)"; return 7; }
  [ -f "$stage/real/meta.json" ] || "$py" "$here/real_size.py" "$stage/real" || return 7
  mkdir -p "$stage/acc" "$stage/logs"
  local -a extra=()
  for kv in ${G4E2E_SERVE_SET:-}; do extra+=(--set "$kv"); done
  for kv in ${G4E2E_FIT_ARGS:-}; do extra+=("$kv"); done  # e.g. --weights-stand-in --mtp-folder mtp-standin
  local name=fit-$recipe-$card${G4E2E_FIT_LABEL:+-$G4E2E_FIT_LABEL}
  say "card fit: $recipe in $card GiB"
  rm -rf "${stage:?}/${name:?}"
  env PYTHONPATH="$(runpath patched "$stage/deps-serve" "$here")" timeout -k 30 "$run_limit" "$py" \
    "$here/card_fit.py" run --recipe "$recipe" --card-gib "$card" --models "$stage/real" \
    --work "$stage/$name" --json "$stage/acc/$name.json" --limit $(( run_limit - 45 )) \
    --g4build "env PYTHONPATH=$stage/g4:$stage/deps $py -m g4build" --set "pin=$pin" "${extra[@]}" \
    > "$stage/logs/$name.log" 2>&1 || rc=$?
  say "card fit $name exited $rc"
  [ -z "${OUT:-}" ] || cp "$stage/acc/$name.json" "$OUT"/ 2>/dev/null || true
  tail -4 "$stage/logs/$name.log"
}

cost_run() {  # VARIANT [LABEL]: step costs of the real-size target, alone or with a drafter (step_costs.py, issue 52)
  # LABEL (letters and digits): the result's suffix instead of G4E2E_COST_LABEL, and G4E2E_COST_ARGS_<LABEL>'s
  # arguments after G4E2E_COST_ARGS', so one chain runs variants of one variant
  local variant=$1 label=${2:-${G4E2E_COST_LABEL:-}} rc=0 kv
  [[ $label =~ ^[A-Za-z0-9]*$ ]] || { echo "cost: label '$label': letters and digits only"; return 2; }
  local name=cost-$variant${label:+-$label} more=G4E2E_COST_ARGS_$label
  [ -d "$stage/patched" ] || { echo "cost: overlaid wheel not installed (run prepare first)"; return 7; }
  [ -f "$stage/real/meta.json" ] || "$py" "$here/real_size.py" "$stage/real" || return 7
  mkdir -p "$stage/acc" "$stage/logs"
  local -a extra=()
  for kv in ${G4E2E_COST_ARGS:-}; do extra+=("$kv"); done  # e.g. --mtp-folder mtp-standin --concurrency 1,8
  if [ -n "${2:-}" ]; then for kv in ${!more:-}; do extra+=("$kv"); done; fi
  say "step costs: $variant"
  PYTHONPATH=$(runpath patched "$here") timeout -k 20 "$run_limit" "$py" "$here/step_costs.py" run \
    --variant "$variant" --models "$stage/real" --json "$stage/acc/$name.json" "${extra[@]}" \
    > "$stage/logs/$name.log" 2>&1 || rc=$?
  say "step costs $name exited $rc"
  [ -z "${OUT:-}" ] || cp "$stage/acc/$name.json" "$OUT"/ 2>/dev/null || true
  tail -4 "$stage/logs/$name.log"
  return "$rc"
}

rendered_retention() {  # the --prefix-cache-retention-interval `g4build recipe render` writes for $pin's drafter
  # recipes (DFlash's; MTP's must agree): the value the acceptance runs then use, so they run what users get
  local recipe value first=
  for recipe in gemma4-26b-a4b-nvfp4-dflash gemma4-26b-a4b-nvfp4-mtp; do
    value=$(env PYTHONPATH="$stage/g4:$stage/deps" "$py" -m g4build recipe render "$recipe" --shell bash \
      --set "pin=$pin" 2>/dev/null | "$py" -c 'import re, sys
found = re.findall(r"\x27--prefix-cache-retention-interval\x27\s+\x27([^\x27]*)\x27", sys.stdin.read())
print(found[0] if len(found) == 1 else "")') || return 1
    [ -n "$value" ] || { echo "G4E2E_RETENTION=rendered: $recipe rendered for $pin sets no retention" >&2; return 2; }
    [ -z "$first" ] || [ "$first" = "$value" ] \
      || { echo "G4E2E_RETENTION=rendered: the DFlash and MTP scripts differ ($first, $value)" >&2; return 2; }
    first=$value
  done
  printf '%s' "$first"
}

acc_run() {  # VARIANT PHASES: one engine start with the trained models on the overlaid wheel
  local variant=$1 phases=$2 name start rc=0 suffix retention=
  suffix=$(run_suffix) || return 2
  name=$variant$suffix
  [ "$phases" != sampler ] || name=$name-sampler
  [ "$VLLM_USE_FLASHINFER_SAMPLER" != 1 ] || name=$name-fi
  case ${G4E2E_RETENTION:-} in  # the prefix-cache retention interval: unset = vLLM's default (NAME as is)
    '') ;;
    rendered) retention=$(rendered_retention) || return $?; name=$name-retention ;;
    None|[0-9]*) retention=$G4E2E_RETENTION; name=$name-retention$G4E2E_RETENTION ;;
    *) echo "G4E2E_RETENTION=$G4E2E_RETENTION: expected rendered, None or a number of tokens" >&2; return 2 ;;
  esac
  [ -d "$stage/patched" ] || { echo "step $name: overlaid wheel not installed (run prepare first)"; return 7; }
  [ -f "$stage/trained/dflash/model.safetensors" ] || { echo "step $name: no trained models (run train)"; return 7; }
  if [ "$variant" = mtp ] && [ ! -f "$stage/trained/mtp/model.safetensors" ]; then
    echo "step $name: no trained MTP drafter (run train-mtp)"; return 7
  fi
  say "acceptance run $name ($phases)"
  start=$(date +%s)
  PYTHONPATH=$(runpath patched "$here") timeout -k 20 "$run_limit" "$py" "$here/acceptance_runs.py" \
    --variant "$variant" --phases "$phases" --models "$stage/trained" --json "$stage/acc/$name.json" \
    ${G4E2E_GPU_MEM:+--gpu-memory-utilization "$G4E2E_GPU_MEM"} \
    ${retention:+--prefix-cache-retention-interval "$retention"} \
    > "$stage/logs/acc-$name.log" 2>&1 || rc=$?
  say "acceptance run $name exited $rc after $(( $(date +%s) - start )) s"
  tail -4 "$stage/logs/acc-$name.log"
}

step_kernel() {
  [ -d "$stage/patched" ] || { echo "step kernel: overlaid wheel not installed"; return 7; }
  say "mm-prefix-fa kernel check"
  PYTHONPATH=$(runpath patched) timeout -k 20 "$run_limit" "$py" "$here/mm_prefix_kernel.py" \
    --json "$stage/runs/kernel.json" > "$stage/logs/kernel.log" 2>&1
  say "kernel check exited $?"; tail -25 "$stage/logs/kernel.log"
}

step_report() {
  "$py" "$here/report.py" --runs "$stage/runs" --out "$repo/tests/gpu/results" || return $?
  [ -z "${OUT:-}" ] || cp "$repo"/tests/gpu/results/vllm-0.21.0-*.json "$OUT"/
}

[ $# -gt 0 ] || { sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 2; }  # the header comment, however long
status=0
for s in "$@"; do
  case $s in
    stash|deps|prepare|built|kernel|report|torch|probe) "step_$s" || { echo "step $s failed ($?)"; status=1; } ;;
    sliding-fa) step_sliding_fa ;;
    sliding-fa-report) step_sliding_fa_report || { echo "step $s failed ($?)"; status=1; } ;;
    pristine) engine_run pristine-dflash pristine dflash ;;
    baseline) engine_run baseline patched baseline ;;
    dflash) engine_run dflash patched dflash ;;
    mtp) engine_run mtp patched mtp ;;
    train) step_train || { echo "step train failed ($?)"; status=1; } ;;
    train-bg) step_bg train ;;  # = bg:train
    reference) step_reference || { echo "step reference failed ($?)"; status=1; } ;;
    per-layer-config) step_per_layer_config || { echo "step $s failed ($?)"; status=1; } ;;
    reference-mtp) step_train_mtp --reference-only || { echo "step $s failed ($?)"; status=1; } ;;
    train-wait) step_wait train || { echo "step train-wait failed ($?)"; status=1; } ;;  # = wait:train
    train-mtp) step_train_mtp || { echo "step train-mtp failed ($?)"; status=1; } ;;
    bg:*) step_bg "${s#bg:}" ;;
    wait:*) step_wait "${s#wait:}" || { echo "step $s failed ($?)"; status=1; } ;;
    serve-deps) step_serve_deps || { echo "step serve-deps failed ($?)"; status=1; } ;;
    serve:*:*) v=${s#serve:}; serve_run "${v%%:*}" "${v#*:}" ;;
    fit:*:*) v=${s#fit:}; fit_run "${v%%:*}" "${v#*:}" ;;
    cost:*:*) v=${s#cost:}; cost_run "${v%%:*}" "${v#*:}" || { echo "step $s failed ($?)"; status=1; } ;;
    cost:*) cost_run "${s#cost:}" || { echo "step $s failed ($?)"; status=1; } ;;
    acc:*:*) v=${s#acc:}; acc_run "${v%%:*}" "${v#*:}" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
  publish
  # a failed preparation makes the runs after it meaningless
  if [ $status -ne 0 ] && { [ "$s" = prepare ] || [ "$s" = torch ]; }; then exit 1; fi
done
exit $status
