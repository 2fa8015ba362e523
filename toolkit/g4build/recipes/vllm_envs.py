"""The environment variables the pinned vLLM reads: the keys of ``environment_variables`` in the pin's own
``vllm/envs.py`` (never imported; parsed with ``ast``). Each pin's names are recorded in the project as data beside
its argument table (``recipes/vllm-args/<pin>.envs.json``, stamped with the sdist's sha256; ``pins add`` writes it,
a test keeps it equal to what the sdist gives), so render and check are right for every pin offline; a pin without
one falls back to the cache (keyed by the sdist's sha256) or the cached sdist."""

from __future__ import annotations

import ast
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from g4build.data import recipes_dir
from g4build.errors import ConfigError
from g4build.fsutil import write_atomic
from g4build.pins.index import cache_root, sha256_file
from g4build.pins.model import Pin
from g4build.recipes.model import ENV_NAME_RE
from g4build.util.safeload import read_json

ENVS_FILE = "vllm/envs.py"
_CACHE_VERSION = 1
TABLES_DIR = "vllm-args"  # beside the argument tables (vllm_args.TABLES_DIR)


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


def recorded_envs_path(pin: Pin, root: Path | None = None) -> Path:
    return (root / "recipes" if root is not None else recipes_dir()) / TABLES_DIR / f"{pin.name}.envs.json"


def envs_from_sdist(pin: Pin, archive: Path) -> dict[str, Any]:
    """What the project records for ``pin``: its envs.py names, stamped with the sdist's sha256."""
    return {"version": _CACHE_VERSION, "pin": pin.name, "sdist_sha256": pin.sdist.sha256.lower(),
            "envs": sorted(env_names(_read_envs_file(archive)))}


def _typed_names(data: object, path: Path, fix: str) -> frozenset[str]:
    """``data["envs"]``, a list of variable names, or a ConfigError: a string would be read letter by letter (and
    the recipe's VLLM_ names then dropped as unread), a number is no name."""
    envs = data.get("envs") if isinstance(data, dict) else None
    if not isinstance(envs, list) or not all(isinstance(n, str) and ENV_NAME_RE.fullmatch(n) for n in envs):
        found = type(envs).__name__ if not isinstance(envs, list) else next(
            repr(n) for n in envs if not (isinstance(n, str) and ENV_NAME_RE.fullmatch(n)))
        raise ConfigError(f"{path}: 'envs' must be a list of environment variable names, found {found}",
                          hint=fix)
    return frozenset(envs)


def recorded_envs(pin: Pin) -> frozenset[str] | None:
    """The names recorded in the project for ``pin`` when they were read from this pin's sdist; else None (no
    file, or one for another sdist). A file of the wrong shape is a ConfigError."""
    path = recorded_envs_path(pin)
    if not path.is_file():
        return None
    data = read_json(path, 4 << 20, f"the recorded list of vLLM {pin.version}'s environment variables")
    if (isinstance(data, dict) and data.get("version") == _CACHE_VERSION
            and data.get("sdist_sha256") == pin.sdist.sha256.lower()):
        return _typed_names(data, path, f"write it again from the sdist: `g4build pins add` for {pin.name}, or "
                                        "delete the file")
    return None


def _verified_sdist(pin: Pin) -> Path | None:
    archive = cache_root() / "sdists" / pin.sdist.file
    if not archive.is_file() or sha256_file(archive) != pin.sdist.sha256.lower():
        return None
    return archive


def record_envs(pin: Pin, root: Path) -> Path | None:
    """Write ``pin``'s names into the project at ``root`` from the cached, sha256-checked sdist (as `pins add`
    leaves it); None when that sdist is not in the cache."""
    archive = _verified_sdist(pin)
    if archive is None:
        return None
    path = recorded_envs_path(pin, root)
    write_atomic(path, (json.dumps(envs_from_sdist(pin, archive), indent=1, sort_keys=True) + "\n").encode())
    return path


def pinned_envs(pin: Pin) -> frozenset[str] | None:
    """The pin's names as recorded in the project, else from the cache, else from the cached sdist; None when none
    of them is here (a pin added by hand, offline)."""
    recorded = recorded_envs(pin)
    if recorded is not None:
        return recorded
    cached = cache_root() / "vllm-envs" / f"{pin.name}-{pin.sdist.sha256[:16]}.json"
    if cached.is_file():
        data = read_json(cached, 4 << 20, "a cached list of vLLM's environment variables")
        if isinstance(data, dict) and data.get("version") == _CACHE_VERSION:
            return _typed_names(data, cached, "delete it: it is a cache, read again from the pin's sdist")
    archive = _verified_sdist(pin)
    if archive is None:
        return None
    names = sorted(env_names(_read_envs_file(archive)))
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_name(f"{cached.name}.{os.getpid()}.part")
    part.write_text(json.dumps({"version": _CACHE_VERSION, "envs": names}), encoding="utf-8")
    os.replace(part, cached)  # complete or absent, also with two processes at once
    return frozenset(names)
