"""`check_stack`: forward with zero fuzz, reverse for upstream, drift and conflicts explained per hunk."""

from __future__ import annotations

from pathlib import Path

from tests.unit.series.series_support import (
    BASE,
    PIN,
    TEN,
    Diff,
    Home,
    git,
    make_tree,
    middle_upstream_series,
    replace_line,
    snapshot,
)

from g4build.series.check import check_stack, conflict_error


def _check(home: Home, tree: Path, version: str = "1.0.0"):  # type: ignore[no-untyped-def]
    return check_stack(tree, home.stack(), variant_pin=PIN, version=version)


def test_applies_cleanly_and_with_offset(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    clean = _check(home, make_tree(tmp_path / "clean", {"m.py": BASE}, repo=False))
    assert clean.ok
    assert clean.series[0].status == "needed"
    assert clean.series[0].patches[0].detail == "applies cleanly"

    shifted = make_tree(tmp_path / "shifted", {"m.py": "new a\nnew b\nnew c\n" + BASE}, repo=False)
    report = _check(home, shifted)
    (p,) = report.series[0].patches
    assert p.status == "applies"
    assert [(o.file, o.hunk, o.offset) for o in p.offsets] == [("m.py", 1, 3)]
    assert "offset +3" in p.detail
    assert report.to_dict()["series"][0]["patches"][0]["offsets"][0]["line"] == 10


def test_check_never_touches_the_tree(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    tree = make_tree(tmp_path / "t", {"m.py": BASE, "other.txt": "x\n"})
    before = snapshot(tree)
    assert _check(home, tree).ok
    assert snapshot(tree) == before


def test_upstream_by_reverse_apply(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    report = _check(home, make_tree(tmp_path / "t", {"m.py": TEN}, repo=False))
    assert report.ok
    assert report.series[0].status == "upstream"
    assert "reverse-applies" in report.series[0].patches[0].detail


def test_upstream_by_applied_upstream_metadata(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))], applied_upstream="0.9.0")
    tree = make_tree(tmp_path / "t", {"m.py": TEN}, repo=False)
    report = _check(home, tree)
    assert report.series[0].status == "upstream"
    assert "Applied-Upstream 0.9.0 <= 1.0.0" in report.series[0].patches[0].detail
    # below the Applied-Upstream version the patch is checked normally
    older = _check(home, make_tree(tmp_path / "o", {"m.py": BASE}, repo=False), version="0.8.0")
    assert older.series[0].status == "needed"


def test_conflict_reports_file_hunk_line_and_why(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    after = replace_line(replace_line(BASE, "line 10", "line 10 patched"), "line 30", "line 30 patched")
    home.add_series("s", [("two hunks", mkdiff({"m.py": BASE}, {"m.py": after}))])
    # someone else changed line 30 itself: hunk 2 cannot apply, hunk 1 still would
    tree = make_tree(tmp_path / "t", {"m.py": replace_line(BASE, "line 30", "line 30 theirs")}, repo=False)
    report = _check(home, tree)
    assert not report.ok
    assert report.series[0].status == "conflict"
    (p,) = report.series[0].patches
    assert p.status == "conflict"
    assert [(h.file, h.hunk, h.line, h.why) for h in p.problems] == [("m.py", 2, 27, "context does not match")]
    assert "hunk #2 at m.py:27" in p.detail
    assert report.to_dict()["series"][0]["patches"][0]["hunks"][0]["hunk"] == 2


def test_missing_file_is_a_conflict(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    report = _check(home, make_tree(tmp_path / "t", {"other.py": BASE}, repo=False))
    (p,) = report.series[0].patches
    assert p.status == "conflict"
    assert p.problems[0].why == "file missing"


def test_needs_fuzz_is_flagged_as_drift_conflict(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    # a context line three lines above the change drifted: GNU patch would take it with fuzz; we never do
    tree = make_tree(tmp_path / "t", {"m.py": replace_line(BASE, "line 7", "line 7 drifted")}, repo=False)
    report = _check(home, tree)
    (p,) = report.series[0].patches
    assert p.status == "conflict"
    assert p.problems[0].why.startswith("needs fuzz: drift")
    assert "context reduced to 2" in p.problems[0].why


def test_partial_series(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    both = replace_line(TEN, "line 20", "line 20 patched")
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN})),
                          ("twenty", mkdiff({"m.py": TEN}, {"m.py": both}))])
    # upstream took patch 1 but not patch 2
    report = _check(home, make_tree(tmp_path / "t", {"m.py": TEN}, repo=False))
    assert report.ok
    assert [p.status for p in report.series[0].patches] == ["upstream", "applies"]
    assert report.series[0].status == "partial"


