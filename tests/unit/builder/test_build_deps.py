"""CMake FetchContent dependencies: parsing (text and the real pinned trees), prefetch from local git remotes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from g4build.builder.deps import CMakeDep, find_deps, initial_cache, parse_cmake, prefetch, prefetch_all
from g4build.errors import BuildError, SourceError

CMAKE = """
set(LIB_REVISION "v1.2.3" CACHE STRING "x")
if (DEFINED ENV{LIB_SRC_DIR})
  set(LIB_SRC_DIR $ENV{LIB_SRC_DIR})
endif()
if(LIB_SRC_DIR)
  FetchContent_Declare(lib SOURCE_DIR ${LIB_SRC_DIR})
else()
  FetchContent_Declare(
      lib
      GIT_REPOSITORY https://example.invalid/lib.git  # a comment (with parens)
      GIT_TAG ${LIB_REVISION}
      GIT_SUBMODULES "third/a" "third/b"
      GIT_PROGRESS TRUE
  )
endif()
"""


def test_parse_resolves_tags_env_overrides_and_submodules() -> None:
    (dep,) = parse_cmake(CMAKE, "x.cmake")
    assert dep == CMakeDep(name="lib", repository="https://example.invalid/lib.git", tag="v1.2.3",
                           submodules=("third/a", "third/b"), src_dir_var="LIB_SRC_DIR", declared_in="x.cmake")
    assert dep.fetchcontent_var == "FETCHCONTENT_SOURCE_DIR_LIB"


def test_unresolvable_tag_is_an_error() -> None:
    with pytest.raises(SourceError, match="cannot resolve"):
        parse_cmake("FetchContent_Declare(x GIT_REPOSITORY https://e.invalid/x GIT_TAG ${NOPE})", "y.cmake")


def test_initial_cache_names_both_variables(tmp_path: Path) -> None:
    (dep,) = parse_cmake(CMAKE, "x.cmake")
    text = initial_cache([(dep, tmp_path / "lib")])
    assert f'set(FETCHCONTENT_SOURCE_DIR_LIB "{(tmp_path / "lib").as_posix()}" CACHE PATH' in text
    assert 'set(LIB_SRC_DIR "' in text


# the shape of vLLM's vllm_flash_attn.cmake: the switch chooses the source, then changes how a folder is installed
DEV_MODE = CMAKE + """
if(LIB_SRC_DIR)
  install(CODE "file(CREATE_LINK \\"${lib_SOURCE_DIR}/py\\" \\"\\${CMAKE_INSTALL_PREFIX}/py\\" SYMBOLIC)")
else()
  install(DIRECTORY ${lib_SOURCE_DIR}/py/ DESTINATION py)
