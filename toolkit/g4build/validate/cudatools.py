"""NVIDIA's ``cuobjdump``, found where it is installed, used to cross-check the fatbin reader."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from g4build.validate.fatbin import LibraryArchs

_LISTED = re.compile(r"^(ELF|PTX) file\s+\d+:\s+\S*?\.(sm_\d+[af]?)\.(?:cubin|ptx)\s*$")


def find_cuobjdump() -> Path | None:
    """PATH, then ``$CUDA_HOME/bin``, then the ``nvidia-cuda-cuobjdump`` package of this Python."""
    exe = "cuobjdump.exe" if os.name == "nt" else "cuobjdump"
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and (Path(root) / "bin" / exe).is_file():
            return Path(root) / "bin" / exe
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            for candidate in sorted(base.glob(f"*/bin/{exe}")):
                if os.access(candidate, os.X_OK):
                    return candidate
    return None


class CuobjdumpFailed(Exception):
    """cuobjdump exited non-zero (it exits 0 when a library simply has no PTX or no SASS)."""


def list_archs(cuobjdump: Path, library: Path) -> dict[str, int]:
    """``cuobjdump --list-elf`` and ``--list-ptx`` as counts of ``sass sm_120`` / ``ptx sm_90a`` keys."""
    counts: Counter[str] = Counter()
    for flag in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([str(cuobjdump), flag, str(library)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            said = " ".join((proc.stderr or proc.stdout).split()) or "no message"
            raise CuobjdumpFailed(f"cuobjdump {flag} exited {proc.returncode}: {said}")
        for line in proc.stdout.splitlines():
            m = _LISTED.match(line.strip())
            if m:
                counts[f"{'sass' if m[1] == 'ELF' else 'ptx'} {m[2]}"] += 1
    return dict(counts)


def counts(archs: LibraryArchs) -> dict[str, int]:
    """The reader's entries keyed as cuobjdump names them (it shows family SASS without the ``f``)."""
    found: Counter[str] = Counter()
    for e in archs.entries:
        suffix = "" if e.kind == "sass" and e.arch.suffix == "f" else e.arch.suffix
        found[f"{e.kind} sm_{e.arch.number}{suffix}"] += 1
    return dict(found)


def show(c: dict[str, int]) -> str:
    return ", ".join(f"{n}x {k}" for k, n in sorted(c.items())) or "nothing"
