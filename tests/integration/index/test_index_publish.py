"""`index build` with hostile folders and interruptions (hostile input, round 3): it replaces only a folder it
made, the earlier site survives a kill between the publish step's renames and a failing build after it, one file
per project, version and tags, an unwritable --out is a usage error, and a series claim it cannot check is not
published."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from tests.support.indexsite import tiny_vllm_wheel
from tests.support.wheelsfactory import run_g4build

import g4build
from g4build.errors import UsageError, ValidationError
from g4build.index.pages import SUMMARY, SiteOptions
from g4build.index.site import aside_of, build_index


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheels")
    tiny_vllm_wheel(tmp / "wheels", tmp / "work")
    return tmp / "wheels"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _failing(wheels: Path, tmp_path: Path) -> Path:
    """A folder with the wheel plus a member RECORD does not list: validation fails."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (wheel,) = wheels.glob("*.whl")
    shutil.copyfile(wheel, bad / wheel.name)
    with zipfile.ZipFile(bad / wheel.name, "a") as zf:
        zf.writestr("vllm/unrecorded.py", "X = 1\n")
    return bad


@pytest.mark.parametrize("summary", [
    '{"generator": "g4build index"}\n',  # the name and the generator, not the marker and the list of files
    "my notes, not an index\n",
])
def test_a_folder_with_a_summary_it_did_not_write_is_left_alone(wheels: Path, tmp_path: Path, summary: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / SUMMARY).write_text(summary)
    (home / "thesis.tex").write_text("mine\n")
    before = _tree(home)
    with pytest.raises(UsageError, match="no g4build index site") as raised:
        build_index(wheels, home, SiteOptions())
    assert "left as it is" in raised.value.message
    assert _tree(home) == before


def test_a_site_that_holds_user_files_is_left_alone(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    build_index(wheels, site, SiteOptions())  # its own site: replaced
    (site / "simple" / "mine.txt").write_text("mine\n")
    before = _tree(site)
    with pytest.raises(UsageError, match=r"holds files the site did not write \(simple/mine.txt\)"):
        build_index(wheels, site, SiteOptions())
    assert _tree(site) == before


def test_a_linked_summary_is_no_marker(wheels: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    build_index(wheels, real, SiteOptions())
    home = tmp_path / "home"
    home.mkdir()
    (home / SUMMARY).symlink_to(real / SUMMARY)
    with pytest.raises(UsageError, match="not a regular file"):
        build_index(wheels, home, SiteOptions())
    assert (home / SUMMARY).is_symlink()


KILL_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from g4build.index.pages import SiteOptions
    from g4build.index.site import build_index
    out = Path(sys.argv[2])
    real = os.rename

    def rename(src, dst):
        if Path(dst) == out:  # the earlier site is set aside; the new one is about to take its place
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)

    os.rename = rename
    build_index(Path(sys.argv[1]), out, SiteOptions(base_url="https://example.invalid/new"))
""")


def test_a_kill_between_the_renames_then_a_failing_build_keeps_the_earlier_site(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    before = _tree(site)
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (toolkit, os.environ.get("PYTHONPATH")) if p)}
    killed = subprocess.run([sys.executable, "-c", KILL_BETWEEN_RENAMES, str(wheels), str(site)], env=env,
                            capture_output=True, text=True, check=False, timeout=300)
    assert killed.returncode == -9, killed.stderr
    assert not site.exists() and _tree(aside_of(site)) == before  # killed between the two renames
    with pytest.raises(ValidationError, match="so no index was written"):
        build_index(_failing(wheels, tmp_path), site, SiteOptions())
    # the failing build creates no --out (the aside name may hold a folder no run set aside): the earlier site
    # waits where the kill left it, whole
    assert not os.path.lexists(site) and _tree(aside_of(site)) == before
    build_index(wheels, site, SiteOptions(base_url="https://example.invalid/new"))
    assert b"https://example.invalid/new" in (site / "index.html").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


KILL_WHILE_REMOVING = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from g4build.index.pages import SiteOptions
    from g4build.index.site import build_index

    real = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        summaries = list(Path(path).rglob("g4build-index.json"))
        if summaries:  # the earlier site is being removed: killed half way
            for summary in summaries:
                summary.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, *args, **kwargs)

    shutil.rmtree = rmtree
    build_index(Path(sys.argv[1]), Path(sys.argv[2]), SiteOptions(base_url="https://example.invalid/new"))
""")


