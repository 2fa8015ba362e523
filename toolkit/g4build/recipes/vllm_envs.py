"""The environment variables the pinned vLLM reads: the keys of ``environment_variables`` in the pin's own
``vllm/envs.py``, read from the cached, sha256-checked sdist (never imported; parsed with ``ast``), cached per pin."""

from __future__ import annotations

import ast
import json
import os
import tarfile
from pathlib import Path

from g4build.errors import ConfigError
from g4build.pins.index import cache_root, sha256_file
from g4build.pins.model import Pin
from g4build.util.safeload import read_json

ENVS_FILE = "vllm/envs.py"
_CACHE_VERSION = 1


def env_names(text: str) -> set[str]:
    """The keys of ``environment_variables`` (vLLM logs "Unknown vLLM environment variable" for other VLLM_ names)."""
    for node in ast.parse(text).body:
        target: ast.expr
        value: ast.expr | None
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(value, ast.Dict):
            return {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    raise ValueError(f"{ENVS_FILE} has no environment_variables mapping")


def _read_envs_file(archive: Path) -> str:
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if rel == ENVS_FILE and member.isfile():
                handle = tar.extractfile(member)
                if handle is not None:
                    return handle.read().decode("utf-8")
    raise ValueError(f"the sdist {archive.name} lacks {ENVS_FILE}")


def pinned_envs(pin: Pin) -> frozenset[str] | None:
    """The pin's names from the cache, else from the cached sdist; None when neither is here (offline)."""
    cached = cache_root() / "vllm-envs" / f"{pin.name}-{pin.sdist.sha256[:16]}.json"
    try:
        data = read_json(cached, 4 << 20, "a cached list of vLLM's environment variables")
        if isinstance(data, dict) and data.get("version") == _CACHE_VERSION:
            return frozenset(data["envs"])
    except (ConfigError, KeyError, TypeError):
        pass
    archive = cache_root() / "sdists" / pin.sdist.file
    if not archive.is_file() or sha256_file(archive) != pin.sdist.sha256.lower():
        return None
    names = sorted(env_names(_read_envs_file(archive)))
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_name(f"{cached.name}.{os.getpid()}.part")
    part.write_text(json.dumps({"version": _CACHE_VERSION, "envs": names}), encoding="utf-8")
    os.replace(part, cached)  # complete or absent, also with two processes at once
    return frozenset(names)
