"""`g4build patches port`: the real series carried between pins, on the real 0.33.0 sdist tree.

The tree comes from tests/support/trees.py (the pinned sdist, fetched once: `network`, offline afterwards) and is
only read; every file written lies in the test's tmp_path project.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

from g4build.data import set_root_option
from g4build.errors import UsageError
from g4build.pins.model import load_pins
from g4build.series.check import HunkProblem, PatchResult
from g4build.series.model import PinVariant, Series, SeriesPatch, load_all
from g4build.series.patchfile import parse_patch
from g4build.series.port import SeriesPort, from_pin_for, plan_port, port_conflict_error

REPO = Path(__file__).resolve().parents[3]
COPY = "vllm-0.33.0-copy"


def _project(tmp_path: Path, source: str = "vllm-0.33.0", name: str = COPY, version: str | None = None) -> Path:
    """A copy of the project's patches/ with one more pin: the ``source`` release under another name (so no series
    has a variant for it); ``version``: and another version."""
    root = tmp_path / "project"
    if not root.exists():
        shutil.copytree(REPO / "patches", root / "patches")
    pins = root / "patches" / "pins.yaml"
    text = pins.read_text(encoding="utf-8")
    block = text[text.index(f"  {source}:\n"):].split("\n\n")[0].rstrip("\n") + "\n"
    block = block.replace(f"  {source}:\n", f"  {name}:\n", 1)
    if version:
        block = re.sub(r'^    version: "[^"]+"$', f'    version: "{version}"', block, count=1, flags=re.M)
    pins.write_text(text.rstrip("\n") + "\n\n" + block, encoding="utf-8")
    return root


def _g4build(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, G4BUILD_CACHE=str(tmp_path / "cache"), G4BUILD_PLAIN="1")
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _series_with(variants: dict[str, int]) -> Series:
    """A series with a variant of ``n`` (dummy) patches for each named pin: all from_pin_for reads."""
    patch = SeriesPatch(file="x.patch", subject="x", path=Path("x.patch"))
    return Series(name="s", version=1, title="", why="", refs=(), origin="", bug="", forwarded="no",
                  applied_upstream=None, python_only=True, folder=Path("s"),
                  pins={pin: PinVariant(patches=(patch,) * n) for pin, n in variants.items()})


def test_the_default_from_pin_is_the_nearest_release_with_a_variant(tmp_path: Path) -> None:
    root = _project(tmp_path, "vllm-0.33.0", COPY)
    pinset = load_pins(root / "patches" / "pins.yaml")
    both = _series_with({"vllm-0.21.0": 1, "vllm-0.33.0": 1})
    assert from_pin_for(both, "vllm-0.26.0", pinset) == "vllm-0.21.0"  # 5 minor releases up vs 7 down
    assert from_pin_for(both, "vllm-0.29.0", pinset) == "vllm-0.33.0"  # 4 down vs 8 up
    assert from_pin_for(both, COPY, pinset) == "vllm-0.33.0"  # the same release under another name
    assert from_pin_for(_series_with({"vllm-0.21.0": 1, "vllm-0.29.0": 1}), "vllm-0.26.0", pinset) == "vllm-0.29.0"
    # a tie goes to the older release; a newer variant without patches (upstream there) is never ported back
    pinset = load_pins(_project(tmp_path, "vllm-0.33.0", "vllm-0.31.0", "0.31.0") / "patches" / "pins.yaml")
    assert from_pin_for(_series_with({"vllm-0.21.0": 1, "vllm-0.31.0": 1}), "vllm-0.26.0", pinset) == "vllm-0.21.0"
    assert from_pin_for(_series_with({"vllm-0.31.0": 1, "vllm-0.21.0": 1}), "vllm-0.26.0", pinset) == "vllm-0.21.0"
    assert from_pin_for(_series_with({"vllm-0.21.0": 1, "vllm-0.29.0": 0}), "vllm-0.26.0", pinset) == "vllm-0.21.0"
    with pytest.raises(UsageError, match="no variant of another pin"):
        from_pin_for(_series_with({"vllm-0.26.0": 1}), "vllm-0.26.0", pinset)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """The copied project, read as `g4build --root` would (and the option put back afterwards)."""
    root = _project(tmp_path)
    set_root_option(root)
    try:
        yield root
    finally:
        set_root_option(None)


def test_plan_port_chooses_the_series_and_their_from_pins(project: Path) -> None:
    names = [s.name for s in load_all()]
    plan = plan_port(None, all_series=True, to=COPY, from_pin=None, dry_run=True)
    assert plan.target.name == COPY and list(plan.chosen) == names  # no series has a variant for the copy yet
    assert plan.from_pins == {n: "vllm-0.33.0" for n in names}  # the same release under another name
    assert [s.name for s in plan.stack] == names
    one = plan_port("mm-prefix-fa", all_series=False, to=COPY, from_pin="vllm-0.29.0", dry_run=False)
    assert (one.chosen, one.from_pins) == (("mm-prefix-fa",), {"mm-prefix-fa": "vllm-0.29.0"})
    ported = SeriesPort(series="mm-prefix-fa", from_pin="vllm-0.29.0", to_pin=COPY, results=())
    assert plan.not_tried([ported]) == [n for n in names if n != "mm-prefix-fa"]


def test_plan_port_refusals_keep_their_messages(project: Path) -> None:
    for series, all_series in ((None, False), ("mm-prefix-fa", True)):
        with pytest.raises(UsageError) as raised:
            plan_port(series, all_series=all_series, to=COPY, from_pin=None, dry_run=True)
        assert raised.value.message == "pass a series name or --all (one of them)"
        assert raised.value.hint == "e.g. `g4build patches port mm-prefix-fa --to vllm-0.34.0`"
    with pytest.raises(UsageError) as raised:
        plan_port(None, all_series=True, to="vllm-0.33.0", from_pin=None, dry_run=True)
    assert raised.value.message == "every series already has a variant for vllm-0.33.0: nothing to port"
    assert raised.value.hint == "change one with `g4build patches refresh SERIES --pin vllm-0.33.0 --tree …`"
    with pytest.raises(UsageError) as raised:
        plan_port(None, all_series=True, to=COPY, from_pin=COPY, dry_run=True)
    names = ", ".join(s.name for s in load_all())
    assert raised.value.message == f"--from {COPY}: series {names} has no variant for it"
    assert raised.value.hint == "pass a pin the series has patches for (`g4build patches list`), or drop --from"


def _ported(series: str, *statuses: str, problems: int = 0) -> SeriesPort:
    hunks = tuple(HunkProblem(file="vllm/x.py", hunk=i + 1, line=10 * (i + 1), why="context differs")
                  for i in range(problems))
    results = tuple(PatchResult(file=f"vllm-0.33.0/000{i + 1}-p.patch", subject="p", status=status,  # type: ignore[arg-type]
                                detail="does not apply", problems=hunks if status == "conflict" else ())
                    for i, status in enumerate(statuses))
    return SeriesPort(series=series, from_pin="vllm-0.33.0", to_pin=COPY, results=results)


def test_port_conflict_error_says_where_it_stopped_and_what_was_not_written() -> None:
    assert port_conflict_error([_ported("a", "applies")], to=COPY, not_tried=[]) is None
    alone = port_conflict_error([_ported("a", "applies", "conflict")], to=COPY, not_tried=[])
    assert alone is not None and alone.exit_code == 8
    assert alone.message == (f"series a does not port from vllm-0.33.0 to {COPY}: vllm-0.33.0/0002-p.patch "
                             "conflicts, does not apply; nothing was written")
    assert alone.hint == (f"make the change on a tree of {COPY} with the series before it applied and record it with "
                          f"`g4build patches refresh a --pin {COPY} --tree PATH --from-diff`")
    after = port_conflict_error([_ported("a", "merged"), _ported("b", "conflict", problems=3)], to=COPY,
                                not_tried=["c"])
    assert after is not None
    assert after.message == (f"series b does not port from vllm-0.33.0 to {COPY}: vllm-0.33.0/0001-p.patch conflicts, "
                             "hunk #1 at vllm/x.py:10: context differs (and 2 more); nothing was written (also not a, "
                             "which ported); not tried after it: c")
    assert after.hint is not None and after.hint.startswith(
        f"port a alone first (`g4build patches port NAME --to {COPY}`); then make the change on a tree of ")


def test_a_series_that_has_the_target_variant_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path)
    before = _digest(root / "patches")
    proc = _g4build(tmp_path, "--root", str(root), "patches", "port", "mm-prefix-fa", "--to", "vllm-0.33.0",
                    "--tree", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "already has a variant for vllm-0.33.0" in proc.stderr and "patches refresh" in proc.stderr
    assert _digest(root / "patches") == before


def test_from_a_pin_the_series_has_no_variant_for_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path)
    proc = _g4build(tmp_path, "--root", str(root), "patches", "port", "mm-prefix-fa", "--to", COPY,
                    "--from", COPY, "--tree", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert f"--from {COPY}: series mm-prefix-fa has no variant for it" in proc.stderr


@pytest.mark.network
def test_all_ports_only_the_series_without_a_variant_and_stops_at_a_conflict(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.33.0")
    root = _project(tmp_path)
    args = ("--root", str(root), "patches", "port", "--all", "--to", COPY, "--tree", str(tree), "--json")
    first = _g4build(tmp_path, "--root", str(root), "patches", "port", "gemma4-backend-decoupling", "--to", COPY,
                     "--tree", str(tree))
    assert first.returncode == 0, first.stderr
    before = _digest(root / "patches")
    proc = _g4build(tmp_path, *args, "--from", "vllm-0.21.0", "--dry-run")
    assert proc.returncode == 8, proc.stderr
    out = json.loads(proc.stdout)
    assert [s["series"] for s in out["series"]] == ["dflash-batched-verification"]  # gemma4-… is laid down only
    assert out["not_tried"] == ["mm-prefix-fa"] and "not tried after it: mm-prefix-fa" in proc.stderr
    assert _digest(root / "patches") == before


@pytest.mark.network
def test_porting_to_the_same_release_gives_the_same_patches(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.33.0")
    root = _project(tmp_path)
    before = _digest(root / "patches")
    args = ("--root", str(root), "patches", "port", "--all", "--to", COPY, "--tree", str(tree), "--json")
    dry = _g4build(tmp_path, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [s["written"] for s in json.loads(dry.stdout)["series"]] == [False, False, False]
    assert _digest(root / "patches") == before
    proc = _g4build(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    old, new = load_all(REPO / "patches"), {s.name: s for s in load_all(root / "patches")}
    for series in old:
        ported = new[series.name]
        assert ported.version == series.version + 1
        want = [(p.subject, p.read_bytes()) for p in series.patches_for("vllm-0.33.0")]
        assert [(p.subject, p.read_bytes()) for p in ported.patches_for(COPY)] == want
        variant, source = ported.variant(COPY), series.variant("vllm-0.33.0")
        assert variant is not None and source is not None
        assert variant.fingerprints == source.fingerprints
        assert variant.note.startswith("Ported from vllm-0.33.0")
        # the rest of series.yaml is kept line for line
        old_lines = (series.folder / "series.yaml").read_text().splitlines()[2:]
        assert (ported.folder / "series.yaml").read_text().splitlines()[2:len(old_lines) + 2] == old_lines
    check = _g4build(tmp_path, "--root", str(root), "patches", "check", "--pin", COPY, "--tree", str(tree))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.network
def test_a_port_that_conflicts_writes_nothing_and_says_where(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.33.0")
    root = _project(tmp_path)
    before = _digest(root / "patches")
    proc = _g4build(tmp_path, "--root", str(root), "patches", "port", "mm-prefix-fa", "--to", COPY,
                    "--from", "vllm-0.21.0", "--tree", str(tree), "--json")
    assert proc.returncode == 8, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["series"][0]["written"] is False
    conflict = out["series"][0]["patches"][0]
    assert conflict["status"] == "conflict" and "vllm/platforms/cuda.py" in conflict["detail"]
    assert "nothing was written" in proc.stderr
    assert _digest(root / "patches") == before


COPY29 = "vllm-0.29.0-copy"
DFLASH = "dflash-batched-verification"


def _port(tmp_path: Path, root: Path, series: str, to: str, tree: Path,
          *extra: str) -> subprocess.CompletedProcess[str]:
    return _g4build(tmp_path, "--root", str(root), "patches", "port", series, "--to", to, "--from", "vllm-0.33.0",
                    "--tree", str(tree), "--json", *extra)


@pytest.mark.network
def test_a_patch_whose_context_moved_is_merged_three_ways_and_then_applies_with_zero_fuzz(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.29.0")
    root = _project(tmp_path, "vllm-0.29.0", COPY29)
    proc = _port(tmp_path, root, DFLASH, COPY29, tree)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["series"][0]
    # 0001's context moved between 0.29.0 and 0.33.0 (zero fuzz refuses it); the merge carries it over
    assert [p["status"] for p in out["patches"]] == ["merged", "applies"] and out["written"] is True
    assert out["patches"][0]["detail"] == ("three-way merged with vllm-0.33.0's files: "
                                           "vllm/model_executor/models/qwen3_dflash.py")
    series = {s.name: s for s in load_all(root / "patches")}[DFLASH]
    variant, source = series.variant(COPY29), series.variant("vllm-0.33.0")
    assert variant is not None and source is not None
    assert variant.fingerprints == source.fingerprints and out["lost_fingerprints"] == {}
    assert variant.note.startswith("Ported from vllm-0.33.0 by `g4build patches port`: 1 patch(es) applied, "
                                   "1 three-way merged, 0 already upstream.")
    check = _g4build(tmp_path, "--root", str(root), "patches", "check", "--pin", COPY29, "--tree", str(tree), "--json")
    result = {s["name"]: s for s in json.loads(check.stdout)["series"]}[DFLASH]
    assert result["status"] == "needed"
    assert [p["detail"] for p in result["patches"]] == ["applies cleanly", "applies cleanly"]


@pytest.mark.network
def test_a_change_the_new_tree_already_has_in_other_surroundings_is_marked_upstream(tmp_path: Path) -> None:
    pristine = sdist_tree("vllm-0.29.0")
    root = _project(tmp_path, "vllm-0.29.0", COPY29)
    assert _port(tmp_path, root, DFLASH, COPY29, pristine).returncode == 0
    # a 0.29.0 tree that already carries the merged 0001 (as a later release might): the files the series reads
    tree = tmp_path / "tree"
    for rel in ("vllm/model_executor/models/qwen3_dflash.py", "vllm/v1/attention/backends/triton_attn.py"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pristine / rel, tree / rel)
    merged = {s.name: s for s in load_all(root / "patches")}[DFLASH].patches_for(COPY29)[0]
    subprocess.run(["git", "apply", str(merged.path)], cwd=tree, check=True)
    again = _project(tmp_path, "vllm-0.29.0", "vllm-0.29.0-again")
    proc = _port(tmp_path, again, DFLASH, "vllm-0.29.0-again", tree)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["series"][0]
    assert [p["status"] for p in out["patches"]] == ["upstream", "applies"]
    assert "a three-way merge with vllm-0.33.0's files changes nothing" in out["patches"][0]["detail"]
    variant = {s.name: s for s in load_all(again / "patches")}[DFLASH].variant("vllm-0.29.0-again")
    assert variant is not None
    assert [p.file for p in variant.patches] == ["vllm-0.29.0-again/0003-triton-metadata-from-kv-cache-spec.patch"]
    assert "1 already upstream (0001-gemma4-draft-embed-scale-and-logit-softcap.patch)" in variant.note


@pytest.mark.network
def test_a_merge_that_conflicts_names_each_region_on_both_trees_and_writes_nothing(tmp_path: Path) -> None:
    tree = sdist_tree("vllm-0.29.0")
    root = _project(tmp_path, "vllm-0.29.0", COPY29)
    before = _digest(root / "patches")
    proc = _port(tmp_path, root, "mm-prefix-fa", COPY29, tree)
    assert proc.returncode == 8, proc.stderr
    assert _digest(root / "patches") == before
    stopped = json.loads(proc.stdout)["series"][0]["patches"][0]
    assert stopped["status"] == "conflict" and stopped["hunks"]
    patch = {s.name: s for s in load_all(root / "patches")}["mm-prefix-fa"].patches_for("vllm-0.33.0")[0]
    hunks = {(d.path, h.number): h for d in parse_patch(patch.read_bytes(), where="p") for h in d.hunks}
    lines = (tree / "vllm/v1/attention/backends/flash_attn.py").read_text().splitlines()
    for problem in stopped["hunks"]:
        m = re.fullmatch(rf"three-way merge conflict: {COPY29} lines? (\d+)(?:-(\d+))? changed where the patch "
                         r"changes vllm-0.33.0 lines? (\d+)(?:-(\d+))?", problem["why"])
        assert m, problem
        # the old lines named overlap the hunk named, and the new tree's lines named exist
        hunk = hunks[(problem["file"], problem["hunk"])]
        assert int(m[3]) == problem["line"] < hunk.old_start + hunk.old_count
        assert int(m[4] or m[3]) >= hunk.old_start
        assert problem["file"] != "vllm/v1/attention/backends/flash_attn.py" or int(m[2] or m[1]) <= len(lines)
    assert "mm-prefix-fa does not port from vllm-0.33.0 to vllm-0.29.0-copy" in proc.stderr
    assert "nothing was written" in proc.stderr
