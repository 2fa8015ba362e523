"""A FlashInfer jit-cache wheel g4build packed: exactly the modules it lists, each with SASS for every arch it names.

FlashInfer loads ``jit_cache/NAME/NAME.so`` for a module it finds listed (0.7: for a device the provider's
architectures run on) and never compiles it; a module whose library lacks SASS for the GPU would then fail at its
first kernel launch, not at build time. So every fatbin of every listed library must carry SASS that runs on each
architecture the wheel claims (read by the fatbin reader, as for vLLM's libraries), and with ``--arch`` the
claimed architectures must cover that GPU too.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

from g4build.builder.flashinfer_aot import CACHE_DIR, PACKAGE, read_packed
from g4build.errors import ValidationError
from g4build.validate.check import Check
from g4build.validate.fatbin import Arch
from g4build.validate.reading import Contents

PREFIX = f"{PACKAGE}/{CACHE_DIR}/"


def _module_files(c: Contents) -> dict[str, str]:
    """Library members under the cache folder by module name (``NAME/NAME.so``; anything else by its path)."""
    out = {}
    for name in c.members:
        if name.startswith(PREFIX) and name.endswith(".so"):
            rest = name[len(PREFIX):]
            folder, _, file = rest.partition("/")
            out[folder if file == f"{folder}.so" else rest] = name
    return out


def _runs(c: Contents, member: str, target: Arch) -> str | None:
    """Why ``member`` does not run natively on ``target`` (None: every fatbin has SASS for it)."""
    found = c.members[member]
    if found.fatbin_error:
        return found.fatbin_error
    if found.fatbins is None or not found.fatbins.fatbins:
        return "no CUDA code at all"
    missing = sum(1 for f in found.fatbins.fatbins if not any(e.runs_on(target) for e in f.entries))
    if missing:
        sass = ", ".join(found.fatbins.names("sass")) or "none"
        return f"{missing} of {len(found.fatbins.fatbins)} fatbins without SASS for {target.sm()} (SASS: {sass})"
    return None


def check_jit_cache(path: Path, c: Contents, targets: Sequence[Arch]) -> list[Check]:
    try:
        with zipfile.ZipFile(path) as zf:
            record = read_packed(zf, path.name)
    except (ValidationError, zipfile.BadZipFile, OSError) as exc:
        return [Check(name="jit-cache modules", ok=False, detail=str(exc))]
    listed = [str(m) for m in record["modules"]]
    claimed_raw = record.get("cuda_architectures")
    try:
        claimed = [Arch.parse(str(a)) for a in claimed_raw] if isinstance(claimed_raw, list) and claimed_raw else []
    except ValueError as exc:
        return [Check(name="jit-cache modules", ok=False, detail=f"cuda_architectures: {exc}")]
    if not claimed:
        return [Check(name="jit-cache modules", ok=False, detail=f"expected cuda_architectures, found {claimed_raw!r}")]
    files = _module_files(c)
    extra, missing = sorted(set(files) - set(listed)), [m for m in listed if m not in files]
    checks = []
    if extra or missing:
        checks.append(Check(name="jit-cache modules", ok=False,
                            detail=f"expected exactly {', '.join(listed)} (NAME/NAME.so); missing: "
                                   f"{', '.join(missing) or 'none'}; not listed: {', '.join(extra) or 'none'}"))
    else:
        checks.append(Check(name="jit-cache modules", ok=True, detail=f"{', '.join(listed)}"))
    raw_archs = record.get("module_archs")
    per_module: dict[str, object] = raw_archs if isinstance(raw_archs, dict) else {}
    for module in listed:
        if module not in files:
            continue
        own = per_module.get(module)
        try:  # a module built only for some majors (FP4 GEMM: 12.x) is checked for those
            archs = [Arch.parse(str(a)) for a in own] if isinstance(own, list) and own else claimed
        except ValueError as exc:
            checks.append(Check(name=f"jit-cache {module}", ok=False, detail=f"module_archs: {exc}"))
            continue
        problems = [f"{arch.sm()}: {why}" for arch in archs if (why := _runs(c, files[module], arch))]
        checks.append(Check(name=f"jit-cache {module}", ok=not problems,
                            detail="; ".join(problems) or f"SASS for {', '.join(a.sm() for a in archs)} in "
                                                          "every fatbin"))
    for target in targets:
        covers = [a.sm() for a in claimed if a.major == target.major and
                  (a.minor == target.minor if a.suffix == "a" else a.minor <= target.minor)]
        checks.append(Check(name=f"jit-cache covers {target.sm()}", ok=bool(covers),
                            detail=f"built for {', '.join(covers)}" if covers else
                            f"built for {', '.join(a.sm() for a in claimed)}: none runs on {target.sm()}"))
    return checks
