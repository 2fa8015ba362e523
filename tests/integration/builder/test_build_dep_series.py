"""Build series on real trees: the vllm-flash-attn series against the pinned upstream text (fixture), zero fuzz,
drift, the patched dependency copy (made once, reused, idempotent), `g4build deps` end to end with prefetch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from g4build.builder.depapply import (
    apply_for_pin,
    check_dependency,
    patched_dependency,
    read_patched_record,
    require_ok,
)
from g4build.builder.deps import find_deps, prefetch, prefetch_all
from g4build.errors import PatchConflictError, UsageError
from g4build.pins.model import Pin, load_pins
from g4build.series.deps import build_series_for, chosen_build_series, get_build_series, load_all_build
from g4build.series.status import series_commits

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "vllm_flash_attn_f5bc33c"
FA_COMMIT = "f5bc33cfc02c744d24a2e9d50e6db656de40611c"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def fa_repo(path: Path) -> Path:
    """A git repository holding the pinned upstream files, one commit (like a depth-1 prefetched clone)."""
    shutil.copytree(FIXTURE, path)
    _git("init", "-q", cwd=path)
    _git("add", "-A", cwd=path)
    _git("commit", "-qm", "vllm-flash-attn f5bc33c (test material)", cwd=path)
    return path


def project_for(root: Path, fa_commit: str) -> Path:
    """A g4build project (patches/ copied) whose vllm-flash-attn series names ``fa_commit``: a test repository
    cannot have upstream's commit id, everything else (patch, recorded sha256) is the real series."""
    shutil.copytree(REPO / "patches", root / "patches")
    meta = root / "patches" / "deps" / "vllm-flash-attn" / "series.yaml"
    meta.write_text(meta.read_text(encoding="utf-8").replace(FA_COMMIT, fa_commit), encoding="utf-8")
    return root


@pytest.fixture
def pin21() -> Pin:
    return load_pins().get("vllm-0.21.0")


def test_the_fixture_is_the_text_the_series_records(pin21: Pin) -> None:
    series = get_build_series("vllm-flash-attn")
    variant = series.variant(pin21.name)
    assert variant is not None and variant.commit == FA_COMMIT
    assert hashlib.sha256((FIXTURE / "CMakeLists.txt").read_bytes()).hexdigest() == variant.files["CMakeLists.txt"]
    assert [b.name for b in build_series_for(pin21)] == ["vllm-flash-attn", "vllm-kernel-archs"]


def test_026s_commit_has_the_same_cmakelists_so_the_fixture_serves_its_variant_too() -> None:
    variant = get_build_series("vllm-flash-attn").variant("vllm-0.26.0")
    assert variant is not None and variant.commit == "caaa4eb59845388a20b1f435ecaafb4bd9517ad8"
    assert hashlib.sha256((FIXTURE / "CMakeLists.txt").read_bytes()).hexdigest() == variant.files["CMakeLists.txt"]
    tree = Path(tempfile.mkdtemp(prefix="fa026-"))
    try:
        shutil.copy2(FIXTURE / "CMakeLists.txt", tree / "CMakeLists.txt")
        switch = Path("csrc/flash_attn/src/static_switch.h")  # the same text at caaa4eb (series.yaml's sha256)
        assert variant.files[switch.as_posix()] == hashlib.sha256((FIXTURE / switch).read_bytes()).hexdigest()
        (tree / switch).parent.mkdir(parents=True)
        shutil.copy2(FIXTURE / switch, tree / switch)
        for patch in get_build_series("vllm-flash-attn").series.patches_for("vllm-0.26.0"):  # in order
            done = subprocess.run(["git", "apply", "-C3", str(patch.path)], cwd=tree, capture_output=True,
                                  text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)})
            assert done.returncode == 0, done.stderr  # zero fuzz on that CMakeLists
    finally:
        shutil.rmtree(tree)


@pytest.mark.network
@pytest.mark.parametrize("pin_name", ["vllm-0.21.0", "vllm-0.26.0"])
def test_the_series_commit_is_what_the_pins_cmake_declares(pin_name: str) -> None:
    from tests.support.trees import sdist_tree

    deps = {d.name: d for d in find_deps(sdist_tree(pin_name))}
    variant = get_build_series("vllm-flash-attn").variant(pin_name)
    assert variant is not None and deps["vllm-flash-attn"].tag == variant.commit


