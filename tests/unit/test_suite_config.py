"""The suite's own settings: every test has a time limit (a hang fails by itself, naming the test), the suite
runs on every core with the tests that share a session probe kept together, and heavy tests stay nightly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import GROUPED, HERE, group_of

REPO = HERE.parent


def test_the_test_extras_bring_the_timeout_and_xdist_plugins() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    extras = text.split("\ntest = [", 1)[1].split("\n]", 1)[0]
    assert {"pytest-timeout", "pytest-xdist"} <= set(re.findall(r'^\s*"([a-z-]+)', extras, re.M))


def test_every_test_has_a_generous_time_limit(pytestconfig: pytest.Config) -> None:
    # above the slowest legitimate test (a real CMake build, ~5 min on a loaded 2-core machine), below CI's job
    pytest.importorskip("pytest_timeout")  # it declares the `timeout` setting (the test extras install it)
    assert 600 <= float(pytestconfig.getini("timeout")) <= 1800
    addopts = " ".join(pytestconfig.getini("addopts"))
    assert "-n auto" in addopts and "--dist loadgroup" in addopts and "-m not heavy" in addopts


def test_a_hanging_test_fails_by_itself_and_names_the_test(tmp_path: Path) -> None:
    pytest.importorskip("pytest_timeout")
    pytest.importorskip("xdist")  # the project's addopts name -n
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_waits_forever():\n    time.sleep(600)\n",
                                            encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", "-n", "0", "-o", "timeout=2", "-q",
                           str(tmp_path / "test_hangs.py")],
                          capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Timeout" in done.stdout and "test_waits_forever" in done.stdout


def test_the_grouped_folders_exist_and_group_their_tests() -> None:
    for folder in GROUPED:
        assert (HERE / folder).is_dir(), folder
        assert group_of(HERE / folder / "test_x.py") == folder
    assert group_of(HERE / "integration" / "series" / "test_x.py") is None  # a prefix is not the folder
    # one group per pin: each pin's probes run once, the pins side by side
    a = HERE / "integration" / "series_a" / "test_x.py"
    assert group_of(a, "test_y[vllm-0.33.0]") == "integration/series_a:vllm-0.33.0"
    assert group_of(a, "test_y[vllm-0.33.0-patched]") == "integration/series_a:vllm-0.33.0"
    assert group_of(a, "test_021_only") == "integration/series_a"
    assert group_of(HERE / "unit" / "test_layout.py") is None


def test_ci_run_prints_its_own_time_failed_or_not(tmp_path: Path) -> None:
    (tmp_path / ".ci").mkdir()
    script = tmp_path / ".ci" / "run"
    script.write_bytes((REPO / ".ci" / "run").read_bytes())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 3\n", encoding="utf-8")  # the venv step fails at once
    (bin_dir / "python3").chmod(0o755)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert done.returncode == 3
    assert re.search(r"^\.ci/run: \d+ s \(\d+ min\), exit 3$", done.stderr, re.M), done.stderr
    assert not (tmp_path / ".venv").exists()


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    """The grouping this suite relies on, with the pytest and pytest-xdist installed: a group added at collection
    (as tests/conftest.py does) runs on one worker. pytest 9.2 broke it silently (pyproject pins pytest < 9.2)."""
    pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_collection_modifyitems(items):\n"
        "    for item in items:\n        item.add_marker(pytest.mark.xdist_group('g'))\n", encoding="utf-8")
    (tmp_path / "test_g.py").write_text(
        "import os, time, pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_g(i):\n    time.sleep(0.2)\n"
        "    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "-rA", "--rootdir", str(tmp_path), str(tmp_path / "test_g.py")],
                          capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    workers = set(re.findall(r"WORKER (gw\d+)", done.stdout))
    assert len(workers) == 1, f"the group ran on {sorted(workers)}: --dist loadgroup does not group here"
