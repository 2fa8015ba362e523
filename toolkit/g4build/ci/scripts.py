"""The bash bodies of the generated workflow steps.

Rules for every script here: no GitHub expression inside (values arrive as environment variables set by the
step's ``env:``), quote every expansion, and call the same g4build commands a user runs by hand.
"""

from __future__ import annotations

RESOLVE = """\
g4build ci resolve --pin "$PIN" --release "$RELEASE" --arch "${ARCH:-default}" --github-output "$GITHUB_OUTPUT"
"""

DRIFT = """\
set +e
g4build patches check --release "$RELEASE" --json > drift.json
status=$?
set -e
{
  echo "### Patch series against vLLM $RELEASE (patches check exit $status)"
  echo '```json'
  cat drift.json
  echo '```'
} >> "$GITHUB_STEP_SUMMARY"
if [ "$status" -ne 0 ]; then
  echo "::warning::a series does not apply to vLLM $RELEASE; the cells it breaks fail, see the drift-report artifact"
fi
"""

# git on the tree the port wrote from upstream material: no hook, fsmonitor or system/global config of anyone's
SAFE_GIT = """\
safe_git() {
  GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git -c core.hooksPath=/dev/null -c core.fsmonitor=false "$@"
}
"""

# The port job (a release that is not pinned): pin it, port every series, and leave the change as one patch that
# `git apply` takes at the repository root; a conflict (exit 8) is a result, reported, not a failure of the job.
PORT = SAFE_GIT + """\
pin="vllm-$RELEASE"
g4build pins add --release "$RELEASE" --json > pins-add.json
set +e
g4build patches port --all --to "$pin" --json > port-report.json
status=$?
set -e
if [ "$status" -eq 0 ]; then
  g4build patches check --pin "$pin" --json > check.json
fi
safe_git add -A -- patches
safe_git diff --cached --binary > port.patch
echo "status=$status" >> "$GITHUB_OUTPUT"
{
  echo "### Porting the series to vLLM $RELEASE (patches port exit $status)"
  echo "The port-$pin artifact's port.patch applies at the repository root: git apply port.patch"
  echo '```json'
  cat port-report.json
  echo '```'
} >> "$GITHUB_STEP_SUMMARY"
if [ "$status" -eq 8 ]; then
  echo "::warning::the series do not all port to vLLM $RELEASE: port-report.json names each conflicting" \\
    "file and hunk; port.patch holds the new pin only"
elif [ "$status" -ne 0 ]; then
  exit "$status"
fi
"""

# With the token secret set: the same change as a branch and a pull request (a draft while a series conflicts).
PORT_PR = SAFE_GIT + """\
if [ -z "$GH_TOKEN" ]; then
  echo "the repository secret $TOKEN_NAME is not set: the port-vllm-$RELEASE artifact is the result"
  exit 0
fi
branch="g4build/port-vllm-$RELEASE-run$RUN"
safe_git switch -c "$branch"
safe_git -c user.name="g4build nightly" -c user.email="g4build-nightly@localhost" commit -q \\
  -m "pins: vllm-$RELEASE, series ported by the nightly (patches port exit $STATUS)"
gh auth setup-git
# the push needs the credential helper gh wrote into the global config; still no hook (pre-push) runs
git -c core.hooksPath=/dev/null -c core.fsmonitor=false push origin "$branch"
draft=()
title="vLLM $RELEASE: pin and ported series"
if [ "$STATUS" != 0 ]; then
  draft=(--draft)
  title="vLLM $RELEASE: pin added, porting the series stopped"
fi
{
  echo "Made by the nightly run $RUN: g4build pins add --release $RELEASE, then g4build patches port --all" \\
    "--to vllm-$RELEASE (exit $STATUS)."
  if [ "$STATUS" != 0 ]; then
    echo "Porting stopped, so no series is in this branch yet: the report below names each conflicting file and hunk."
  fi
  echo
  echo '```json'
  cat port-report.json
  echo '```'
} > pr-body.md
gh pr create "${draft[@]}" --base "$BASE" --head "$branch" --title "$title" --body-file pr-body.md
"""

TORCH = """\
if [ -z "$G4_TORCH" ]; then
  echo "vLLM $G4_RELEASE is not pinned: no torch to install (the build step says how to pin it)"
  exit 0
fi
index=()
if [ -n "$G4_TORCH_INDEX" ]; then
  cu="cu${G4_CUDA//./}"
  index=(--index-url "${G4_TORCH_INDEX//'{cu}'/$cu}")
fi
python -m pip install "torch==$G4_TORCH" "${index[@]}"
python -c 'import sys, torch
sys.exit(0 if torch.version.cuda else "torch " + torch.__version__ + " has no CUDA: set the repository variable "
         "G4BUILD_TORCH_INDEX to a PyTorch package index for CUDA builds ({cu} stands for cu130, cu129, ...)")'
"""

TARGET_ARGS = """\
if [ -n "$G4_PIN" ]; then target=(--pin "$G4_PIN"); else target=(--release "$G4_RELEASE"); fi
"""