endif()
"""


def test_a_switch_tested_again_after_the_source_is_a_developer_mode_left_out_and_unset(tmp_path: Path) -> None:
    (plain,) = parse_cmake(CMAKE, "x.cmake")
    assert not plain.src_dir_dev_mode and plain.cache_vars == ("FETCHCONTENT_SOURCE_DIR_LIB", "LIB_SRC_DIR")
    assert plain.unset_vars == ()
    (dep,) = parse_cmake(DEV_MODE, "x.cmake")
    assert dep.src_dir_var == "LIB_SRC_DIR" and dep.src_dir_dev_mode
    assert dep.cache_vars == ("FETCHCONTENT_SOURCE_DIR_LIB",) and dep.unset_vars == ("LIB_SRC_DIR",)
    text = initial_cache([(dep, tmp_path / "lib")])
    assert f'set(FETCHCONTENT_SOURCE_DIR_LIB "{(tmp_path / "lib").as_posix()}" CACHE PATH' in text
    assert not any(line.startswith("set(LIB_SRC_DIR") for line in text.splitlines())
    assert "unset(LIB_SRC_DIR CACHE)" in text.splitlines()
    # conditions that only use the switch's value (a path check) are no second test of the switch
    (again,) = parse_cmake(CMAKE + "if(NOT IS_ABSOLUTE LIB_SRC_DIR)\nendif()\n# if(LIB_SRC_DIR) in a comment\n",
                           "x.cmake")
    assert not again.src_dir_dev_mode


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _repo(path: Path, files: dict[str, str], tag: str) -> Path:
    path.mkdir(parents=True)
    _git("init", "-q", cwd=path)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    _git("add", "-A", cwd=path)
    _git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "c", cwd=path)
    _git("tag", tag, cwd=path)
    (path / "later.txt").write_text("after the tag")
    _git("add", "-A", cwd=path)
    _git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "later", cwd=path)
    return path


def test_prefetch_clones_the_tag_once_and_reuses_it_offline(tmp_path: Path) -> None:
    remote = _repo(tmp_path / "remote", {"include/lib.h": "// v1.2.3\n"}, "v1.2.3")
    (dep,) = parse_cmake(CMAKE.replace("GIT_SUBMODULES \"third/a\" \"third/b\"", ""), "x.cmake")
    got = prefetch(dep, tmp_path / "cache", remote=str(remote))
    assert (got / "include" / "lib.h").read_text() == "// v1.2.3\n"
    assert not (got / "later.txt").exists()  # the tag, not the branch head
    calls: list[list[str]] = []
    again = prefetch(dep, tmp_path / "cache", remote="/nonexistent", git=lambda argv, cwd: calls.append(argv))
    assert again == got and calls == []  # served from the cache: no git, no network


def test_prefetch_failure_leaves_nothing_that_looks_finished(tmp_path: Path) -> None:
    (dep,) = parse_cmake(CMAKE, "x.cmake")
    with pytest.raises(BuildError, match="git fetch"):
        prefetch(dep, tmp_path / "cache", remote=str(tmp_path / "missing"))
    assert not (tmp_path / "cache" / dep.cache_name).exists()
    # nor a half clone beside it: the cache holds the dependency's lock file and nothing else
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_find_deps_needs_a_cmake_tree(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"no CMakeLists\.txt"):
        find_deps(tmp_path)


def test_prefetch_waits_for_another_builds_lock_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from filelock import FileLock

    from g4build.errors import LockTimeoutError
    from g4build.pins import index

    (dep,) = parse_cmake(CMAKE, "x.cmake")
    cache = tmp_path / "cache"
    cache.mkdir()
    calls: list[list[str]] = []
    monkeypatch.setattr(index, "LOCK_TIMEOUT_S", 0.05)
    other = FileLock(str(cache / dep.cache_name) + ".lock")  # another build is prefetching this dependency
    with other, pytest.raises(LockTimeoutError, match="still held by another g4build run"):
        prefetch(dep, cache, remote="/nonexistent", git=lambda argv, cwd: calls.append(argv))
    assert calls == []  # nothing touched the half-made copy of the other build


def test_prefetch_clones_with_long_paths_on(tmp_path: Path) -> None:
    from g4build.builder.deps import _git as real_git

    remote = _repo(tmp_path / "remote", {"include/lib.h": "// v1.2.3\n"}, "v1.2.3")
    (dep,) = parse_cmake(CMAKE, "x.cmake")
    calls: list[list[str]] = []

    def git(argv: list[str], cwd: Path | None) -> None:
        calls.append(argv)
        if argv[2:4] != ["submodule", "update"]:  # the test remote has none of the CMake file's submodules
            real_git(argv, cwd)

    got = prefetch(dep, tmp_path / "cache", remote=str(remote), git=git)
    assert (got / "include" / "lib.h").read_text() == "// v1.2.3\n"  # real git took the -c option
    assert [c[2] for c in calls] == ["init", "remote", "fetch", "checkout", "submodule"]
    assert all(c[:2] == ["-c", "core.longpaths=true"] for c in calls)


def test_prefetch_all_takes_every_dependency_of_the_tree_and_writes_the_initial_cache(tmp_path: Path) -> None:
    """The tree's dependencies from local repositories, in declaration order; the hook around each prefetch."""
    one = _repo(tmp_path / "one", {"a.h": "// one\n"}, "v1")
    two = _repo(tmp_path / "two", {"b.h": "// two\n"}, "v2")
    tree = tmp_path / "tree"
    (tree / "cmake" / "external_projects").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text(f"FetchContent_Declare(one GIT_REPOSITORY {one.as_posix()} GIT_TAG v1)\n")
    (tree / "cmake" / "external_projects" / "two.cmake").write_text(
        f"FetchContent_Declare(two GIT_REPOSITORY {two.as_posix()} GIT_TAG v2)\n")
    seen: list[str] = []

    @contextmanager
    def each(dep: CMakeDep) -> Iterator[None]:
        seen.append(f"enter {dep.name}")
        yield
        seen.append(f"leave {dep.name}")

    write = tmp_path / "out" / "deps.cmake"
    done = prefetch_all(tree, tmp_path / "cache", write=write, each=each)
    assert seen == ["enter one", "leave one", "enter two", "leave two"]
    assert [p.dep.name for p in done] == ["one", "two"]
    assert (done[0].path / "a.h").read_text() == "// one\n" and (done[1].path / "b.h").read_text() == "// two\n"
    assert write.read_text(encoding="utf-8") == initial_cache((p.dep, p.path) for p in done)
    assert done[1].to_dict() == {"name": "two", "repository": two.as_posix(), "tag": "v2", "path": str(done[1].path),
                                 "variables": ["FETCHCONTENT_SOURCE_DIR_TWO"], "unset": []}
    again = prefetch_all(tree, tmp_path / "cache")  # no hook, no file: the cached copies again
    assert [p.path for p in again] == [p.path for p in done]
