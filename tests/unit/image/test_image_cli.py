"""`g4build image extract` on the command line: errors exit with their own codes before any download."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.image.imagebuild import f, layer_tar, oci_layout


def _g4build(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "toolkit"), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=env,
                          check=False)


def test_a_missing_image_exits_12(tmp_path: Path) -> None:
    proc = _g4build("image", "extract", str(tmp_path / "missing.tar"), "--pin", "vllm-0.21.0")
    assert proc.returncode == 12 and "does not exist" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_pin_exits_2(tmp_path: Path) -> None:
    proc = _g4build("image", "extract", str(tmp_path), "--pin", "vllm-9.9.9")
    assert proc.returncode == 2 and "unknown pin 'vllm-9.9.9'" in proc.stderr


def test_an_image_without_vllm_fails_before_the_source_is_fetched(tmp_path: Path) -> None:
    oci_layout(tmp_path / "layout", [layer_tar([f("usr/bin/python3", "x")])])
    proc = _g4build("image", "extract", str(tmp_path / "layout"), "--pin", "vllm-0.21.0", "--out",
                    str(tmp_path / "s" / "x"))
    assert proc.returncode == 12 and "no installed vllm package" in proc.stderr
    assert not (tmp_path / "s").exists()
