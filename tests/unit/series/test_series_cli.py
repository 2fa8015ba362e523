"""`g4build patches …` through the real command line (`python -m g4build`), on tmp trees and series."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from tests.support.yamltext import yaml_text
from tests.unit.series.series_support import (
    BASE,
    PIN,
    TEN,
    TWENTY,
    Diff,
    Home,
    git,
    make_tree,
    replace_line,
    snapshot,
)

import g4build
from g4build.cli import main
from g4build.cli._common import console, err_console
from g4build.errors import PatchConflictError, SourceError

TOOLKIT = Path(g4build.__file__).resolve().parents[1]


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(home: Home, *args: str) -> Result:
    """Run the real entry point in-process (the subprocess route is covered by test_entry_point_subprocess)."""
    assert os.environ["G4BUILD_HOME"] == str(home.root)
    out, err = io.StringIO(), io.StringIO()
    widths = console._width, err_console._width  # wide tables, put back afterwards for other tests
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        console.width = err_console.width = 200
        try:
            main(["patches", *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            console._width, err_console._width = widths
    return Result(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_entry_point_subprocess(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff)
    bad = make_tree(tmp_path / "bad", {"m.py": replace_line(BASE, "line 20", "line 20 theirs")}, repo=False)
    env = {**os.environ, "PYTHONPATH": str(TOOLKIT)}
    proc = subprocess.run([sys.executable, "-m", "g4build", "patches", "check", "--pin", PIN, "--tree", str(bad),
                           "--json"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == PatchConflictError.exit_code
    assert json.loads(proc.stdout)["series"][1]["status"] == "conflict"


def _series(home: Home, mkdiff: Diff) -> None:
    home.add_series("a", [("Patch ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    home.add_series("b", [("Patch twenty", mkdiff({"m.py": TEN}, {"m.py": TWENTY}))])
    home.add_series("c", [], note="upstream has it since 1.0.0")


def test_list_json_and_table(home: Home, mkdiff: Diff) -> None:
    _series(home, mkdiff)
    data = json.loads(cli(home, "list", "--json").stdout)
    assert [s["name"] for s in data["series"]] == ["a", "b", "c"]
    assert data["series"][0]["pins"][PIN]["patches"][0]["subject"] == "Patch ten"
    table = cli(home, "list")
    assert table.returncode == 0
    assert "none (upstream has it since 1.0.0)" in table.stdout


def test_check_json_shape_and_exit_codes(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff)
    good = make_tree(tmp_path / "good", {"m.py": BASE}, repo=False)
    ok = cli(home, "check", "--pin", PIN, "--tree", str(good), "--json")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["pin"] == PIN
    assert [(s["name"], s["version"], s["status"]) for s in data["series"]] == [
        ("a", 1, "needed"), ("b", 1, "needed"), ("c", 1, "upstream")]
    assert data["series"][0]["patches"] == [
        {"file": f"{PIN}/0001-p1.patch", "status": "applies", "detail": "applies cleanly"}]

    bad = make_tree(tmp_path / "bad", {"m.py": replace_line(BASE, "line 20", "line 20 theirs")}, repo=False)
    fail = cli(home, "check", "--pin", PIN, "--tree", str(bad), "--json")
    assert fail.returncode == PatchConflictError.exit_code
    data = json.loads(fail.stdout)
    assert [s["status"] for s in data["series"]] == ["needed", "conflict", "upstream"]
    assert data["series"][1]["patches"][0]["hunks"][0]["file"] == "m.py"
    assert "patches refresh b --pin" in fail.stderr

    table = cli(home, "check", "--pin", PIN, "--tree", str(bad))
    assert table.returncode == PatchConflictError.exit_code
    assert "conflict" in table.stdout and "context does not match" in table.stdout


def test_check_release_with_tree_uses_the_nearest_pin(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": BASE}, repo=False)
    out = cli(home, "check", "--release", "1.5.0", "--tree", str(tree), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["release"], data["base_pin"]) == ("1.5.0", PIN)
    table = cli(home, "check", "--release", "1.5.0", "--tree", str(tree))
    assert "patch variants of vllm-1.0.0 (the nearest pin)" in table.stdout


def test_apply_status_refresh_new_through_the_cli(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    applied = cli(home, "apply", "--pin", PIN, "--tree", str(tree), "--json")
    assert applied.returncode == 0, applied.stderr
    data = json.loads(applied.stdout)
    assert [c["series"] for c in data["commits"]] == ["a", "b"]
    assert data["head_after"] == git(tree, "rev-parse", "HEAD").strip()

    status = json.loads(cli(home, "status", "--tree", str(tree), "--json").stdout)
    assert [(s["name"], s["state"]) for s in status["series"]] == [("a", "current"), ("b", "current")]

    git(tree, "reset", "-q", "--soft", "HEAD~1")  # fold b's change into a's commit: refresh must refuse
    refused = cli(home, "refresh", "a", "--pin", PIN, "--tree", str(tree))
    assert refused.returncode == SourceError.exit_code
    assert "uncommitted" in refused.stderr

    (tree / "extra.py").write_text("E = 1\n")
    new = cli(home, "new", "d", "--pin", PIN, "--tree", str(tree), "--title", "Extra things", "--ref", "#7", "--json")
    assert new.returncode == 0, new.stderr
    assert json.loads(new.stdout)["written"] == [f"{PIN}/0001-extra-things.patch"]
    assert [s.name for s in home.stack()] == ["a", "b", "c", "d"]


def test_apply_refuses_and_keeps_tree(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": replace_line(BASE, "line 20", "line 20 theirs")})
    before = snapshot(tree)
    out = cli(home, "apply", "--pin", PIN, "--tree", str(tree))
    assert out.returncode == PatchConflictError.exit_code
    assert "does not apply" in out.stderr
    assert f"patches apply --pin {PIN} --tree T --series a`" in out.stderr.replace("\n", " ")
    assert snapshot(tree) == before
    assert git(tree, "log", "--format=%s") == "base\n"
    # the hint's first step works: only the series before the conflict
    partial = cli(home, "apply", "--pin", PIN, "--tree", str(tree), "--series", "a", "--json")
    assert partial.returncode == 0, partial.stderr
    assert [c["series"] for c in json.loads(partial.stdout)["commits"]] == ["a"]
    unknown = cli(home, "apply", "--pin", PIN, "--tree", str(tree), "--series", "zzz")
    assert unknown.returncode == 2
    assert "unknown series zzz" in unknown.stderr
    plain = make_tree(tmp_path / "plain", {"m.py": BASE}, repo=False)
    out = cli(home, "apply", "--pin", PIN, "--tree", str(plain))
    assert out.returncode == SourceError.exit_code
    assert "g4build source fetch" in out.stderr


def _require(home: Home, name: str, pin: str, required: list[str]) -> None:
    path = home.patches / name / "series.yaml"
    meta = yaml.safe_load(path.read_text())
    meta["pins"][pin]["requires"] = required
    path.write_text(yaml_text(meta, sort_keys=False))


def test_apply_refuses_a_subset_without_a_series_another_requires(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    """A variant that is only correct with another series' patches (series.yaml `requires`; on 0.21.0
    backend_per_kind needs dflash's block-major restride) is never applied without them: the tree is untouched."""
    home.add_series("a", [("Patch ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    home.add_series("b", [("Patch twenty", mkdiff({"m.py": TEN}, {"m.py": TWENTY}))])
    _require(home, "a", PIN, ["b"])
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    before = snapshot(tree)
    out = cli(home, "apply", "--pin", PIN, "--tree", str(tree), "--series", "a")
    assert out.returncode == 2
    assert "a needs b" in out.stderr and "--series b" in out.stderr.replace("\n", " ")
    assert snapshot(tree) == before and git(tree, "log", "--format=%s") == "base\n"
    both = cli(home, "apply", "--pin", PIN, "--tree", str(tree), "--series", "a", "--series", "b", "--json")
    assert both.returncode == 0, both.stderr
    assert [c["series"] for c in json.loads(both.stdout)["commits"]] == ["a", "b"]


def test_requires_must_name_a_series_of_the_order(home: Home, mkdiff: Diff) -> None:
    home.add_series("a", [("Patch ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    _require(home, "a", PIN, ["nope"])
    out = cli(home, "list")
    assert out.returncode != 0
    assert "requires: 'nope' is not another series" in out.stderr.replace("\n", " ")
