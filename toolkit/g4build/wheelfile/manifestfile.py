"""build-manifest.json as a file: its name, its schema check, its bytes. What goes into it is emit's
(``g4build.emit.manifest``); this part sits low so that validation, overlays and recipes read a wheel's manifest
without depending on the stage that writes it."""

from __future__ import annotations

import json
from typing import Any

from g4build.errors import ValidationError

MANIFEST_NAME = "build-manifest.json"
SCHEMA = 1


def dumps(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def loads(raw: bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"{where}: {MANIFEST_NAME} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("series"), list):
        raise ValidationError(f"{where}: {MANIFEST_NAME} is not a g4build manifest of schema {SCHEMA}")
    return data
