"""Zip bombs: sizes are limited before anything is inflated, and members are read streaming, never whole."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.hostile import hostile_wheel, zip_bomb
from tests.support.wheelsfactory import run_g4build

import g4build
from g4build.errors import ValidationError
from g4build.overlay.wheel import overlay_wheel, plan_overlay
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.wheel import ValidateOptions, validate_wheel
from g4build.wheelfile import safety


def test_a_member_inflating_past_the_ratio_limit_is_refused_unread(tmp_path: Path, project: Path) -> None:
    bomb = zip_bomb(tmp_path / "in", "vllm/bomb.py", 32 << 20)  # 32 MiB of zeros, ~1000:1
    with zipfile.ZipFile(bomb) as zf:
        info = zf.getinfo("vllm/bomb.py")
    assert info.file_size > safety.MAX_RATIO * info.compress_size  # the fixture is what it claims
    with pytest.raises(ValidationError, match=r"vllm/bomb.py would inflate \d+ bytes to 33554432 .*zip bomb") as err:
        validate_wheel(bomb, ValidateOptions())
    assert "limits: 200:1 per member over 1 MiB, 8 GiB inflated in all" in err.value.message
    with pytest.raises(ValidationError, match=r"vllm/bomb\.py would inflate"):
        overlay_wheel(bomb, plan_overlay(load_pins().get("vllm-0.21.0"), load_all()), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    done = run_g4build("validate", str(bomb))
    assert done.returncode == 10 and "zip bomb" in done.stderr


def test_members_inflating_past_the_total_limit_are_refused(tmp_path: Path, project: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the real limit needs gigabytes on disk: the same check with a smaller limit, on incompressible members
    wheel = hostile_wheel(tmp_path / "in", add={f"vllm/blob{i}.bin": os.urandom(1 << 20) for i in range(3)})
    assert validate_wheel(wheel, ValidateOptions()).ok
    monkeypatch.setattr(safety, "MAX_TOTAL", 2 << 20)
    with pytest.raises(ValidationError, match=r"members would inflate to \d+ bytes in all, a zip bomb"):
        validate_wheel(wheel, ValidateOptions())


MEASURE = """
import resource, sys
from pathlib import Path
from g4build.validate.wheel import ValidateOptions, validate_wheel
report = validate_wheel(Path(sys.argv[1]), ValidateOptions())
assert report.ok, report.failures()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _peak(wheel: Path) -> int:
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", MEASURE, str(wheel)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": toolkit})
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(sys.platform == "win32", reason="resource.getrusage: POSIX")
@pytest.mark.parametrize("name", ["vllm/big.py", "vllm/_big.abi3.so"])
def test_validate_streams_a_large_member_instead_of_holding_it(tmp_path: Path, project: Path, name: str) -> None:
    size = 192 << 20
    block = os.urandom(4096) + b"\0" * (4096 * 30)  # ~30:1, under the ratio limit
    small = hostile_wheel(tmp_path / "small")
    big = hostile_wheel(tmp_path / "big", add={name: block * (size // len(block))})
    # a reader holding the member whole would peak at least `size` above the small wheel's run
    assert _peak(big) - _peak(small) < size // 3
