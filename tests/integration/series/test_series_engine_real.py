"""The patch engine on the real pinned vLLM sdist trees: the repository's own series, synthetic series written
against the real files (cumulative, upstream, drift), all-or-nothing apply on a clone, and a release check
verified against the sha256 the package index publishes."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.yamltext import yaml_text

from g4build.cli import main
from g4build.cli._common import console
from g4build.data import patches_dir
from g4build.errors import PatchConflictError
from g4build.pins.index import cache_root, find_file, sha256_file
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.source.fetch import fetch_source

pytestmark = pytest.mark.network

TARGET = "vllm/envs.py"  # present in both pins


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    width = console._width
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        console.width = 200
        try:
            main(["patches", *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            console._width = width
    return code, out.getvalue(), err.getvalue()


def pin_tree(pin: str) -> Path:
    return fetch_source(load_pins().get(pin), "sdist").path


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_check_pin_reports_the_repository_series(pin: str) -> None:
    code, out, err = run("check", "--pin", pin, "--json")
    report = json.loads(out)
    assert report["pin"] == pin
    assert [s["name"] for s in report["series"]] == [s.name for s in load_all()]
    # upstream lacks all three series on both pins (see each series' note): every one is needed, every
    # patch applies, none reads as upstream (which would also hide a patch that turned into a no-op)
    for s in report["series"]:
        assert s["status"] == "needed", (s["name"], s["patches"], err)
        assert {p["status"] for p in s["patches"]} == {"applies"}, (s["name"], s["patches"])
    assert code == 0, err


@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"])
def test_apply_the_repository_series_to_a_clone(pin: str, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(pin_tree(pin)), str(clone))
    base = _git(clone, "rev-parse", "HEAD").strip()
    code, out, err = run("apply", "--pin", pin, "--tree", str(clone), "--json")
    assert code == 0, err
    applied = json.loads(out)
    every = [(s.name, p.file) for s in load_all() for p in s.patches_for(pin)]
    done = [(c["series"], c["file"]) for c in applied["commits"]]
    skipped = [(k["series"], k["file"]) for k in applied["skipped"]]
    assert skipped == []  # nothing is upstream on a pristine pinned tree
    assert done == every  # every patch, one commit each, in stack order
    changed = [f for f in _git(clone, "diff", "--name-only", base, "HEAD").split() if f.endswith(".py")]
    for rel in changed:
        compile((clone / rel).read_text(), rel, "exec")  # every patched Python file still parses
    _, out, _ = run("status", "--tree", str(clone), "--json")
    carried = {s["name"]: s["state"] for s in json.loads(out)["series"]}
    for name in {c["series"] for c in applied["commits"]}:
        assert carried[name] == "current"


def test_check_release_uses_the_index_published_sha256() -> None:
    code, out, err = run("check", "--release", "0.33.0", "--json")
    report = json.loads(out)
    published = find_file("vllm", "vllm-0.33.0.tar.gz").sha256
    assert published
    assert (report["release"], report["base_pin"], report["sdist_sha256"]) == ("0.33.0", "vllm-0.33.0", published)
    assert sha256_file(cache_root() / "sdists" / "vllm-0.33.0.tar.gz") == published
    assert [s["name"] for s in report["series"]] == [s.name for s in load_all()]
    # 0.33.0 is pinned: checking it as a release uses its own variants, so everything is needed and applies
    assert [s["status"] for s in report["series"]] == ["needed"] * len(report["series"]), report["series"]
    assert report["ok"] and code == 0, err
    _, table, _ = run("check", "--release", "0.33.0")
    assert "patch variants of vllm-0.33.0 (the nearest pin)" in table


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def real_diff(work: Path, tree: Path, rel: str, before: Callable[[list[str]], list[str]],
              after: Callable[[list[str]], list[str]]) -> bytes:
    """A git diff of ``rel`` from ``before(real lines)`` to ``after(real lines)``, made in a scratch repo."""
    lines = (tree / rel).read_text().splitlines(keepends=True)
    shutil.rmtree(work, ignore_errors=True)
    (work / rel).parent.mkdir(parents=True)
    _git(work.parent, "init", "-q", work.name)
    (work / rel).write_text("".join(before(list(lines))))
    _git(work, "add", "-A")
    (work / rel).write_text("".join(after(list(lines))))
    return subprocess.run(["git", "diff", "--no-color"], cwd=work, capture_output=True, check=True).stdout


def _insert(at: int, text: str) -> Callable[[list[str]], list[str]]:
    return lambda ls: [*ls[:at], text, *ls[at:]]


def _replace(at: int, text: str) -> Callable[[list[str]], list[str]]:
    return lambda ls: [*ls[:at], text, *ls[at + 1:]]


def _same(ls: list[str]) -> list[str]:
    return ls


def _write_series(home: Path, name: str, pin: str, patches: list[tuple[str, bytes]], fingerprint: str = "") -> None:
    folder = home / "patches" / name
    entries = []
    for i, (subject, data) in enumerate(patches, start=1):
        rel = f"{pin}/{i:04d}-{name}.patch"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
        entries.append({"file": rel, "subject": subject})
    (folder / "series.yaml").write_text(yaml_text({
        "name": name, "version": 1, "title": name, "python_only": True,
        "pins": {pin: {"patches": entries, "fingerprints": {TARGET: [fingerprint]} if fingerprint else {}}},
    }))


@pytest.fixture
def synthetic_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    pin = "vllm-0.21.0"
    tree = pin_tree(pin)
    home = tmp_path / "home"
    (home / "patches").mkdir(parents=True)
    shutil.copy(patches_dir() / "pins.yaml", home / "patches" / "pins.yaml")
    work = tmp_path / "work"
    marker1, marker2 = "# g4build synthetic marker 1\n", "# g4build synthetic marker 2\n"
    _write_series(home, "syn-a", pin, [
        ("Add marker", real_diff(work, tree, TARGET, _same, _insert(100, marker1))),
        ("Edit marker", real_diff(work, tree, TARGET, _insert(100, marker1), _insert(100, marker2))),
    ], fingerprint=marker2.strip())
    # upstream already has line 200: the patch that adds it reverse-applies
    _write_series(home, "syn-up", pin, [
        ("Add line 200", real_diff(work, tree, TARGET, lambda ls: [*ls[:199], *ls[200:]], _same)),
    ])
    # written against a file whose line 297 differed: the change at 300 would need fuzz
    drifted = _replace(296, "# drifted context\n")
    _write_series(home, "syn-drift", pin, [
        ("Edit line 300", real_diff(work, tree, TARGET, drifted,
                                    lambda ls: _replace(299, "# changed\n")(drifted(ls)))),
    ])
    (home / "patches" / "series.yaml").write_text(yaml_text({"order": ["syn-a", "syn-up", "syn-drift"]}))
    monkeypatch.setenv("G4BUILD_HOME", str(home))
    return home, tree


def test_synthetic_series_on_the_real_tree(synthetic_home: tuple[Path, Path], tmp_path: Path) -> None:
    home, tree = synthetic_home
    code, out, err = run("check", "--pin", "vllm-0.21.0", "--json")  # default tree: the pin's sdist
    assert code == PatchConflictError.exit_code, err
    report = json.loads(out)
    assert report["tree"] == f"{tree}@{_git(tree, 'rev-list', '--max-parents=0', 'HEAD')[:12]}"
    assert [(s["name"], s["status"]) for s in report["series"]] == [
        ("syn-a", "needed"), ("syn-up", "upstream"), ("syn-drift", "conflict")]
    (hunk,) = report["series"][2]["patches"][0]["hunks"]
    assert (hunk["file"], hunk["line"]) == (TARGET, 297)
    assert hunk["why"].startswith("needs fuzz: drift")

    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(tree), str(clone))
    head = _git(clone, "rev-parse", "HEAD")
    original = (clone / TARGET).read_bytes()
    code, _, err = run("apply", "--pin", "vllm-0.21.0", "--tree", str(clone))
    assert code == PatchConflictError.exit_code
    assert "syn-drift" in err
    assert _git(clone, "rev-parse", "HEAD") == head
    assert (clone / TARGET).read_bytes() == original
    assert _git(clone, "status", "--porcelain") == ""

    (home / "patches" / "series.yaml").write_text(yaml_text({"order": ["syn-a", "syn-up"]}))
    code, out, err = run("apply", "--pin", "vllm-0.21.0", "--tree", str(clone), "--json")
    assert code == 0, err
    applied = json.loads(out)
    assert [c["file"] for c in applied["commits"]] == ["vllm-0.21.0/0001-syn-a.patch", "vllm-0.21.0/0002-syn-a.patch"]
    assert [s["file"] for s in applied["skipped"]] == ["vllm-0.21.0/0001-syn-up.patch"]
    assert "# g4build synthetic marker 2\n" in (clone / TARGET).read_text()
    code, out, _ = run("status", "--tree", str(clone), "--json")
    assert [(s["name"], s["state"], s["fingerprints"]) for s in json.loads(out)["series"]] == [
        ("syn-a", "current", "present")]
    # the applied tree now carries syn-a: checking it again says upstream
    code, out, _ = run("check", "--pin", "vllm-0.21.0", "--tree", str(clone), "--json")
    assert code == 0
    assert [s["status"] for s in json.loads(out)["series"]] == ["upstream", "upstream"]
    assert sha256_file(tree / TARGET) != sha256_file(clone / TARGET)  # the shared cached tree was not touched
