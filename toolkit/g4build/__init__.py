"""g4build: vLLM + Gemma 4 + DFlash wheels for SM120 on Windows, WSL and Linux."""

__version__ = "0.1.0"
