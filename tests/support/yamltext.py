"""Data files the tests write, in the form g4build writes its own: text that YAML 1.2 would read as a number (a
short commit such as ``531e968659``) is quoted, so that the reader does not refuse what a test meant as text."""

from __future__ import annotations

from typing import Any

import yaml

from g4build.util.yamlsafe import Dumper


def yaml_text(data: Any, **options: Any) -> str:
    """``yaml.safe_dump`` with g4build's own dumper."""
    return yaml.dump(data, Dumper=Dumper, **options)