def test_patches_are_checked_cumulatively_across_series(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    new_file = "def helper():\n    return 1\n"
    again = replace_line(TEN, "line 10 patched", "line 10 patched twice")
    home.add_series("first", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN})),
                              ("helper", mkdiff({"m.py": TEN}, {"m.py": TEN, "h.py": new_file}))])
    home.add_series("second", [("again", mkdiff({"m.py": TEN, "h.py": new_file},
                                                {"m.py": again, "h.py": new_file + "X = 2\n"}))])
    tree = make_tree(tmp_path / "t", {"m.py": BASE}, repo=False)
    report = _check(home, tree)
    assert report.ok, report.to_dict()
    assert [s.status for s in report.series] == ["needed", "needed"]
    # alone (without the first series) the second one cannot apply: the dependency is real
    alone = check_stack(tree, [home.get("second")], variant_pin=PIN, version="1.0.0")
    assert alone.series[0].status == "conflict"


def test_conflict_after_an_earlier_conflict_says_so(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    again = replace_line(TEN, "line 10 patched", "line 10 patched twice")
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN})),
                          ("again", mkdiff({"m.py": TEN}, {"m.py": again}))])
    tree = make_tree(tmp_path / "t", {"m.py": replace_line(BASE, "line 10", "line 10 theirs")}, repo=False)
    report = _check(home, tree)
    assert [p.status for p in report.series[0].patches] == ["conflict", "conflict"]
    assert "earlier conflict" in report.series[0].patches[1].detail
    assert "earlier conflict" not in report.series[0].patches[0].detail


def test_empty_variant_is_upstream_with_its_note_and_missing_variant_conflicts(
    home: Home, mkdiff: Diff, tmp_path: Path,
) -> None:
    home.add_series("fixed", [], note="upstream fixed it in 1.0.0 (#123)")
    home.add_series("other-pin-only", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))], pin="vllm-2.0.0")
    report = _check(home, make_tree(tmp_path / "t", {"m.py": BASE}, repo=False))
    fixed, other = report.series
    assert (fixed.status, fixed.note) == ("upstream", "upstream fixed it in 1.0.0 (#123)")
    assert other.status == "conflict"
    assert "no patch variant for vllm-1.0.0" in other.note
    err = conflict_error(report, tree_hint="t")
    assert err.message.startswith("series other-pin-only cannot apply to vllm-1.0.0 (t): no patch variant"), err.message
    assert not report.ok


def test_tree_that_already_carries_a_self_rewriting_series_is_upstream(
    home: Home, mkdiff: Diff, tmp_path: Path,
) -> None:
    # patch 2 rewrites the line patch 1 added: on the patched tree patch 1 alone neither applies nor reverses,
    # but the series pops cleanly from its last patch
    again = replace_line(TEN, "line 10 patched", "line 10 patched twice")
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN})),
                          ("again", mkdiff({"m.py": TEN}, {"m.py": again}))])
    home.add_series("t", [("after", mkdiff({"m.py": again}, {"m.py": again + "tail\n"}))])
    report = _check(home, make_tree(tmp_path / "t", {"m.py": again}, repo=False))
    assert report.ok, report.to_dict()
    assert [p.status for p in report.series[0].patches] == ["upstream", "upstream"]
    assert "reverse-applies from its last patch" in report.series[0].patches[0].detail
    assert report.series[1].status == "needed"


def test_check_at_the_pristine_commit_ignores_later_commits(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": TEN}))])
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    root = git(tree, "rev-parse", "HEAD").strip()
    (tree / "m.py").write_text(TEN)
    git(tree, "commit", "-q", "-am", "patched on top")
    (tree / "m.py").write_text("scribbled\n")  # the work tree does not matter either
    assert _check(home, tree).series[0].status == "conflict"
    at_root = check_stack(tree, home.stack(), variant_pin=PIN, version="1.0.0", at_commit=root)
    assert at_root.series[0].status == "needed"
    assert at_root.tree.endswith(f"@{root[:12]}")


def test_only_the_middle_patch_upstream_is_found_by_its_own_reverse_check(
    home: Home, mkdiff: Diff, tmp_path: Path,
) -> None:
    # The series as a whole does not reverse-apply here (patches 1 and 3 are not in the tree), so the
    # whole-series fallback cannot be what finds patch 2: only the per-patch reverse dry run can.
    upstream_text, _ = middle_upstream_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": upstream_text})
    report = _check(home, tree)
    assert report.ok, report.to_dict()
    (s,) = report.series
    assert [(p.file, p.status) for p in s.patches] == [
        (f"{PIN}/0001-p1.patch", "applies"), (f"{PIN}/0002-p2.patch", "upstream"), (f"{PIN}/0003-p3.patch", "applies"),
    ]
    assert s.patches[1].detail == "already in the tree (reverse-applies cleanly)"
    assert [p.detail for p in (s.patches[0], s.patches[2])] == ["applies cleanly", "applies cleanly"]
    assert s.status == "partial"
    assert (tree / "m.py").read_text() == upstream_text
