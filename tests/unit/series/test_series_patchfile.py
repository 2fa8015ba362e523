"""Reading real `git diff` output: file sections, hunks, touched paths, and unsafe paths refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.series.series_support import BASE, PIN, Diff, Home, make_tree, replace_line

from g4build.errors import ConfigError
from g4build.series.check import check_stack
from g4build.series.patchfile import parse_patch, touched_paths


def test_sections_hunks_and_paths(mkdiff: Diff) -> None:
    after = replace_line(replace_line(BASE, "line 5", "five"), "line 35", "thirty-five")
    data = mkdiff({"a.py": BASE, "gone.py": "x\n", "tail.txt": "no newline"},
                  {"a.py": after, "gone.py": None, "new/b.py": "B = 1\n", "tail.txt": "still none"})
    diffs = parse_patch(data, where="t.patch")
    by_path = {d.path: d for d in diffs}
    assert set(by_path) == {"a.py", "gone.py", "new/b.py", "tail.txt"}
    assert [(h.number, h.old_start) for h in by_path["a.py"].hunks] == [(1, 2), (2, 32)]
    assert by_path["a.py"].splittable
    assert by_path["gone.py"].new_path is None and not by_path["gone.py"].splittable
    assert by_path["new/b.py"].old_path is None
    assert any(line.startswith("\\ No newline") for line in by_path["tail.txt"].hunks[0].lines)
    assert touched_paths(diffs) == {"a.py", "gone.py", "new/b.py", "tail.txt"}
    assert "".join(d.text() for d in diffs).encode() == data


def test_new_and_deleted_files_check_forward_and_upstream(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    home.add_series("s", [("files", mkdiff({"gone.py": "x\n"}, {"gone.py": None, "pkg/new.py": "N = 1\n"}))])
    before = make_tree(tmp_path / "b", {"gone.py": "x\n"}, repo=False)
    assert check_stack(before, home.stack(), variant_pin=PIN, version="1.0.0").series[0].status == "needed"
    after = make_tree(tmp_path / "a", {"pkg/new.py": "N = 1\n"}, repo=False)
    assert check_stack(after, home.stack(), variant_pin=PIN, version="1.0.0").series[0].status == "upstream"
    clash = make_tree(tmp_path / "c", {"gone.py": "x\n", "pkg/new.py": "other\n"}, repo=False)
    report = check_stack(clash, home.stack(), variant_pin=PIN, version="1.0.0")
    assert [(p.file, p.why) for p in report.series[0].patches[0].problems] == [("pkg/new.py", "file already exists")]


@pytest.mark.parametrize("path", ["../evil.py", "/abs/evil.py"])
def test_paths_leaving_the_tree_are_refused(path: str) -> None:
    data = (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n").encode()
    with pytest.raises(ConfigError, match="leaves the tree"):
        parse_patch(data, where="bad.patch")


def test_not_a_git_patch_and_a_cut_short_hunk() -> None:
    with pytest.raises(ConfigError, match="no 'diff --git'"):
        parse_patch(b"just text\n", where="x.patch")
    cut = b"diff --git a/a b/a\n--- a/a\n+++ b/a\n@@ -1,3 +1,3 @@\n a\n-b\n"
    with pytest.raises(ConfigError, match="cut short"):
        parse_patch(cut, where="x.patch")