# the runner's Python (the one the torch step filled; no venv there) named through --python-exe's variable, so a
# Windows build does not refuse for want of an active venv
BUILD = TARGET_ARGS + """\
G4BUILD_PYTHON_EXE=$(python -c 'import sys; print(sys.executable)')
export G4BUILD_PYTHON_EXE
g4build wheel --arch "$G4_ARCH" --os "$G4_OS" "${target[@]}" --python "$G4_PYTHON" --cuda "$G4_CUDA" \\
  --kernels all --out wheelhouse --json > wheel.json
"""

VALIDATE = """\
pin=()
if [ -n "$G4_PIN" ]; then pin=(--pin "$G4_PIN"); fi
g4build validate --arch "$G4_ARCH" "${pin[@]}" --json wheelhouse/vllm-*.whl > validate.json
"""

LAUNCH = """\
shell=bash
if [ "$G4_OS" = windows ]; then shell=powershell; fi
wheels=(wheelhouse/vllm-*.whl)
wheel=${wheels[0]}
if [ ! -f "$wheel" ]; then echo "::error::no vLLM wheel in wheelhouse/"; exit 1; fi
g4build recipe list --json > recipes.json
python -c 'import json; [print(r["name"]) for r in json.load(open("recipes.json"))]' | tr -d '\\r' |
  while read -r name; do
    g4build recipe render "$name" --shell "$shell" --out launch --wheel "$wheel" || exit 1
  done
"""

FAILED_BUILD = """\
{
  echo "### $G4_CELL failed"
  echo "If a patch series stopped applying to vLLM $G4_RELEASE, the drift report names it:"
  echo '```json'
  cat drift-report/drift.json
  echo '```'
} >> "$GITHUB_STEP_SUMMARY"
echo "::error::build $G4_CELL failed; this run's drift-report artifact says whether a patch series stopped applying"
"""

# The build job cross-checked the fatbins with its CUDA toolkit's cuobjdump; this runner has no toolkit, so the
# headers are trusted here (without --trust-fatbin an arch verdict no tool checked fails).
CHECK = """\
g4build validate --arch "$G4_ARCH" --trust-fatbin --smoke --json dist/wheelhouse/vllm-*.whl
"""

SMOKE = """\
python3 -m venv .smoke
.smoke/bin/python -m pip install dist/wheelhouse/vllm-*.whl
nvidia-smi
.smoke/bin/python -c 'import torch, vllm, vllm._C; assert torch.cuda.is_available()
print(vllm.__version__, torch.cuda.get_device_capability())'
"""

STAGE = """\
mkdir -p release
for dir in dist/g4build-*/; do
  cell=$(basename "$dir")
  for f in "$dir"wheelhouse/*.whl; do
    b=$(basename "$f")
    if [ -e "release/$b" ] && ! cmp -s "$f" "release/$b"; then
      echo "::error::two cells built different files named $b"; exit 1
    fi
    cp "$f" "release/$b"
  done
  cp "${dir}wheelhouse/build-manifest.json" "release/build-manifest-${cell#g4build-}.json"
  if [ -d "${dir}launch" ]; then
    (cd "${dir}launch" && python3 -m zipfile -c "$OLDPWD/release/launch-${cell#g4build-}.zip" .)
  fi
done
cp dist/drift-report/drift.json release/drift.json
ls -l release
"""

# The index's pages go to GitHub Pages; its files/ (the wheels, over Pages' 100 MB limit, and their .metadata)
# are the release's assets, which the pages link to.
INDEX = """\
tag="g4build-vllm-${RELEASE}-run${RUN}"
owner=${GH_REPO%%/*}
url=${INDEX_URL:-https://${owner,,}.github.io/${GH_REPO#*/}}
pin=()
if [ -n "$PIN" ]; then pin=(--pin "$PIN"); fi
torch=()
if [ -n "$G4_TORCH_INDEX" ]; then torch=(--torch-index "$G4_TORCH_INDEX"); fi
g4build index build release --out site "${pin[@]}" "${torch[@]}" --base-url "$url" --repo "$GH_REPO" \\
  --files-url "https://github.com/$GH_REPO/releases/download/$tag" --json > index.json
mkdir -p assets
mv site/files/*.metadata assets/
rm -r site/files
echo "index_url=$url" >> "$GITHUB_OUTPUT"
"""

# A draft first, its files uploaded, then published: a repository with release immutability on locks the files
# and the tag at that moment, so a published release never changes.
PUBLISH = """\
tag="g4build-vllm-${RELEASE}-run${RUN}"
{
  echo "Wheels built by the nightly workflow for vLLM ${RELEASE} (pin: ${PIN:-none})."
  echo "What made each wheel: build-manifest-<cell>.json. Patch drift: drift.json."
  echo "Cells left out of this run: ${LEFT_OUT}"
  echo "Package index: ${INDEX_URL}/simple/ (each wheel's page: ${INDEX_URL}/)"
  echo
  cat site/install.md
} > notes.md
gh release create "$tag" --draft --prerelease --title "vLLM ${RELEASE} with g4build series (run ${RUN})" \\
  --notes-file notes.md release/* assets/*.metadata
gh release edit "$tag" --draft=false
"""
