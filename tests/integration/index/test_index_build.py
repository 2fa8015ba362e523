"""`index build`'s promises at their edges, on small real wheels: one failing wheel among good ones publishes
nothing, the copy that is served is the one validated, an earlier site survives a publish that fails half way."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from tests.support.indexsite import tiny_vllm_wheel

from g4build.errors import ValidationError
from g4build.index.pages import SiteOptions
from g4build.index.site import build_index


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _unrecorded(wheel: Path, out: Path) -> Path:
    """``wheel``'s bytes under its own name in ``out``, with a member RECORD does not list (fails validation)."""
    out.mkdir(parents=True, exist_ok=True)
    bad = out / wheel.name
    bad.write_bytes(wheel.read_bytes())
    with zipfile.ZipFile(bad, "a") as zf:
        zf.writestr("vllm/unrecorded.py", "X = 1\n")
    return bad


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".g4build-")]


def test_one_failing_wheel_among_good_ones_publishes_none(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    tiny_vllm_wheel(wheels, tmp_path / "w1", cuda="13.0")
    good_too = tiny_vllm_wheel(tmp_path / "other", tmp_path / "w2", cuda="12.9")
    _unrecorded(good_too, wheels)  # the cu129 wheel, broken, beside the good cu130 one
    site = tmp_path / "site"
    with pytest.raises(ValidationError, match=r"1 of 2 wheel\(s\) failed validation, so no index was written") as info:
        build_index(wheels, site, SiteOptions())
    assert good_too.name in info.value.message and "record" in info.value.message
    assert not site.exists() and _leftovers(tmp_path) == []


def test_the_copy_is_validated_not_the_file_it_was_copied_from(tmp_path: Path) -> None:
    """The source is swapped for a sound wheel after it was copied: what is served is the copy, so the copy is
    what must pass."""
    good = tiny_vllm_wheel(tmp_path / "good", tmp_path / "w")
    wheels = tmp_path / "wheels"
    source = _unrecorded(good, wheels)
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        if text.endswith(f"validating {source.name}"):
            os.replace(good, source)  # the folder's file changes between the copy and the check

    with pytest.raises(ValidationError, match=r"1 of 1 wheel\(s\) failed validation"):
        build_index(wheels, tmp_path / "site", SiteOptions(), say=say)
    assert any(t.endswith(f"validating {source.name}") for t in said), said
    assert not (tmp_path / "site").exists()


def test_a_publish_interrupted_after_the_old_site_moved_aside_puts_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    wheels = tmp_path / "wheels"
    tiny_vllm_wheel(wheels, tmp_path / "w")
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    before = _tree(site)
    real = os.rename
    moves: list[tuple[str, str]] = []

    def interrupted(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        moves.append((Path(src).name, Path(dst).name))
        if Path(dst) == site and Path(src).name == "site" and Path(src) != site:
            raise KeyboardInterrupt  # Ctrl-C between the two renames: the new site never lands
        real(src, dst)

    monkeypatch.setattr(os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_index(wheels, site, SiteOptions(base_url="https://example.invalid/other"))
    monkeypatch.undo()
    assert ("site", "site") in moves, moves  # the interrupt landed where it was meant to
    assert _tree(site) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site", "w", "wheels"]  # nothing set aside or staged
