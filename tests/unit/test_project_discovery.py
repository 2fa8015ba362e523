"""Project discovery trusts a found project only as git trusts a repository (safe.directory): a `patches/` (pins,
series, recipes) planted in a parent folder of the working directory that someone else owns, or that its group or
others may write, is passed over with a note, and the checkout's own data is read instead; a project named with
--root / G4BUILD_HOME is used as named. The planted projects are real folders here, their owners and modes set
with os.chown / chmod (the suite may run as root, which can give a file to any uid)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from g4build.cli import main
from g4build.data import group_is_private, project_choice, project_root, set_root_option

REPO = Path(__file__).resolve().parents[2]
OTHER_UID = 54321
PLANTED = "planted-recipe"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("G4BUILD_HOME", raising=False)
    set_root_option(None)


def _plant(top: Path) -> tuple[Path, Path]:
    """A project at ``top`` (markers, and a recipe of its own) and a working directory two folders below it."""
    (top / "patches").mkdir(parents=True)
    for name in ("pins.yaml", "series.yaml"):
        shutil.copy(REPO / "patches" / name, top / "patches" / name)
    (top / "recipes").mkdir()
    text = (REPO / "recipes" / "gemma4-26b-a4b-nvfp4-baseline.yaml").read_text(encoding="utf-8")
    (top / "recipes" / f"{PLANTED}.yaml").write_text(
        text.replace("name: gemma4-26b-a4b-nvfp4-baseline", f"name: {PLANTED}"), encoding="utf-8")
    work = top / "a" / "b"
    work.mkdir(parents=True)
    for folder in (top, top / "a", work, top / "patches", top / "recipes"):
        folder.chmod(0o755)
    return top, work


def _listed(capsys: pytest.CaptureFixture[str], *options: str) -> tuple[list[str], str]:
    try:
        main([*options, "recipe", "list", "--json"])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr()
    captured = capsys.readouterr()
    return [row["name"] for row in json.loads(captured.out)], captured.err


def _give_away(path: Path) -> None:
    os.chown(path, OTHER_UID, -1)


needs_owners = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                  reason="giving a folder to another uid needs root")
pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes (Windows: see below)")


def test_a_project_of_your_own_above_the_working_directory_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top, work = _plant(tmp_path / "mine")
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED in names and "not using" not in err
    assert project_choice() == (top, "the project the working directory is in (owned by you, writable by no one "
                                     "else)")


@needs_owners
@pytest.mark.parametrize("whose", ["project folder", "parent walked", "patches folder", "a recipe"])
def test_a_project_owned_by_someone_else_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], whose: str) -> None:
    top, work = _plant(tmp_path / "shared")
    _give_away({"project folder": top, "parent walked": top / "a", "patches folder": top / "patches",
                "a recipe": top / "recipes" / f"{PLANTED}.yaml"}[whose])
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED not in names and "gemma4-26b-a4b-nvfp4-baseline" in names  # the checkout's recipes instead
    assert f"not using the g4build project at {top}" in err and f"uid {OTHER_UID}" in err and "--root" in err
    assert project_root() == REPO


@pytest.mark.parametrize(("where", "mode"), [("", 0o757), ("a", 0o777), ("patches/pins.yaml", 0o666),
                                             ("recipes", 0o1777)])
def test_a_project_others_may_write_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str,
        mode: int) -> None:
    top, work = _plant(tmp_path / "shared")
    (top / where).chmod(mode)
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED not in names and "writable by others" in err, err
    assert project_root() == REPO


@needs_owners
@pytest.mark.parametrize("where", ["", "a", "patches", "recipes/" + PLANTED + ".yaml"])
def test_a_project_a_shared_group_may_write_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str) -> None:
    top, work = _plant(tmp_path / "shared")
    os.chown(top / where, -1, OTHER_UID)  # a group with no entry: not the user's own
    (top / where).chmod(0o775 if (top / where).is_dir() else 0o664)
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED not in names and f"writable by its group (gid {OTHER_UID})" in err, err


@needs_owners
def test_group_write_for_the_users_own_group_is_fine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A umask of 002 (user private groups) leaves a user's own files group-writable by a group of one."""
    import grp
    import pwd

    own = grp.getgrnam(pwd.getpwuid(os.geteuid()).pw_name)
    if set(own.gr_mem) - {own.gr_name}:
        pytest.skip("the user's group has other members here")
    top, work = _plant(tmp_path / "mine")
    for path in (top, top / "a", work, top / "patches", top / "patches" / "pins.yaml"):
        os.chown(path, -1, own.gr_gid)
        path.chmod(0o775 if path.is_dir() else 0o664)
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED in names and "not using" not in err, err


def test_a_link_in_recipes_to_a_file_others_may_write_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top, work = _plant(tmp_path / "shared")
    outside = tmp_path / "drop"
    outside.mkdir()
    shutil.move(top / "recipes" / f"{PLANTED}.yaml", outside / f"{PLANTED}.yaml")
    (outside / f"{PLANTED}.yaml").chmod(0o666)
    (top / "recipes" / f"{PLANTED}.yaml").symlink_to(outside / f"{PLANTED}.yaml")
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED not in names and "links to" in err


@needs_owners
def test_a_named_project_is_used_whoever_owns_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top, work = _plant(tmp_path / "shared")
    _give_away(top)
    monkeypatch.chdir(work)
    names, err = _listed(capsys, "--project", str(top))
    assert PLANTED in names and "not using" not in err
    monkeypatch.setenv("G4BUILD_HOME", str(top))
    names, _ = _listed(capsys)
    assert PLANTED in names
    assert project_choice() == (top, "named by G4BUILD_HOME")


