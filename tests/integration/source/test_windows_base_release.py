"""A Windows base that is a fork *release* (bases.windows without onto: the fork commit used as it is), for
vllm-0.26.0, the pin the Windows fork has a release of. patches/pins.yaml records no such base yet (the fork's
v0.26.0 commit is not verified); this is what recording it gives, shown on a fork of our own making: a real git
repository whose first commit holds real vLLM 0.26.0 files (the registry's sdist) and whose tagged release commit
adds Windows-style edits of ours to files the series leave alone, as the fork's Windows work does (none of the
files the 0.26.0 series patch is among those the fork changes). Then `wheel --os windows --pin vllm-0.26.0`
plans, `source fetch --os windows` clones exactly that commit, and every 0.26.0 series applies to it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest
import yaml
from tests.support.trees import sdist_tree
from tests.support.yamltext import yaml_text

from g4build.data import project_root
from g4build.errors import SourceError
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.series.scratch import touched_paths
from g4build.source.fetch import fetch_source, verify_tree

pytestmark = pytest.mark.network  # the pin's sdist (cached after the first run)

ROOT = project_root()
PIN = "vllm-0.26.0"
WIN_REQS = b"winloop\ntriton-windows\n"


@pytest.fixture(scope="module")
def fork(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("fork") / "vllm-windows"
    repo = git.Repo.init(where)
    pristine = sdist_tree(PIN)
    touched = {p for s in load_all() if (v := s.variant(PIN)) is not None for patch in v.patches
               for p in touched_paths(patch.read_bytes())}
    files = sorted({*touched, "setup.py", "requirements/cuda.txt", "vllm/__init__.py", "vllm/v1/worker/gpu_worker.py"})
    present = [f for f in files if (pristine / f).is_file()]
    for rel in present:
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pristine / rel, where / rel)
    repo.index.add(present)
    repo.index.commit("upstream v0.26.0")
    edits = {"setup.py": b"import platform  # fork: MSVC flags on win32\n",
             "vllm/v1/worker/gpu_worker.py": b"import sys  # fork: gloo where torch has no NCCL\n"}
    for rel, line in edits.items():
        (where / rel).write_bytes(line + (where / rel).read_bytes())
    (where / "requirements/windows.txt").write_bytes(WIN_REQS)
    repo.index.add([*edits, "requirements/windows.txt"])
    head = repo.index.commit("Windows changes, released as v0.26.0").hexsha
    repo.create_tag("v0.26.0", ref=head)
    assert not touched & set(edits)  # the fork's edits stay off the series' files
    return {"remote": str(where), "commit": head}


def _home(tmp_path: Path, base: dict[str, str]) -> Path:
    home = tmp_path / "home"
    shutil.copytree(ROOT / "patches", home / "patches")
    pins_file = home / "patches" / "pins.yaml"
    data = yaml.safe_load(pins_file.read_text())
    data["pins"][PIN]["bases"] = {"windows": base}
    pins_file.write_text(yaml_text(data, sort_keys=False))
    return home


def _g4(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "g4build", "--plain", *args], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "toolkit"),
                                            "G4BUILD_HOME": str(home), "COLUMNS": "300"})


def test_a_recorded_fork_release_plans_fetches_and_takes_the_series(tmp_path: Path, fork: dict[str, str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path, fork)
    # without the base the same command is refused (exit 2) and names the routes that work instead
    assert _g4(ROOT, "wheel", "--arch", "sm120", "--os", "windows", "--pin", PIN, "--dry-run").returncode == 2
    plan = _g4(home, "wheel", "--arch", "sm120", "--os", "windows", "--pin", PIN, "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    steps = {s["name"]: s for s in json.loads(plan.stdout)["steps"]}
    assert f"--pin {PIN} --os windows" in " ".join(steps["source"]["command"])
    assert "windows-requirements" in steps  # the fork's requirements/windows.txt is installed

    monkeypatch.setenv("G4BUILD_HOME", str(home))
    pin = load_pins().get(PIN)
    dest = tmp_path / "src"
    got = fetch_source(pin, os_name="windows", dest=dest)
    assert got.verified == f"commit:{fork['commit']}" and got.port is None  # a release is used as it is
    assert git.Repo(dest).head.commit.hexsha == fork["commit"]
    assert (dest / "requirements/windows.txt").read_bytes() == WIN_REQS
    assert verify_tree(pin, dest) == f"commit:{fork['commit']}"

    check = _g4(home, "patches", "check", "--pin", PIN, "--tree", str(dest), "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["ok"] is True


def test_a_release_base_is_fetched_at_its_commit_and_only_there(tmp_path: Path, fork: dict[str, str]) -> None:
    other = git.Repo(fork["remote"]).head.commit.parents[0].hexsha  # the fork's upstream commit, not the release
    home = _home(tmp_path, {"remote": fork["remote"], "commit": other})
    dest = tmp_path / "src"
    done = _g4(home, "source", "fetch", "--pin", PIN, "--os", "windows", "--dest", str(dest))
    assert done.returncode == 0, done.stderr  # it is fetched, and it is that commit, not the tag's
    assert git.Repo(dest).head.commit.hexsha == other
    assert not (dest / "requirements/windows.txt").exists()
    # a commit the fork does not have is a source error, with nothing left behind
    missing = _home(tmp_path / "m", {"remote": fork["remote"], "commit": "1" * 40})
    dest2 = tmp_path / "src2"
    gone = _g4(missing, "source", "fetch", "--pin", PIN, "--os", "windows", "--dest", str(dest2))
    assert gone.returncode == SourceError.exit_code, gone.stderr
    assert not dest2.exists()
