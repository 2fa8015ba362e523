"""Suite-wide: which tests share a worker under pytest-xdist (``-n auto --dist loadgroup``, pyproject's addopts).

Downloads and extracted trees are shared between workers on disk already (``tests/support/trees.py``, under
``cache_lock``). What is not shared is a session fixture's in-process result: the series behaviour folders
run each pinned tree's probes once per session in a child interpreter (minutes each). Their tests form one
xdist_group per folder, so each probe runs on one worker only, while the folders still run side by side.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# folders whose session fixtures run probes worth running once: their tests stay together
GROUPED = ("integration/series_a", "integration/series_dflash", "integration/series_dflash_tree")


def group_of(path: Path) -> str | None:
    """The xdist_group of a test file: its folder's, where that folder is GROUPED, else None."""
    try:
        rel = path.resolve().relative_to(HERE).as_posix()
    except ValueError:
        return None
    return next((folder for folder in GROUPED if rel.startswith(folder + "/")), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(Path(str(item.path)))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
