"""The three-way file merge of `patches port` (real `git merge-file`): results, and where conflicts are."""

from __future__ import annotations

from g4build.source.merge import FileMerge, MergeConflict, describe, merge_three


def _lines(*words: str) -> bytes:
    return "".join(f"{w}\n" for w in words).encode()


BASE = _lines("a", "b", "c", "d", "e", "f", "g", "h")


def _merge(ours: bytes | None, theirs: bytes | None, base: bytes | None = BASE) -> FileMerge:
    return merge_three("m.py", base=base, ours=ours, theirs=theirs, ours_name="new", base_name="old")


def test_a_change_away_from_the_new_trees_changes_is_carried_over() -> None:
    ours = _lines("top", "a", "b", "c", "d", "e", "f", "g", "h")  # the new release added a line at the top
    theirs = _lines("a", "b", "c", "d", "e", "f", "G", "h")  # the patch changes g
    got = _merge(ours, theirs)
    assert got.ok and got.result == _lines("top", "a", "b", "c", "d", "e", "f", "G", "h")


def test_the_same_change_on_both_sides_is_the_new_file_unchanged() -> None:
    theirs = _lines("a", "b", "C", "d", "e", "f", "g", "h")
    ours = _lines("top", "a", "b", "C", "d", "e", "f", "g", "h")
    got = _merge(ours, theirs)
    assert got.ok and got.result == ours


def test_overlapping_changes_are_located_on_both_trees() -> None:
    ours = _lines("top", "a", "b", "c", "D-new", "e", "f", "g", "h")  # new release: d changed, a line above
    theirs = _lines("a", "b", "c", "D-patch", "e", "f", "g", "h")  # the patch changes d too
    got = _merge(ours, theirs)
    assert not got.ok and got.result == ours
    assert got.conflicts == (MergeConflict(ours_line=5, ours_count=1, base_line=4, base_count=1),)
    text = describe(got.conflicts[0], ours_name="vllm-0.26.0", base_name="vllm-0.21.0")
    assert text == ("three-way merge conflict: vllm-0.26.0 line 5 changed where the patch changes "
                    "vllm-0.21.0 line 4")


def test_insertions_at_the_same_place_are_located_after_the_lines_before_them() -> None:
    ours = _lines("a", "b", "c", "d", "new-1", "new-2", "e", "f", "g", "h")
    theirs = _lines("a", "b", "c", "d", "patch", "e", "f", "g", "h")
    got = _merge(ours, theirs)
    assert got.conflicts == (MergeConflict(ours_line=5, ours_count=2, base_line=5, base_count=0),)
    assert "where the patch adds lines before vllm-0.21.0 line 5" in describe(
        got.conflicts[0], ours_name="vllm-0.26.0", base_name="vllm-0.21.0")


def test_two_conflicts_are_reported_in_file_order() -> None:
    base = _lines(*"abcdefghijklmnop")
    ours = _lines(*"aBcdefghijklmnOp")
    theirs = _lines(*"aXcdefghijklmnYp")
    got = _merge(ours, theirs, base)
    assert [(c.ours_line, c.base_line) for c in got.conflicts] == [(2, 2), (15, 15)]


def test_whole_file_cases_say_why() -> None:
    assert _merge(None, _lines("x")).why == "new has no such file (old has it)"
    assert "the patch adds it, and new already has a different file" in _merge(_lines("y"), _lines("x"), None).why
    assert _merge(None, _lines("x"), None).result == _lines("x")  # a new file the new tree lacks: added
    assert "the patch deletes it" in _merge(_lines("a", "z"), None).why
    assert _merge(BASE, None).ok and _merge(BASE, None).result is None  # deleted where unchanged
    assert _merge(b"\0ours", b"\0theirs", b"\0base").why == "a binary file changed on both sides"


def test_a_conflict_marker_in_the_source_is_not_taken_for_one() -> None:
    base = _lines("a", "<<<<<<< not a marker", "b", "c", "d", "e")
    ours = _lines("a", "<<<<<<< not a marker", "B1", "c", "d", "e")
    theirs = _lines("a", "<<<<<<< not a marker", "B2", "c", "d", "e")
    got = _merge(ours, theirs, base)
    assert got.conflicts == (MergeConflict(ours_line=3, ours_count=1, base_line=3, base_count=1),)


def test_a_short_section_found_twice_is_taken_where_the_clean_lines_put_it() -> None:
    base = _lines(*"abcdefghijklmnop")
    ours = _lines("top", *"aZcdefghijklmZop")  # n became Z (line 15), and line 3 already reads Z
    theirs = _lines(*"abcdefghijklmYop")  # the patch changes n
    got = _merge(ours, theirs, base)
    assert [(c.ours_line, c.base_line) for c in got.conflicts] == [(15, 14)]
