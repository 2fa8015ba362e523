"""Fixtures for the dflash-batched-verification behaviour tests: real pinned trees, patched and pristine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _pytest.reports import TestReport
from _pytest.runner import runtestprotocol
from tests.support.trees import patched_tree, sdist_tree

PINS = ("vllm-0.21.0", "vllm-0.33.0")
SERIES = "dflash-batched-verification"


@pytest.fixture(scope="session", params=PINS)
def pin(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def patched(pin: str) -> Path:
    """The pin's tree with every series applied in order (ours among them)."""
    return patched_tree(pin)


@pytest.fixture(scope="session")
def pristine_021() -> Path:
    return sdist_tree("vllm-0.21.0")


@pytest.fixture(scope="session")
def patched_021() -> Path:
    return patched_tree("vllm-0.21.0")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run each test of this folder in a forked child: vLLM's import registers process-wide torch state, so a
    process can import one vLLM tree once, and these tests import a tree for real."""
    if not hasattr(os, "fork"):
        return None  # no fork (Windows): in-process, where a second tree in one run is refused by patched_modules
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run setup, call and teardown, send the reports back, exit without cleanup
        os.close(read_end)
        code = 0
        try:
            reports = runtestprotocol(item, log=False, nextitem=None)
            payload = json.dumps([item.config.hook.pytest_report_to_serializable(config=item.config, report=r)
                                  for r in reports])
            with os.fdopen(write_end, "w", encoding="utf-8") as out:
                out.write(payload)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as got:
        payload = got.read()
    _, status = os.waitpid(pid, 0)
    if payload:
        for data in json.loads(payload):
            report = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
            item.ihook.pytest_runtest_logreport(report=report)
    else:
        crashed = TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
                             f"the test's process ended without a report (wait status {status})", "call")
        item.ihook.pytest_runtest_logreport(report=crashed)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
