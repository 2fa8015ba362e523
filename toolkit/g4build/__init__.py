"""g4build: vLLM + Gemma 4 + DFlash wheels for SM120 on Windows, WSL and Linux."""

__version__ = "0.1.0"

import os as _os

# GitPython raises ImportError at import when no git executable is on PATH, which would turn every command
# (doctor, which reports the missing git, included) into a traceback. Let it import; the commands that need git
# check for it and say so.
_os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
