"""Suite-wide: which tests share a worker under pytest-xdist (``-n auto --dist loadgroup``, pyproject's addopts).

Downloads and extracted trees are shared between workers on disk already (``tests/support/trees.py``, under
``cache_lock``). What is not shared is a session fixture's in-process result: the series behaviour folders
run each pinned tree's probes once per session in a child interpreter (minutes each), cached per pin. Their
tests form one xdist_group per folder and pin (the pin read from the test's id, e.g. ``[vllm-0.33.0]``), so each
pin's probes run on one worker only, while the pins and folders still run side by side (one group per folder
would put a folder's every probe, ~half of a 2-core run, on one worker).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# folders whose session fixtures run probes worth running once: their tests stay together
GROUPED = ("integration/series_a", "integration/series_dflash", "integration/series_dflash_tree")


PIN_IN_ID = re.compile(r"vllm-\d+\.\d+\.\d+")


def group_of(path: Path, test_id: str = "") -> str | None:
    """The xdist_group of a test: its folder and the pin its id names (or the folder alone), where the folder is
    GROUPED; None elsewhere (spread test by test)."""
    try:
        rel = path.resolve().relative_to(HERE).as_posix()
    except ValueError:
        return None
    folder = next((folder for folder in GROUPED if rel.startswith(folder + "/")), None)
    pin = PIN_IN_ID.search(test_id)
    return f"{folder}:{pin.group(0)}" if folder and pin else folder


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marker into the test's id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(Path(str(item.path)), item.name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