def test_the_patch_applies_with_zero_fuzz_to_the_pinned_text(tmp_path: Path, pin21: Pin) -> None:
    tree = fa_repo(tmp_path / "fa")
    check = check_dependency(tree, get_build_series("vllm-flash-attn"), pin21)
    (series,) = check.report.series
    assert series.status == "needed"
    assert [(p.status, p.offsets) for p in series.patches] == [("applies", ())] * 3
    assert check.changed == ()
    # a test repository cannot carry upstream's commit id: reported, and a build refuses it
    assert check.commit_state == "differs" and not check.ok
    with pytest.raises(PatchConflictError, match=f"written for vllm-flash-attn {FA_COMMIT}"):
        require_ok(check)


def test_a_changed_file_is_drift_even_where_the_patch_still_applies(tmp_path: Path, pin21: Pin) -> None:
    tree = fa_repo(tmp_path / "fa")
    cmake = tree / "CMakeLists.txt"
    cmake.write_text("# local edit\n" + cmake.read_text(encoding="utf-8"), encoding="utf-8")
    _git("commit", "-qam", "edit", cwd=tree)
    shutil.rmtree(tree / ".git")  # not a git tree: the files themselves are compared
    check = check_dependency(tree, get_build_series("vllm-flash-attn"), pin21)
    assert check.commit_state == "not-git"
    assert [c.split(":")[0] for c in check.changed] == ["CMakeLists.txt"]
    assert check.report.series[0].patches[0].offsets  # applies, one line further down
    with pytest.raises(PatchConflictError, match="files changed since the series was written") as err:
        require_ok(check)
    assert err.value.exit_code == 8


def test_a_change_in_the_patched_lines_is_a_conflict_with_hunk_and_line(tmp_path: Path, pin21: Pin) -> None:
    tree = fa_repo(tmp_path / "fa")
    cmake = tree / "CMakeLists.txt"
    cmake.write_text(cmake.read_text(encoding="utf-8").replace('"8.0+PTX" "${CUDA_ARCHS}"', '"8.0" "${CUDA_ARCHS}"'),
                     encoding="utf-8")
    check = check_dependency(tree, get_build_series("vllm-flash-attn"), pin21)
    patch = check.report.series[0].patches[0]  # 0001's second hunk; 0002 follows it
    assert patch.status == "conflict"
    assert [(p.file, p.hunk) for p in patch.problems] == [("CMakeLists.txt", 2)]


