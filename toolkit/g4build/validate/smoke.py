"""Smoke test: install a wheel into a fresh venv (uv when present) without dependencies, then import it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from g4build.validate.check import Check


def import_names(wheel: Path) -> list[str]:
    """``top_level.txt`` when the wheel has one, else its top-level packages and modules."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for n in names:
            if n.count("/") == 1 and n.endswith(".dist-info/top_level.txt"):
                listed = [t.strip() for t in zf.read(n).decode().splitlines() if t.strip()]
                if listed:
                    return listed
    found = set()
    for n in names:
        top, _, rest = n.partition("/")
        if top.endswith((".dist-info", ".data")):
            continue
        if rest == "__init__.py":
            found.add(top)
        elif not rest and top.endswith(".py"):
            found.add(top[:-3])
    return sorted(found)


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def smoke_install(wheel: Path) -> Check:
    names = import_names(wheel)
    with tempfile.TemporaryDirectory(prefix="g4build-smoke-") as tmp:
        venv = Path(tmp) / "venv"
        uv = shutil.which("uv")
        if uv:
            steps = [[uv, "venv", "-q", str(venv)],
                     [uv, "pip", "install", "-q", "--python", str(_venv_python(venv)), "--no-deps", str(wheel)]]
            tool = "uv"
        else:
            steps = [[sys.executable, "-m", "venv", "--without-pip", str(venv)],
                     [sys.executable, "-m", "pip", "--python", str(_venv_python(venv)), "install", "-q",
                      "--no-deps", "--no-index", str(wheel)]]
            tool = "venv + pip"
        steps.append([str(_venv_python(venv)), "-c", "".join(f"import {n}\n" for n in names)])
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                return Check(name="smoke", ok=False,
                             detail=f"`{' '.join(argv[:3])} …` failed ({proc.returncode}): {' / '.join(tail)}")
    return Check(name="smoke", ok=True, detail=f"installed into a fresh venv ({tool}) and imported {', '.join(names)}")
