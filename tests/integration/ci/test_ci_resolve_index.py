"""`g4build ci resolve` against the real package index (pip's configured index, as the nightly uses it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from packaging.version import Version

from g4build.data import project_root


@pytest.mark.network
def test_resolve_finds_the_newest_release_on_the_index() -> None:
    env = dict(os.environ, PYTHONPATH=str(project_root() / "toolkit"))
    done = subprocess.run([sys.executable, "-m", "g4build", "ci", "resolve", "--json"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert Version(out["release"]) >= Version("0.33.0")  # the newest release when this was written
    assert out["pin"] in ("", f"vllm-{out['release']}")
    assert json.loads(out["build_matrix"])["include"]
