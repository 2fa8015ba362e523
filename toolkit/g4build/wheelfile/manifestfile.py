"""build-manifest.json as a file: its name, its schema check, its bytes. What goes into it is emit's
(``g4build.emit.manifest``); this part sits low so that validation, overlays and recipes read a wheel's manifest
without depending on the stage that writes it."""

from __future__ import annotations

import json
from typing import Any

from g4build.errors import ValidationError
from g4build.util.safeload import loads_json

MANIFEST_NAME = "build-manifest.json"
SCHEMA = 1


def dumps(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


MAX_BYTES = 4 << 20  # a manifest is a few KB; a bigger member is read no further


def loads(raw: bytes, where: str) -> dict[str, Any]:
    """A manifest's JSON, checked for its schema and for the types the readers use: ``series`` a list of objects
    with a text ``name`` and an integer ``version``, ``pin`` an object with a text ``name``. Anything else, and
    nesting or numbers past ``safeload``'s bounds, is a ValidationError (exit 10), never a traceback."""
    if len(raw) > MAX_BYTES:
        raise ValidationError(f"{where}: {MANIFEST_NAME} is {len(raw)} bytes, over the {MAX_BYTES} a manifest may be")
    data = loads_json(raw, f"{where}: {MANIFEST_NAME}", error=ValidationError)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("series"), list):
        raise ValidationError(f"{where}: {MANIFEST_NAME} is not a g4build manifest of schema {SCHEMA}")
    for n, entry in enumerate(data["series"]):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("version", 0), int) and not isinstance(entry.get("version", 0), bool)):
            raise ValidationError(f"{where}: {MANIFEST_NAME} series[{n}]: expected an object with a text name and "
                                  f"an integer version, found {json.dumps(entry)[:120]}")
    pin = data.get("pin")
    if pin is not None and not (isinstance(pin, dict) and isinstance(pin.get("name"), str)):
        raise ValidationError(f"{where}: {MANIFEST_NAME} pin: expected an object with a text name, found "
                              f"{json.dumps(pin)[:120]}")
    return data