def test_a_kill_while_the_earlier_site_is_removed_leaves_the_new_site(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (toolkit, os.environ.get("PYTHONPATH")) if p)}
    killed = subprocess.run([sys.executable, "-c", KILL_WHILE_REMOVING, str(wheels), str(site)], env=env,
                            capture_output=True, text=True, check=False, timeout=300)
    assert killed.returncode == -9, killed.stderr
    assert b"https://example.invalid/new" in (site / "index.html").read_bytes()
    assert not os.path.lexists(aside_of(site))  # the earlier site waits in a staging folder, not at the aside name
    build_index(wheels, site, SiteOptions())  # the next run sweeps the half-removed earlier site
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_kill_after_the_renames_leaves_the_new_site_and_drops_the_aside(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    shutil.copytree(site, aside_of(site))  # the state a kill between the second rename and the removal leaves
    new = _tree(site)
    build_index(wheels, site, SiteOptions())
    assert _tree(site) == new and not os.path.lexists(aside_of(site))


def test_an_empty_folder_set_aside_is_dropped_when_the_build_publishes(wheels: Path, tmp_path: Path) -> None:
    aside_of(tmp_path / "site").mkdir()  # --out named an empty folder, and the run was killed between the renames
    build_index(wheels, tmp_path / "site", SiteOptions())
    assert (tmp_path / "site" / SUMMARY).is_file() and not os.path.lexists(aside_of(tmp_path / "site"))


def test_something_else_at_the_aside_name_is_refused(wheels: Path, tmp_path: Path) -> None:
    aside = aside_of(tmp_path / "site")
    aside.mkdir()
    (aside / "mine.txt").write_text("mine\n")
    with pytest.raises(UsageError, match="expected an earlier index site a killed run set aside"):
        build_index(wheels, tmp_path / "site", SiteOptions())
    assert (aside / "mine.txt").read_text() == "mine\n" and not (tmp_path / "site").exists()


def test_a_planted_aside_beside_a_missing_out_never_becomes_out(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, tmp_path / "elsewhere", SiteOptions(base_url="https://example.invalid/planted"))
    shutil.copytree(tmp_path / "elsewhere", aside_of(site))  # a whole site, as a killed run would leave it
    planted = _tree(aside_of(site))
    said: list[str] = []
    with pytest.raises(ValidationError, match="so no index was written"):
        build_index(_failing(wheels, tmp_path), site, SiteOptions(), say=said.append)
    assert not os.path.lexists(site) and _tree(aside_of(site)) == planted
    assert any("left there if the build fails" in line for line in said), said
    build_index(wheels, site, SiteOptions(base_url="https://example.invalid/new"))  # a build that publishes
    assert b"https://example.invalid/new" in (site / "index.html").read_bytes()
    assert not os.path.lexists(aside_of(site))


def _variant(wheel: Path, how: str) -> str:
    name, version, rest = wheel.name.split("-", 2)
    if how == "case":
        return f"VLLM-{version}-{rest}"
    if how == "release-zero":
        return f"{name}-{version.replace('0.21.0', '0.21.0.0', 1)}-{rest}"  # 0.21.0.0 == 0.21.0 (PEP 440)
    return f"{name}-{version.replace('0.21.0', '0.021.00', 1)}-{rest}"  # the same PEP 440 version


@pytest.mark.parametrize("how", ["case", "zero-padding", "release-zero"])
def test_two_files_for_one_project_version_and_tags_are_refused(wheels: Path, tmp_path: Path, how: str) -> None:
    folder = tmp_path / "two"
    folder.mkdir()
    (wheel,) = wheels.glob("*.whl")
    shutil.copyfile(wheel, folder / wheel.name)
    shutil.copyfile(wheel, folder / _variant(wheel, how))
    with pytest.raises(ValidationError, match=r"two wheels for vllm 0\.21\.0") as raised:
        build_index(folder, tmp_path / "out", SiteOptions())
    assert "one file per project, version and tags" in raised.value.message
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="/sys: Linux's sysfs, which no one may create files in")
def test_an_unwritable_out_is_a_usage_error(wheels: Path) -> None:
    done = run_g4build("index", "build", str(wheels), "--out", "/sys/g4build-site")
    assert done.returncode == 2, done.stderr
    assert "the site could not be written" in done.stderr and "unexpected" not in done.stderr


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="a read-only folder: POSIX, not root")
def test_a_read_only_parent_is_a_usage_error(wheels: Path, tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        done = run_g4build("index", "build", str(wheels), "--out", str(parent / "site"))
    finally:
        parent.chmod(0o755)
    assert done.returncode == 2 and "the site could not be written" in done.stderr, done.stderr


def test_a_series_claim_it_cannot_check_is_not_published(tmp_path: Path) -> None:
    def unknown_pin(manifest: dict[str, Any]) -> None:
        manifest["pin"]["name"] = "vllm-9.9.9"
        manifest["series"] = [{"name": "dflash", "version": 1}]

    tiny_vllm_wheel(tmp_path / "w", tmp_path / "pack", edit=unknown_pin)
    with pytest.raises(ValidationError, match=r"failed validation, so no index was written \(.*: series\)") as raised:
        build_index(tmp_path / "w", tmp_path / "out", SiteOptions())
    assert "names an unknown pin 'vllm-9.9.9'" in str(raised.value.hint)
    assert not (tmp_path / "out").exists()


def test_the_summary_lists_every_file_of_the_site(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    summary = json.loads((site / SUMMARY).read_text())
    assert sorted(summary["site_files"]) == sorted(p for p in _tree(site) if p != SUMMARY)


# Arabic-Indic and fullwidth digits (written escaped: they look like ASCII ones), a line break, no minor version
@pytest.mark.parametrize("cuda", ["\u0661\u0663.\u0660", "\uff11\uff13.\uff10", "13.\u0660", "13.0\n", "13"])
def test_a_cuda_version_not_of_ascii_digits_never_reaches_the_pages(tmp_path: Path, cuda: str) -> None:
    def claim(manifest: dict[str, Any]) -> None:
        manifest["target"]["cuda"] = cuda  # the wheel's name keeps cu130: only the manifest says otherwise

    tiny_vllm_wheel(tmp_path / "wheels", tmp_path / "work", edit=claim)
    with pytest.raises(ValidationError, match=r"expected MAJOR\.MINOR of ASCII digits") as raised:
        build_index(tmp_path / "wheels", tmp_path / "out", SiteOptions())
    assert "CUDA" in raised.value.message and not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels", "work"]  # no staging folder left
