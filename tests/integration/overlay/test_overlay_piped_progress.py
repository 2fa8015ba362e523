"""`g4build overlay --pin` with its output piped: the download says how far it got on stderr, line by line, and
stdout starts with the result, not a blank line (a rich bar off a terminal draws nothing and leaves one)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import yaml
from tests.support.index_server import serve_index
from tests.support.wheelsfactory import build_wheel, run_g4build
from tests.support.yamltext import yaml_text

from g4build.cli.progress import STEP_UNKNOWN, LineProgress

PIN = "vllm-0.21.0"
MIB = 2**20


def test_a_piped_overlay_shows_its_download_on_stderr(tmp_path: Path, project: Path) -> None:
    wheel = build_wheel(tmp_path / "release")
    pins_file = project / "patches" / "pins.yaml"
    pins = yaml.safe_load(pins_file.read_text())
    pins["pins"][PIN]["wheels"] = {"manylinux_x86_64": {"file": wheel.name,
                                                        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}}
    pins_file.write_text(yaml_text(pins))
    with serve_index() as index:
        index.add(wheel)
        done = run_g4build("overlay", "--pin", PIN, "--out", str(tmp_path / "out"), "--no-validate",
                           env={"G4BUILD_HOME": str(project), "G4BUILD_CACHE": str(tmp_path / "cache"),
                                "PIP_INDEX_URL": index.url})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"downloaded {wheel.name}: ")
    assert f"downloading {wheel.name}: " not in done.stdout and "downloaded" not in done.stdout
    assert done.stdout.startswith("wrote "), repr(done.stdout[:80])  # no blank line first


def test_lines_come_per_tenth_of_a_known_size() -> None:
    out = io.StringIO()
    hook = LineProgress("w.whl", out)
    total = 100 * MIB
    for done in range(0, total + 1, MIB):
        hook(done, total)
    hook.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "downloading w.whl: 0 bytes of 100 MiB (0%)"
    assert lines[1] == "downloading w.whl: 10 MiB of 100 MiB (10%)"
    assert lines[-2] == "downloading w.whl: 90 MiB of 100 MiB (90%)"
    assert lines[-1] == "downloaded w.whl: 100 MiB"
    assert len(lines) == 11  # 0 % to 90 %, then done: never one per chunk


def test_without_a_size_a_line_per_step() -> None:
    out = io.StringIO()
    hook = LineProgress("w.whl", out)
    for done in range(0, 3 * STEP_UNKNOWN + 1, MIB):
        hook(done, None)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1] == f"downloading w.whl: {3 * STEP_UNKNOWN // MIB} MiB"
