"""Removing trees the way Windows needs: git marks its object files read-only, and shutil.rmtree cannot delete
a read-only file there, so a plain ``rmtree(..., ignore_errors=True)`` leaves half a tree behind."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _retry_writable(func: Callable[[str], Any], path: str, _exc: object) -> None:
    """On a failed delete: clear the read-only bit and try once more; a second failure is left to the caller."""
    try:
        os.chmod(path, stat.S_IWRITE | stat.S_IREAD | (stat.S_IEXEC if os.path.isdir(path) else 0))
        func(path)
    except OSError:
        pass


def remove_tree(path: str | Path) -> bool:
    """Delete ``path`` (a folder or a file) if it exists, read-only files included; True when it is gone."""
    target = Path(path)
    if target.is_symlink() or target.is_file():
        try:
            target.unlink()
        except PermissionError:
            os.chmod(target, stat.S_IWRITE | stat.S_IREAD)
            target.unlink()
        return True
    if not target.exists():
        return True
    if sys.version_info >= (3, 12):
        shutil.rmtree(target, onexc=_retry_writable)
    else:
        shutil.rmtree(target, onerror=_retry_writable)
    return not target.exists()
