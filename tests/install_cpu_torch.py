"""Install torch's CPU build into the active venv, at the version tests/requirements-vllm-cpu.txt pins, before
README's test command installs the rest (which then keeps it: ``==2.13.0`` matches ``2.13.0+cpu``).

On Windows and macOS the package index's torch is the CPU build already. On Linux it is the CUDA build
(gigabytes of ``nvidia-*`` wheels), and the CPU build lives on PyTorch's own index. No index address is written
here: the first try is ``torch==X+cpu`` from the indexes your pip is configured with (a mirror of PyTorch's CPU
index, ``pip config``, ``PIP_EXTRA_INDEX_URL``); when none has it, uv installs it (``uv pip install
--torch-backend cpu`` knows PyTorch's CPU index itself), uv coming from your package index.

    python tests/install_cpu_torch.py            # install (nothing to do when the CPU build is there)
    python tests/install_cpu_torch.py --print    # print the commands it would run, one per line
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent / "requirements-vllm-cpu.txt"
_PROBE = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"


def pinned_torch(requirements: Path = REQUIREMENTS) -> str:
    """The ``torch==X`` the test requirements pin (no local label)."""
    for line in requirements.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"torch==([\w.]+)", line.split("#", 1)[0].strip())
        if match:
            return match.group(1)
    raise SystemExit(f"{requirements}: expected a line torch==VERSION, found none; restore it")


def plan(version: str, platform: str, python: str = sys.executable) -> list[list[str]]:
    """The commands to try in order: each alternative is one list; on Linux the second and third run only when
    the first finds no CPU build."""
    if not platform.startswith("linux"):
        return [[python, "-m", "pip", "install", f"torch=={version}"]]
    return [[python, "-m", "pip", "install", f"torch=={version}+cpu"],
            [python, "-m", "pip", "install", "uv"],
            [python, "-m", "uv", "pip", "install", "--python", python, f"torch=={version}", "--torch-backend", "cpu"]]


def installed() -> tuple[str, str | None] | None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    version, cuda = json.loads(done.stdout.strip().splitlines()[-1])
    return str(version), cuda


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--print", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    version = pinned_torch()
    steps = plan(version, sys.platform)
    if args.print:
        print("\n".join(" ".join(step) for step in steps))
        return 0
    have = installed()
    if have is not None and have[0].split("+")[0] == version and have[1] is None:
        print(f"torch {have[0]} (CPU build) is installed already")
        return 0
    if subprocess.run(steps[0], check=False).returncode != 0:
        if len(steps) == 1:
            return 1
        print(f"torch=={version}+cpu is on none of the indexes pip is configured with: installing it with uv",
              file=sys.stderr)
        for step in steps[1:]:
            if subprocess.run(step, check=False).returncode != 0:
                print(f"error: {' '.join(step)} failed; expected torch {version}'s CPU build. Set pip up with "
                      "PyTorch's CPU wheel index (its address is on PyTorch's install page: `python -m pip config "
                      "--site set global.extra-index-url URL` in this venv) and run this again", file=sys.stderr)
                return 1
    have = installed()
    if have is None or have[1] is not None:
        found = f"torch {have[0]} for CUDA {have[1]}" if have else "no torch"
        print(f"error: expected torch {version}'s CPU build, found {found}", file=sys.stderr)
        return 1
    print(f"torch {have[0]} (CPU build) installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
