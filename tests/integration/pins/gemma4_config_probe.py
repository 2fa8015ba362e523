"""Run inside a vLLM source tree (PYTHONPATH: the tree, a transformers): build the tree's own ModelConfig for the
Gemma 4 config at argv[1] and print what it read, or the exception it raised (``GEMMA4_CONFIG {...}``)."""

from __future__ import annotations

import json
import sys

out: dict[str, object] = {}
try:
    import transformers

    out["transformers"] = transformers.__version__
    from vllm.config import ModelConfig

    config = ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=1024)
    out["head_size"] = config.get_head_size()
    out["error"] = None
except Exception as exc:  # the fact to report, whatever it is
    out["error"] = type(exc).__name__
    out["message"] = str(exc)[:300]
print("GEMMA4_CONFIG " + json.dumps(out))
