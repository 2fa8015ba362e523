"""The one-line Python programs ``g4build build-check`` runs in the build's interpreter (cli/buildcheck.py):
is it the Python the plan wants, has it the pin's torch for the pin's CUDA. Single quotes only, for PowerShell."""

from __future__ import annotations

from g4build.errors import ConfigError
from g4build.pins.model import cuda_problem, version_problem


def python_check(version: str, *, need_venv: bool) -> str:
    """A one-line Python program (single quotes only, for PowerShell) that exits non-zero unless it runs on
    Python ``version`` and, with ``need_venv``, inside a virtual environment, saying what it found."""
    want = "a virtual environment with Python" if need_venv else "Python"
    venv_ok = "sys.prefix != sys.base_prefix" if need_venv else "True"
    return (
        "import sys; "
        "v = '%d.%d' % sys.version_info[:2]; "
        f"venv = {venv_ok}; "
        f"sys.exit(0 if v == '{version}' and venv else "
        f"'expected {want} {version}, found ' + sys.executable + ' (Python ' + v + "
        "('' if venv else ', not a virtual environment') + "
        f"'): create a venv with Python {version}, activate it and rerun, or pass --python-exe PATH')"
    )


def torch_check(torch: str, cuda: str) -> str:
    """A one-line Python program (single quotes only, for PowerShell) that exits non-zero unless the
    interpreter has torch ``torch`` built for CUDA ``cuda`` (its CUDA line: 13.0 for 13.0.x), saying what it
    found and what to install. The values are pins (typed by the pins loader); a value that is no version is
    refused here as well, since it would become code in the program."""
    why = version_problem(torch) or cuda_problem(cuda)
    if why:
        raise ConfigError(f"torch {torch!r} / CUDA {cuda!r}: expected versions (e.g. 2.11.0 and 13.0); {why}",
                          hint="check torch and cuda of the pin in patches/pins.yaml")
    cu = "cu" + cuda.replace(".", "")
    return (
        "import importlib.util, sys; "
        "t = __import__('torch') if importlib.util.find_spec('torch') else None; "
        "v = t.__version__ if t else 'no torch'; "
        "c = t.version.cuda if t else None; "  # None in a CPU build
        "line = '.'.join(str(c).split('.')[:2]) if c else None; "
        f"sys.exit(0 if t and v.split('+')[0] == '{torch}' and line == '{cuda}' else "
        f"'expected torch {torch} built for CUDA {cuda} in ' + sys.executable + ', found ' + "
        f"(v if t is None else v + (' built for CUDA ' + str(c) if c else ' without CUDA (a CPU build)')) + "
        f"': install torch=={torch} from the PyTorch {cu} wheel index into that Python first "
        f"(g4build wheel --torch-index URL does it), then rerun')"
    )
