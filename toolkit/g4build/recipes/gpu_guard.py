"""Whether a GPU can run a g4build-built wheel's kernels: the check a launch script makes before it installs it.

Why a stop and not a warning: on a GPU whose compute capability a wheel has no kernel image for, vLLM's kernels
fail with CUDA's "no kernel image is available for execution on the device", but only where CUDA's error state is
next read, often at a later call than the launch that failed (an sm_120 wheel on an H200: FA2's varlen kernel and
``rms_norm`` both raised it once the check read the error, tests/device/results/wheel-sm120-loads.json), so the
user meets a CUDA error deep in the engine's start or first request instead of a plain answer before the install.
A wheel g4build built records the arch list nvcc compiled for (its ``build-manifest.json``:
``env.TORCH_CUDA_ARCH_LIST``, else ``target.arch``), so the script knows which GPUs it fits. Any other wheel
(a registry wheel, an overlay, one without a manifest) keeps the recipe's warning: what it carries is not
recorded.

Which GPUs a kernel target runs on, by CUDA's binary compatibility rules (CUDA C++ Programming Guide, "Binary
Compatibility" and "Feature Set Compiler Targets"):

- SASS for ``sm_XY`` runs on compute capability ``X.Z`` with ``Z >= Y`` (same major): ``8.0`` runs on 8.6 and 8.9,
  never on 9.0.
- an arch-specific target (``9.0a``) runs only on exactly that compute capability, PTX or SASS.
- a family target (``12.0f``) runs on the family's members: same major, minor ``>=`` (12.0 and 12.1).
- plain PTX (``8.0+PTX``) is JIT-compiled by the driver for any compute capability ``>=`` its own (any later
  major too); family PTX within its family, arch-specific PTX on its own arch only. Judgment: a GPU reached only
  by PTX passes the check (the driver has code it can run, at the cost of a slow first start), as CUDA allows.

The arch list comes from the wheel, so it is untrusted: only ``9.0``, ``9.0a``, ``12.0f``, ``sm120``,
``sm_90a`` forms (``+PTX`` allowed) are accepted, and only numbers re-spelled here reach a script.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from g4build.errors import RecipeError
from g4build.util.shellquote import bash_quote, ps_quote

EXIT_OTHER_GPU = 20  # the launch script's exit code for a GPU the wheel has no kernels for
ALLOW_ENV = "G4BUILD_ALLOW_OTHER_GPU"
MAX_TARGETS = 16
_DOTTED = re.compile(r"([0-9]{1,2})\.([0-9])([af]?)(\+ptx)?", re.IGNORECASE)
_SM = re.compile(r"sm_?([0-9]{1,2})([0-9])([af]?)(\+ptx)?", re.IGNORECASE)
Reach = Literal["exact", "major", "forward"]


@dataclass(frozen=True, kw_only=True)
class KernelTarget:
    """One entry of a wheel's arch list: ``12.0f`` is (12, 0, 'f'); ``ptx``: PTX beside the SASS (``+PTX``)."""

    major: int
    minor: int
    suffix: str = ""  # '', 'a' (this arch only) or 'f' (its family)
    ptx: bool = False

    @property
    def spelled(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}" + ("+PTX" if self.ptx else "")

    @property
    def reach(self) -> Reach:
        if self.suffix == "a":
            return "exact"
        return "forward" if self.ptx and not self.suffix else "major"

    def covers(self) -> str:
        """Which compute capabilities it runs on, in words."""
        if self.reach == "exact":
            return f"{self.major}.{self.minor} only"
        if self.reach == "major":
            return f"{self.major}.{self.minor} to {self.major}.9"
        return f"{self.major}.{self.minor} and newer, JIT-compiled"


def parse_kernel_archs(text: str, where: str) -> tuple[KernelTarget, ...]:
    """A recorded arch list (``12.0f``, ``9.0a;12.0f``, ``sm120``) as its targets; RecipeError for anything else."""
    items = [item for item in re.split(r"[;\s]+", text.strip()) if item]
    if not items or len(items) > MAX_TARGETS:
        raise RecipeError(f"{where}: expected 1 to {MAX_TARGETS} GPU arch entries, found {len(items)} in "
                          f"{text[:80]!r}", hint="rebuild the wheel with `g4build wheel --arch ... --os ...`")
    found = []
    for item in items:
        m = _DOTTED.fullmatch(item) or _SM.fullmatch(item)
        if m is None or int(m[1]) == 0:
            raise RecipeError(f"{where}: expected GPU arch entries such as 9.0, 9.0a, 12.0f, sm120 (optionally "
                              f"+PTX), found {item[:40]!r}",
                              hint="rebuild the wheel with `g4build wheel --arch ... --os ...`, or render without "
                                   "--wheel")
        found.append(KernelTarget(major=int(m[1]), minor=int(m[2]), suffix=m[3].lower(), ptx=m[4] is not None))
    return tuple(dict.fromkeys(found))


def recorded_archs(manifest: object) -> str | None:
    """The arch list a g4build build's manifest records (``None``: not a build, or nothing recorded): what nvcc
    compiled for (``env.TORCH_CUDA_ARCH_LIST``, set for every build step), else the build's ``target.arch``."""
    if not isinstance(manifest, dict) or manifest.get("route") != "build":
        return None
    env, target = manifest.get("env"), manifest.get("target")
    listed = env.get("TORCH_CUDA_ARCH_LIST") if isinstance(env, dict) else None
    if isinstance(listed, str):
        return listed
    arch = target.get("arch") if isinstance(target, dict) else None
    return arch if isinstance(arch, str) else None


