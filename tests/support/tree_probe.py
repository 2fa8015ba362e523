"""Run a probe script inside a vLLM source tree: a fresh Python with PYTHONPATH at the tree, so the tree's own
modules are what the script imports, and one JSON line of facts back (``<MARKER> {...}`` on stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Wheels built for another torch (torchvision / torchaudio from PyPI beside the CPU torch) fail at import; vLLM and
# transformers treat them as optional, so a probe runs as if they were not installed.
BOOT_SITECUSTOMIZE = """
import importlib.util, sys
_hidden = set()
for _pkg in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(_pkg) is None:
        continue
    try:
        __import__(_pkg)
    except Exception:
        _hidden.add(_pkg)
        for _m in [m for m in sys.modules if m.split(".")[0] == _pkg]:
            del sys.modules[_m]
if _hidden:
    _find_spec = importlib.util.find_spec
    def _hide(name, package=None):
        return None if name.split(".")[0] in _hidden else _find_spec(name, package)
    importlib.util.find_spec = _hide
    class _Absent:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.split(".")[0] in _hidden:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Absent)
"""


def run_tree_probe(
    script: Path, tree: Path, workdir: Path, marker: str, args: list[str], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script`` with the tree first on the path (after the boot folder) and return its facts."""
    boot = workdir / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    (boot / "sitecustomize.py").write_text(BOOT_SITECUSTOMIZE)
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(boot), str(tree)])
    full_env["PYTHONDONTWRITEBYTECODE"] = "1"  # trees are shared read-only
    full_env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=workdir,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker + " ")]
    assert proc.returncode == 0 and lines, (
        f"probe {script.name} failed in {tree} (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    facts: dict[str, Any] = json.loads(lines[-1].removeprefix(marker + " "))
    return facts
