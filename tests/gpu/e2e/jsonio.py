"""Result files of the e2e scripts: written whole or not at all (a killed run never leaves half a JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