def described(targets: tuple[KernelTarget, ...]) -> str:
    return ", ".join(t.spelled for t in targets) + " (compute capability " + "; ".join(
        t.covers() for t in targets) + ")"


def _messages(targets: tuple[KernelTarget, ...], shell: str) -> tuple[str, str, str]:
    built = described(targets)
    error = (f"error: this wheel was built by g4build with GPU kernels for {built} only, but no GPU here can run "
             "them: on such a GPU some of its kernels fail and others may return without running (wrong output, "
             "no error). nvidia-smi reports: ")
    route = "render this script again without --wheel to use the registry's wheel" if shell == "bash" else \
        "use the registry's wheel in WSL (render --shell bash without --wheel)"
    hint = (f"hint: build a wheel for this GPU (g4build wheel --arch smXY --os OS for compute capability X.Y, e.g. "
            f"sm90 for 9.0) or {route}; {ALLOW_ENV}=1 runs anyway (exit {EXIT_OTHER_GPU} otherwise).")
    note = f"warning: {ALLOW_ENV}=1: serving on a GPU this wheel has no kernels for"
    return error, hint, note


def condition(t: KernelTarget, major: str, minor: str, ops: dict[str, str]) -> str:
    eq, ge, gt, both, either = ops["eq"], ops["ge"], ops["gt"], ops["and"], ops["or"]
    same = f"{major} {eq} {t.major}"
    if t.reach == "exact":
        return f"({same} {both} {minor} {eq} {t.minor})"
    if t.reach == "major":
        return f"({same} {both} {minor} {ge} {t.minor})"
    return f"({major} {gt} {t.major} {either} ({same} {both} {minor} {ge} {t.minor}))"


_BASH_OPS = {"eq": "==", "ge": ">=", "gt": ">", "and": "&&", "or": "||"}
_PS_OPS = {"eq": "-eq", "ge": "-ge", "gt": "-gt", "and": "-and", "or": "-or"}


def bash_guard(targets: tuple[KernelTarget, ...]) -> list[str]:
    """Stop (exit ``EXIT_OTHER_GPU``) unless a GPU in ``${caps}`` (nvidia-smi's compute_cap lines) runs a target."""
    if not targets:
        return []
    error, hint, note = _messages(targets, "bash")
    test = " || ".join(condition(t, "cap_major", "cap_minor", _BASH_OPS) for t in targets)
    return [
        "# A GPU that can run the wheel's kernels (see the header), or stop before anything is installed.",
        "gpu_fits=0",
        "while IFS= read -r cap; do",
        '  if [[ "${cap//[[:space:]]/}" =~ ^([0-9]{1,3})\\.([0-9]{1,3})$ ]]; then',
        "    cap_major=$((10#${BASH_REMATCH[1]})) cap_minor=$((10#${BASH_REMATCH[2]}))",
        f"    if (( {test} )); then gpu_fits=1; fi",
        "  fi",
        'done <<< "${caps:-}"',
        'if [[ "${gpu_fits}" -ne 1 ]]; then',
        f"  echo {bash_quote(error)}" + '"${caps//$\'\\n\'/ }"' + " >&2",
        f'  if [[ "${{{ALLOW_ENV}:-}}" != 1 ]]; then',
        f"    echo {bash_quote(hint)} >&2",
        f"    exit {EXIT_OTHER_GPU}",
        "  fi",
        f"  echo {bash_quote(note)} >&2",
        "fi",
        "",
    ]


def powershell_guard(targets: tuple[KernelTarget, ...]) -> list[str]:
    """The same check for PowerShell, over ``$caps`` (nvidia-smi's compute_cap lines, trimmed)."""
    if not targets:
        return []
    error, hint, note = _messages(targets, "powershell")
    test = " -or ".join(condition(t, "$capMajor", "$capMinor", _PS_OPS) for t in targets)
    return [
        "# A GPU that can run the wheel's kernels (see the header), or stop before anything is installed.",
        "$gpuFits = $false",
        "foreach ($cap in $caps) {",
        "    if ($cap -match '^([0-9]{1,3})\\.([0-9]{1,3})$') {",
        "        $capMajor = [int]$Matches[1]",
        "        $capMinor = [int]$Matches[2]",
        f"        if ({test}) {{ $gpuFits = $true }}",
        "    }",
        "}",
        "if (-not $gpuFits) {",
        f"    [Console]::Error.WriteLine({ps_quote(error)} + ($caps -join ' '))",
        f"    if ($env:{ALLOW_ENV} -ne '1') {{",
        f"        [Console]::Error.WriteLine({ps_quote(hint)})",
        f"        exit {EXIT_OTHER_GPU}",
        "    }",
        f"    [Console]::Error.WriteLine({ps_quote(note)})",
        "}",
        "",
    ]


def header_line(targets: tuple[KernelTarget, ...]) -> list[str]:
    """What the script's header says about the check (nothing for a wheel whose kernels are not recorded)."""
    if not targets:
        return []
    return [f"Before installing, checks that a GPU can run the wheel's kernels, built for {described(targets)}.",
            f"On any other GPU it stops (exit {EXIT_OTHER_GPU}); {ALLOW_ENV}=1 makes that a warning (experts only)."]