def test_patched_copy_is_made_once_reused_and_carries_the_series(tmp_path: Path, pin21: Pin,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pristine = fa_repo(tmp_path / "cache" / f"vllm-flash-attn-{FA_COMMIT}")
    (pristine / ".g4build-prefetched").write_text("test\n")
    root = project_for(tmp_path / "project", _git("rev-parse", "HEAD", cwd=pristine))
    monkeypatch.setenv("G4BUILD_HOME", str(root))
    build = [b for b in load_all_build() if b.project == "vllm-flash-attn"]
    copy = patched_dependency(pristine, build, pin21)
    assert copy.parent == pristine.parent and copy.name.startswith(pristine.name + ".g4-")
    text = (copy / "CMakeLists.txt").read_text(encoding="utf-8")
    assert all(fp in text for fp in build[0].series.pins[pin21.name].fingerprints["CMakeLists.txt"])
    assert (pristine / "CMakeLists.txt").read_bytes() == (FIXTURE / "CMakeLists.txt").read_bytes()  # untouched
    commit, *later = series_commits(copy)  # one commit per patch
    assert len(later) == 2 and all((c.series, c.version) == (commit.series, commit.version) for c in later)
    switch = "csrc/flash_attn/src/static_switch.h"
    marks = build[0].series.pins[pin21.name].fingerprints[switch]
    assert marks and all(fp in (copy / switch).read_text(encoding="utf-8") for fp in marks)
    version = get_build_series("vllm-flash-attn").version
    assert (commit.series, commit.version, commit.pin) == ("vllm-flash-attn", version, pin21.name)
    record = read_patched_record(copy)
    assert record is not None and record["series"][0]["patches"][0]["sha256"] == hashlib.sha256(
        build[0].series.patches_for(pin21.name)[0].read_bytes()).hexdigest()
    stamp_time = (copy / ".g4build-patched").stat().st_mtime_ns
    assert patched_dependency(pristine, build, pin21) == copy  # reused, not made again
    assert (copy / ".g4build-patched").stat().st_mtime_ns == stamp_time
    # the copy carries the series: a check says so, applying again changes nothing
    again = check_dependency(copy, build[0], pin21)
    assert again.applied and again.ok


def test_a_prefetched_copy_carried_as_files_is_checked_and_patched(tmp_path: Path, pin21: Pin) -> None:
    """An offline machine gets the dependency as an archive of files (no .git, a submodule's .git file left)."""
    pristine = tmp_path / "cache" / f"vllm-flash-attn-{FA_COMMIT}"
    shutil.copytree(FIXTURE, pristine)
    (pristine / "csrc" / "cutlass").mkdir(parents=True)
    (pristine / "csrc" / "cutlass" / ".git").write_text("gitdir: ../../.git/modules/csrc/cutlass\n")
    (pristine / ".g4build-prefetched").write_text("carried\n")
    build = [get_build_series("vllm-flash-attn")]
    copy = patched_dependency(pristine, build, pin21)
    assert "add_custom_target(_vllm_fa3_C)" in (copy / "CMakeLists.txt").read_text(encoding="utf-8")
    assert [c.series for c in series_commits(copy)] == ["vllm-flash-attn"] * 3  # one commit per patch
    assert not (pristine / ".git").exists()  # the carried copy itself stays as it was
    # a carried copy whose files are not the recorded ones is refused, and nothing is left behind
    other = tmp_path / "cache2" / f"vllm-flash-attn-{FA_COMMIT}"
    shutil.copytree(pristine, other)
    (other / "CMakeLists.txt").write_text("# another commit\n" + (FIXTURE / "CMakeLists.txt").read_text())
    with pytest.raises(PatchConflictError, match="files changed since the series was written"):
        patched_dependency(other, build, pin21)
    assert sorted(p.name for p in other.parent.iterdir() if not p.name.endswith(".lock")) == [other.name]


def _vllm_tree(path: Path, remote: Path, tag: str) -> Path:
    """The two CMake files of a vLLM tree that declare vllm-flash-attn, at a local remote, in the shape of vLLM's
    (VLLM_FLASH_ATTN_SRC_DIR chooses the source, then symlinks FA4's cute folder: a developer mode)."""
    (path / "cmake" / "external_projects").mkdir(parents=True)
    (path / "CMakeLists.txt").write_text("project(v)\n")
    (path / "cmake" / "external_projects" / "vllm_flash_attn.cmake").write_text(
        "if (DEFINED ENV{VLLM_FLASH_ATTN_SRC_DIR})\n  set(VLLM_FLASH_ATTN_SRC_DIR $ENV{VLLM_FLASH_ATTN_SRC_DIR})\n"
        "endif()\nif(VLLM_FLASH_ATTN_SRC_DIR)\n  FetchContent_Declare(vllm-flash-attn SOURCE_DIR "
        "${VLLM_FLASH_ATTN_SRC_DIR})\nelse()\n  FetchContent_Declare(\n  vllm-flash-attn\n"
        f"  GIT_REPOSITORY {remote.as_posix()}\n  GIT_TAG {tag}\n  GIT_PROGRESS TRUE\n)\nendif()\n"
        "if(VLLM_FLASH_ATTN_SRC_DIR)\n  install(CODE \"file(CREATE_LINK a b SYMBOLIC)\")\nendif()\n")
    return path


def test_deps_apply_points_the_initial_cache_at_the_patched_copy(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.builder.conftest import run_cli

    remote = fa_repo(tmp_path / "remote")
    head = _git("rev-parse", "HEAD", cwd=remote)
    root = project_for(tmp_path / "project", head)
    tree = _vllm_tree(tmp_path / "src", remote, head)
    cache, init = tmp_path / "deps", tmp_path / "prefetched-deps.cmake"
    code, _, err = run_cli(["--root", str(root), "prefetch", "--tree", str(tree), "--cache", str(cache),
                            "--write", str(init)], capsys)
    assert code == 0, err
    pristine = prefetch(find_deps(tree)[0], cache)
    argv = ["--root", str(root), "deps", "apply", "--pin", "vllm-0.21.0", "--tree", str(tree), "--series",
            "vllm-flash-attn", "--cache", str(cache), "--write", str(init), "--json"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    (row,) = json.loads(out)["applied"]
    copy = Path(row["path"])
    version = get_build_series("vllm-flash-attn").version
    assert (row["name"], row["version"], row["commit"]) == ("vllm-flash-attn", version, head)
    assert copy != pristine and "add_custom_target(_vllm_fa3_C)" in (copy / "CMakeLists.txt").read_text()
    text = init.read_text(encoding="utf-8")
    assert f'set(FETCHCONTENT_SOURCE_DIR_VLLM-FLASH-ATTN "{copy.as_posix()}"' in text
    # vLLM's own switch is a developer mode (FA4's cute folder symlinked): never set, and unset from the cache
    assert "set(VLLM_FLASH_ATTN_SRC_DIR" not in text.replace("unset(", "")
    assert text.splitlines().count("unset(VLLM_FLASH_ATTN_SRC_DIR CACHE)") == 1
    assert f'"{pristine.as_posix()}"' not in text
    # a second run (a resumed build) finds the copy and writes the same file
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and json.loads(out)["applied"][0]["path"] == str(copy)
    assert init.read_text(encoding="utf-8") == text
    # a file an older g4build wrote (the switch set to the pristine clone) ends the same as a fresh one
    stale = text.replace("unset(VLLM_FLASH_ATTN_SRC_DIR CACHE)\n",
                         f'set(VLLM_FLASH_ATTN_SRC_DIR "{pristine.as_posix()}" CACHE PATH "g4build prefetch")\n')
    init.write_text(stale, encoding="utf-8")
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert init.read_text(encoding="utf-8") == text


def test_deps_apply_refuses_a_dependency_commit_the_series_is_not_written_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.builder.conftest import run_cli

    remote = fa_repo(tmp_path / "remote")
    root = project_for(tmp_path / "project", "a" * 40)
    tree = _vllm_tree(tmp_path / "src", remote, _git("rev-parse", "HEAD", cwd=remote))
    init = tmp_path / "init.cmake"
    init.write_text("untouched\n")
    code, _, err = run_cli(["--root", str(root), "deps", "apply", "--pin", "vllm-0.21.0", "--tree", str(tree),
                            "--series", "vllm-flash-attn", "--cache", str(tmp_path / "deps"), "--write", str(init)],
                           capsys)
    assert code == 2, err
    assert "is written for vllm-flash-attn aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" in err
    assert init.read_text() == "untouched\n" and not (tmp_path / "deps").exists()


def test_apply_for_pin_patches_a_copy_and_says_each_step(tmp_path: Path, pin21: Pin) -> None:
    """The stage function itself: the status hook around the prefetch and the patching, the initial cache pointed
    at the copy; a dependency the tree does not declare is refused before anything is fetched."""
    remote = fa_repo(tmp_path / "remote")
    head = _git("rev-parse", "HEAD", cwd=remote)
    (build,) = [b for b in load_all_build(project_for(tmp_path / "project", head) / "patches")
                if b.name == "vllm-flash-attn"]
    tree = _vllm_tree(tmp_path / "src", remote, head)
    init = tmp_path / "init.cmake"
    prefetch_all(tree, tmp_path / "deps", write=init)
    said: list[str] = []

    class Step:
        def __init__(self, text: str) -> None:
            said.append(text)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            said.append("done")

    (row,) = apply_for_pin(tree, [build], pin21, cache=tmp_path / "deps", write=init, status=Step)
    assert said == [f"prefetch vllm-flash-attn @ {head}", "done",
                    f"patch vllm-flash-attn: vllm-flash-attn v{build.version}", "done"]
    copy = Path(row["path"])
    assert (row["name"], row["commit"]) == ("vllm-flash-attn", head) and copy.parent == tmp_path / "deps"
    assert f'set(FETCHCONTENT_SOURCE_DIR_VLLM-FLASH-ATTN "{copy.as_posix()}"' in init.read_text(encoding="utf-8")
    (tree / "cmake" / "external_projects" / "vllm_flash_attn.cmake").unlink()
    with pytest.raises(UsageError, match=r"which .* CMake does not declare"):
        apply_for_pin(tree, [build], pin21, cache=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_chosen_build_series_refuses_one_without_patches_for_the_pin(pin21: Pin) -> None:
    assert [b.name for b in chosen_build_series(pin21)] == [b.name for b in build_series_for(pin21)]
    assert [b.name for b in chosen_build_series(pin21, ["vllm-flash-attn"])] == ["vllm-flash-attn"]
    other = load_pins().get("vllm-0.33.0")  # the series has variants for 0.21.0 and 0.26.0 only
    with pytest.raises(UsageError, match=r"build series vllm-flash-attn has no patches for pin vllm-0\.33\.0"):
        chosen_build_series(other, ["vllm-flash-attn"])


def test_deps_check_cli_reports_drift_with_exit_8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.builder.conftest import run_cli

    tree = fa_repo(tmp_path / "fa")
    code, out, _ = run_cli(["deps", "check", "--tree", str(tree), "--series", "vllm-flash-attn", "--pin",
                            "vllm-0.21.0", "--json"], capsys)
    data = json.loads(out)
    assert code == 8
    assert data["commit"]["state"] == "differs" and data["patches"][0]["status"] == "applies"
