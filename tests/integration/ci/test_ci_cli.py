"""`g4build ci matrix` and `g4build ci resolve` through the real CLI."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from g4build.ci import read_github_outputs

RunG4 = Callable[..., subprocess.CompletedProcess[str]]  # the run_g4build fixture (conftest.py)


def test_matrix_json_lists_every_cell_with_what_it_builds(run_g4build: RunG4, with_windows_base: Path) -> None:
    done = run_g4build("ci", "matrix", "--json", "--arch", "all", home=with_windows_base)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["target"] == {"release": "0.21.0", "pin": "vllm-0.21.0"}
    cells = {c["id"]: c for c in out["cells"]}
    gb10 = cells["linux-sm121-cu13.0"]
    assert gb10["role"] == "build" and gb10["runner"] == "ubuntu-24.04-arm" and gb10["required"] is False
    assert gb10["cache_key"] == "g4build-vllm-0.21.0-sm121-cu13.0-linux"
    assert gb10["command"][:2] == ["g4build", "wheel"] and "sm121" in gb10["builds"]
    check = cells["linux-sm120-cu13.0-py3.10"]
    assert check["role"] == "check" and check["required"] is True and check["artifact"] == "g4build-linux-sm120-cu13.0"
    win = cells["windows-sm120-cu13.0"]  # a cp312 wheel: no check cells of other Pythons
    assert win["role"] == "build" and win["required"] is True and "cp312 wheels" in win["builds"]
    assert not any(i.startswith("windows-sm120-cu13.0-py") for i in cells)
    assert not any(i.startswith(("windows-sm121", "windows-sm100")) for i in cells)
    assert len(out["excluded"]) == 2 and out["left_out"] == []


def test_windows_cells_are_left_out_for_a_pin_without_a_windows_base(
    run_g4build: RunG4, project_copy: Path, tmp_path: Path, windows_base: Callable[[Path, str, bool], None],
) -> None:
    windows_base(project_copy, "vllm-0.33.0", False)
    done = run_g4build("ci", "matrix", "--json", "--pin", "vllm-0.33.0", home=project_copy)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["cells"] and {c["os"] for c in out["cells"]} == {"linux"}
    assert out["left_out"] == ["windows: left out: pin vllm-0.33.0 names no windows base tree "
                               "(patches/pins.yaml: pins.vllm-0.33.0.bases.windows)"]
    github_output = tmp_path / "out"
    resolved = run_g4build("ci", "resolve", "--release", "0.40.1", "--github-output", str(github_output),
                           home=project_copy)
    assert resolved.returncode == 0, resolved.stderr
    assert "vLLM 0.40.1 is not pinned" in resolved.stderr
    values = read_github_outputs(github_output.read_text(encoding="utf-8"))
    assert {b["os"] for b in json.loads(values["build_matrix"])["include"]} == {"linux"}
    assert len(json.loads(values["left_out"])) == 1


def test_matrix_for_an_unpinned_release(run_g4build: RunG4) -> None:
    done = run_g4build("ci", "matrix", "--json", "--release", "0.40.1")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["target"] == {"release": "0.40.1", "pin": None}
    assert all("--release" in c["command"] for c in out["cells"] if c["role"] == "build")


def test_matrix_table_and_bad_arch(run_g4build: RunG4, with_windows_base: Path) -> None:
    table = run_g4build("ci", "matrix", home=with_windows_base)
    assert table.returncode == 0 and "linux-sm120-cu13.0-py3.13" in table.stdout
    assert "windows-sm120-cu13.0" in table.stdout and "windows-sm120-cu13.0-py" not in table.stdout
    bad = run_g4build("ci", "matrix", "--arch", "sm89")
    assert bad.returncode == 2 and "unknown arch selection 'sm89'" in bad.stderr


def test_resolve_appends_github_outputs(run_g4build: RunG4, tmp_path: Path, with_windows_base: Path) -> None:
    out_file = tmp_path / "github_output"
    out_file.write_text("earlier=kept\n", encoding="utf-8")
    done = run_g4build("ci", "resolve", "--pin", "vllm-0.33.0", "--release", "", "--arch", "default",
                       "--github-output", str(out_file), home=with_windows_base)
    assert done.returncode == 0, done.stderr
    text = out_file.read_text(encoding="utf-8")
    assert text.startswith("earlier=kept\n")
    values = read_github_outputs(text)
    assert values["earlier"] == "kept"
    assert values["release"] == "0.33.0" and values["pin"] == "vllm-0.33.0"
    builds = json.loads(values["build_matrix"])["include"]
    assert {b["cache_key"] for b in builds} == {
        f"g4build-vllm-0.33.0-sm120-cu{cuda}-{os}" for cuda in ("12.9", "13.0") for os in ("linux", "windows")
    }


def test_resolve_refuses_pin_and_release_together(run_g4build: RunG4) -> None:
    done = run_g4build("ci", "resolve", "--pin", "vllm-0.21.0", "--release", "0.21.0")
    assert done.returncode == 2 and "not both" in done.stderr