def test_without_posix_owners_a_found_project_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Windows has no uid to compare (the one thing simulated here): a found project is never trusted there."""
    _top, work = _plant(tmp_path / "mine")
    monkeypatch.chdir(work)
    monkeypatch.delattr(os, "geteuid")
    names, err = _listed(capsys)
    assert PLANTED not in names and "no POSIX file owners" in err and project_root() == REPO


def test_the_checkout_is_found_from_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO / "toolkit")
    root, why = project_choice()
    assert root == REPO and "checkout" in why


def test_doctor_says_which_project_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    top, work = _plant(tmp_path / "mine")
    monkeypatch.chdir(work)
    with contextlib.suppress(SystemExit):  # doctor fails on a machine without a GPU; its JSON comes first
        main(["doctor", "--json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert findings[0]["check"] == "project" and findings[0]["detail"]["root"] == str(top)


# --- linked folders are entered; the working directory is a candidate; a private group has no other member ------


def _link_in(top: Path, outside: Path, rel: str) -> Path:
    """Move ``top/rel`` to ``outside`` and leave a link to it in its place: the project reads it through the link."""
    target = outside / Path(rel).name
    outside.mkdir(parents=True, exist_ok=True)
    shutil.move(top / rel, target)
    (top / rel).symlink_to(target, target_is_directory=True)
    return target


@pytest.mark.parametrize(("rel", "inner"), [("recipes/vllm-args", "launch-env.yaml"),
                                            ("recipes/vllm-args", "deep/er/x.json"),
                                            ("patches/vllm-0.21.0", "0001-x.patch"),
                                            ("recipes", f"{PLANTED}.yaml")])
def test_a_file_others_may_write_inside_a_linked_folder_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rel: str,
        inner: str) -> None:
    """A world-writable launch-env.yaml in a linked recipes/vllm-args could allow LD_PRELOAD: the linked folder is
    read as the project's own, so it is checked as the project's own, to the last file under it."""
    top, work = _plant(tmp_path / "mine")
    (top / rel).mkdir(parents=True, exist_ok=True)
    (top / rel).chmod(0o755)
    target = _link_in(top, tmp_path / "elsewhere", rel)
    (target / inner).parent.mkdir(parents=True, exist_ok=True)
    if not (target / inner).exists():
        (target / inner).write_text("allow: {names: [LD_PRELOAD]}\n", encoding="utf-8")
    for folder in (target / inner).parents:
        if folder == target.parent:
            break
        folder.chmod(0o755)
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED in names and "not using" not in err, err  # the link alone is fine while its files are yours
    set_root_option(None)
    (target / inner).chmod(0o666)
    names, err = _listed(capsys)
    assert PLANTED not in names and f"{top / rel / inner} is writable by others" in err, err
    assert project_root() == REPO


def test_doctor_says_which_project_was_passed_over_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top, work = _plant(tmp_path / "mine")
    (top / "recipes" / "vllm-args").mkdir()
    target = _link_in(top, tmp_path / "elsewhere", "recipes/vllm-args")
    (target / "launch-env.yaml").write_text("allow: {names: [LD_PRELOAD]}\n", encoding="utf-8")
    (target / "launch-env.yaml").chmod(0o666)
    monkeypatch.chdir(work)
    with contextlib.suppress(SystemExit):  # doctor fails on a machine without a GPU; its JSON comes first
        main(["doctor", "--json"])
    first = json.loads(capsys.readouterr().out)["findings"][0]
    assert first["check"] == "project" and first["status"] == "warn", first
    assert first["detail"]["root"] == str(REPO) and first["detail"]["passed_over"] == str(top), first
    assert "launch-env.yaml is writable by others" in first["detail"]["problem"], first
    assert "writable by no one else" not in first["summary"], first


def test_a_link_loop_under_recipes_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    top, work = _plant(tmp_path / "mine")
    (top / "recipes" / "loop").symlink_to(top / "recipes", target_is_directory=True)
    monkeypatch.chdir(work)
    names, err = _listed(capsys)
    assert PLANTED in names and "not using" not in err, err


def test_the_working_directory_itself_is_a_candidate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    top, _work = _plant(tmp_path / "mine")
    monkeypatch.chdir(top)
    names, err = _listed(capsys)
    assert PLANTED in names and "not using" not in err, err
    assert project_choice()[0] == top


@pytest.mark.parametrize(("user", "group", "members", "private"), [
    ("ada", "ada", set(), True),
    ("ada", "ada", {"ada"}, True),
    ("ada", "ada", {"ada", "bob"}, False),  # named like the user, but bob is in it (listed or by primary group)
    ("ada", "ada", {"bob"}, False),
    ("ada", "staff", {"ada"}, False),
])
def test_a_group_is_private_only_when_the_user_alone_is_in_it(user: str, group: str, members: set[str],
                                                              private: bool) -> None:
    assert group_is_private(user, group, members) is private



def test_a_commands_project_does_not_outlast_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--project` names the project for that one command: a later reader in the same process (the unit tests
    that read the shipped recipes ran against another test's broken copy when it stayed set) is back on its own."""
    before = project_root()
    top, _ = _plant(tmp_path / "p")
    names, _ = _listed(capsys, "--project", str(top))
    assert PLANTED in names
    assert project_root() == before != top.resolve()
