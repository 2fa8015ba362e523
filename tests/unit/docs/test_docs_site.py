"""The docs site (toolkit/mkdocs.yml, toolkit/docs/) cannot drift: its command reference is the CLI's own (made by
toolkit/docs_reference.py), it builds with `mkdocs build --strict` (a broken link or anchor fails), every
`g4build ...` it shows names commands and options the CLI has, its shell blocks parse as their shell, and README
links to it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from tests.unit.cli.test_readme_commands import blocks, g4build_commands, problems

import docs_reference
from g4build.cli import app

REPO = Path(__file__).resolve().parents[3]
SITE = REPO / "toolkit"
PAGES = sorted((SITE / "docs").rglob("*.md"))


def test_the_committed_reference_is_the_clis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """After a change to a command's help or options: `python toolkit/docs_reference.py`, and review the diff
    (G4BUILD_UPDATE_GOLDEN=1 with this test does the same)."""
    if os.environ.get("G4BUILD_UPDATE_GOLDEN") == "1":
        assert docs_reference.main([]) == 0
    assert docs_reference.PAGE == SITE / "docs" / "reference.md"
    assert docs_reference.PAGE.read_text(encoding="utf-8") == docs_reference.reference(), (
        "toolkit/docs/reference.md is stale: run `python toolkit/docs_reference.py`")
    assert docs_reference.main(["--check"]) == 0
    # the check itself catches a stale page, and writes nothing
    stale = tmp_path / "reference.md"
    stale.write_text(docs_reference.reference().replace("## g4build overlay\n", "## g4build overlay-old\n"))
    monkeypatch.setattr(docs_reference, "PAGE", stale)
    before = stale.read_bytes()
    assert docs_reference.main(["--check"]) == 1
    assert stale.read_bytes() == before


def test_the_reference_names_every_command_and_option() -> None:
    page = (SITE / "docs" / "reference.md").read_text(encoding="utf-8")
    root = typer.main.get_command(app)

    def walk(node: Any, path: list[str]) -> None:
        assert f"g4build {' '.join(path)}\n".lstrip() in page or not path, path
        for name, sub in getattr(node, "commands", {}).items():
            walk(sub, [*path, name])
        for p in node.params:
            if p.name != "help" and not getattr(p, "hidden", False) and p.param_type_name == "option":
                assert max(p.opts, key=len) in page, (path, p.name)

    walk(root, [])


def _mkdocs(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    # not -q: a quiet build drops the warnings that --strict counts, and passes with a broken link
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d",
                           str(out)], capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = _mkdocs(SITE / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    for page in ("index.html", "reference/index.html", "troubleshooting/index.html", "recipes/index.html",
                 "routes/overlay/index.html", "routes/nightly/index.html", "routes/build/index.html",
                 "wsl/index.html", "windows/index.html", "setup/index.html", "how-it-works/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # strict means strict: a copy of the site with one broken anchor does not build
    copy = tmp_path / "copy"
    shutil.copytree(SITE / "docs", copy / "docs")
    shutil.copy(SITE / "mkdocs.yml", copy / "mkdocs.yml")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text(encoding="utf-8").replace("(routes/overlay.md#the-registrys-wheel",
                                                               "(routes/overlay.md#no-such-heading"))
    broken = _mkdocs(copy / "mkdocs.yml", tmp_path / "site2")
    assert broken.returncode != 0 and "no-such-heading" in broken.stderr


def test_every_page_is_in_the_nav() -> None:
    config = (SITE / "mkdocs.yml").read_text(encoding="utf-8")
    for page in PAGES:
        assert page.relative_to(SITE / "docs").as_posix() in config, page


def test_every_command_the_docs_show_exists_with_its_options() -> None:
    root = typer.main.get_command(app)
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES if p.name != "reference.md")
    commands = g4build_commands(text)
    assert len(commands) > 25
    assert {c: p for c in commands if (p := problems(c, root))} == {}


def test_the_shell_blocks_parse() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    for block in blocks(text, "bash"):
        done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (block, done.stderr)
    import tree_sitter as ts
    import tree_sitter_powershell as tsp

    parser = ts.Parser(ts.Language(tsp.language()))
    shown = blocks(text, "powershell")
    assert len(shown) >= 3
    for block in shown:
        assert not parser.parse(block.encode()).root_node.has_error, block


def test_readme_links_the_docs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in ("toolkit/docs/index.md", "toolkit/docs/troubleshooting.md", "toolkit/docs/reference.md",
                 "toolkit/docs/wsl.md", "toolkit/docs/windows.md", "toolkit/docs/setup.md"):
        assert f"]({page}" in readme, page
        assert (REPO / page).is_file()
