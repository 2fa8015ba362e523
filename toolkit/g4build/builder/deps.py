"""CMake FetchContent dependencies of a vLLM tree: read them, prefetch them into a cache, point CMake at them.

vLLM's CMakeLists.txt and ``cmake/external_projects/*.cmake`` declare what they download at configure time
(CUTLASS, vllm-flash-attn, FlashMLA, qutlass, DeepGEMM, triton_kernels). Reading the pin's own files (not a
list kept here) keeps g4build right when upstream moves a tag. The prefetched copies are named in a CMake
initial-cache file (``cmake -C``): ``FETCHCONTENT_SOURCE_DIR_<NAME>`` for every dependency plus the
project's own ``*_SRC_DIR`` override where one exists, so a second build needs no network.

An override the pin's CMake tests again after choosing the source is a developer mode, not just a source
location, and is left out (and unset, as a build folder configured before keeps it in its CMakeCache.txt):
FetchContent's own variable already takes every declared dependency from the prefetched copy. vLLM's
``VLLM_FLASH_ATTN_SRC_DIR`` is one: with it set, ``vllm_flash_attn.cmake`` installs FlashAttention 4's
``flash_attn/cute`` folder as a symlink into the source instead of a copy with ``flash_attn.cute`` imports
rewritten to ``vllm.vllm_flash_attn.cute``; setuptools stores the files behind the link in the wheel as they
are, so the wheel imports a ``flash_attn`` package it does not carry.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import BuildError, SourceError
from g4build.fsutil import remove_tree, write_atomic
from g4build.pins.index import cache_lock, cache_root
from g4build.util import gitsafe

_DECLARE = re.compile(r"FetchContent_Declare\s*\((?P<body>[^()]*(?:\([^()]*\)[^()]*)*)\)", re.IGNORECASE)
_SET = re.compile(r"^\s*set\s*\(\s*(?P<name>\w+)\s+\"?(?P<value>[^\s\")]+)\"?", re.IGNORECASE | re.MULTILINE)
_ENV_SRC = re.compile(r"DEFINED\s+ENV\{(?P<var>\w+_SRC_DIR)\}")
_IF_VAR = r"\b(?:else)?if\s*\(\s*(?:NOT\s+)?{var}\b"  # if(VAR), elseif(NOT VAR ...): a condition on the switch
_COMMENT = re.compile(r"#[^\n]*")
_KEYWORDS = {"GIT_REPOSITORY", "GIT_TAG", "GIT_SHALLOW", "GIT_PROGRESS", "GIT_SUBMODULES", "SOURCE_DIR",
             "BINARY_DIR", "SOURCE_SUBDIR", "CONFIGURE_COMMAND", "BUILD_COMMAND", "URL", "URL_HASH"}


@dataclass(frozen=True, kw_only=True)
class CMakeDep:
    name: str  # FetchContent name, e.g. "vllm-flash-attn"
    repository: str
    tag: str
    submodules: tuple[str, ...]  # GIT_SUBMODULES (empty: all of them)
    src_dir_var: str | None  # the project's own override, e.g. VLLM_FLASH_ATTN_SRC_DIR
    declared_in: str  # relative path of the .cmake file
    # the pin's CMake tests src_dir_var again after choosing the source: the switch changes more than where the
    # source comes from (vllm-flash-attn: FA4's cute folder symlinked, its imports not rewritten)
    src_dir_dev_mode: bool = False

    @property
    def fetchcontent_var(self) -> str:
        """FetchContent reads ``FETCHCONTENT_SOURCE_DIR_`` + the name upper-cased, nothing else changed
        (``vllm-flash-attn`` -> ``..._VLLM-FLASH-ATTN``)."""
        return "FETCHCONTENT_SOURCE_DIR_" + self.name.upper()

    @property
    def cache_vars(self) -> tuple[str, ...]:
        """What an initial cache sets to the prefetched source: FetchContent's own variable (FetchContent_MakeAvailable
        and FetchContent_Populate(name) take the declared dependency from it, no download), and the project's
        override unless it is a developer mode."""
        switch = (self.src_dir_var,) if self.src_dir_var and not self.src_dir_dev_mode else ()
        return (self.fetchcontent_var, *switch)

    @property
    def unset_vars(self) -> tuple[str, ...]:
        """The developer-mode override, removed from the cache (an earlier configure may have stored it)."""
        return (self.src_dir_var,) if self.src_dir_var and self.src_dir_dev_mode else ()

    @property
    def cache_name(self) -> str:
        return f"{self.name}-{re.sub(r'[^A-Za-z0-9._-]', '_', self.tag)}"


def _args(body: str) -> list[str]:
    return re.findall(r'"[^"]*"|[^\s"]+', _COMMENT.sub("", body))


def _resolve(value: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: variables.get(m[1], m[0]), value.strip('"'))


def parse_cmake(text: str, where: str) -> list[CMakeDep]:
    """The git dependencies one CMake file declares (declarations from a local SOURCE_DIR are skipped)."""
    clean = _COMMENT.sub("", text)
    variables = {m["name"]: m["value"] for m in _SET.finditer(clean)}
    deps: list[CMakeDep] = []
    for m in _DECLARE.finditer(clean):
        args = _args(m["body"])
        if not args or "GIT_REPOSITORY" not in args:
            continue
        name = args[0]
        fields: dict[str, list[str]] = {}
        key = ""
        for a in args[1:]:
            if a in _KEYWORDS:
                key = a
                fields[key] = []
            elif key:
                fields[key].append(a)
        repo = _resolve(fields.get("GIT_REPOSITORY", [""])[0], variables)
        tag = _resolve((fields.get("GIT_TAG") or [""])[0], variables)
        if not repo or not tag or "${" in repo + tag:
            raise SourceError(f"{where}: FetchContent_Declare({name}) has a repository or tag g4build cannot "
                              f"resolve ({repo!r} @ {tag!r})", hint="report it: the pin's CMake changed shape")
        before = clean[: m.start()]
        env_vars = _ENV_SRC.findall(before)
        var = env_vars[-1] if env_vars else None
        tests = len(re.findall(_IF_VAR.format(var=re.escape(var)), clean, re.IGNORECASE)) if var else 0
        deps.append(CMakeDep(
            name=name, repository=repo, tag=tag,
            submodules=tuple(s.strip('"') for s in fields.get("GIT_SUBMODULES", [])),
            src_dir_var=var, declared_in=where, src_dir_dev_mode=tests > 1,
        ))
    return deps


def find_deps(tree: Path) -> list[CMakeDep]:
    """Every git FetchContent dependency of a vLLM source tree, CMakeLists.txt first."""
    files = [tree / "CMakeLists.txt", *sorted((tree / "cmake" / "external_projects").glob("*.cmake"))]
    if not files[0].is_file():
        raise SourceError(f"{tree} has no CMakeLists.txt: expected a vLLM source tree")
    deps: list[CMakeDep] = []
    for f in files:
        if f.is_file():
            deps += parse_cmake(f.read_text(encoding="utf-8"), f.relative_to(tree).as_posix())
    return deps


def initial_cache(entries: Iterable[tuple[CMakeDep, Path]]) -> str:
    """A ``cmake -C`` file naming each prefetched source (and unsetting each developer-mode override)."""
    lines = ["# written by g4build prefetch: FetchContent sources already on disk"]
    for dep, path in entries:
        p = path.as_posix()
        lines += [f'set({name} "{p}" CACHE PATH "g4build prefetch")' for name in dep.cache_vars]
        lines += [unset_line(name) for name in dep.unset_vars]
    return "\n".join(lines) + "\n"


def unset_line(name: str) -> str:
    return f"unset({name} CACHE)"


Runner = Callable[[list[str], Path | None], None]
# CUTLASS and FlashInfer checkouts hold paths past Windows' 260 characters: every git call (and, through git's
# GIT_CONFIG_PARAMETERS, the submodule clones it starts) runs with long paths on, whatever the user's config
LONG_PATHS = ("-c", "core.longpaths=true")


def _git(argv: list[str], cwd: Path | None) -> None:
    # the clones' own configs are fresh; no hook or fsmonitor runs (the -c options reach the submodule clones too),
    # while the user's config stays: proxies and url.*.insteadOf mirrors are how the remote is reached
    try:
        proc = subprocess.run(["git", *gitsafe.config_args(network=True), *argv], cwd=cwd, capture_output=True,
                              text=True, check=False, env=gitsafe.env(network=True),
                              timeout=gitsafe.left(gitsafe.network_deadline()))
    except subprocess.TimeoutExpired:
        raise BuildError(f"git {' '.join(argv[len(LONG_PATHS):][:2])} did not finish within G4BUILD_GIT_DEADLINE",
                         hint="the remote or the network is too slow or stalls: try again, use a mirror, or raise "
                              "G4BUILD_GIT_DEADLINE (seconds)") from None
    if proc.returncode:
        shown = argv[len(LONG_PATHS):] if tuple(argv[:len(LONG_PATHS)]) == LONG_PATHS else argv
        raise BuildError(f"git {' '.join(shown)} failed: {proc.stderr.strip()[-500:]}",
                         hint="check the network (or mirror) for the dependency's repository")


def prefetch(dep: CMakeDep, cache: Path, *, remote: str | None = None, git: Runner = _git) -> Path:
    """Clone ``dep`` at its tag into ``cache`` once; a finished copy (stamp file) is reused offline. Builds that
    share the cache (two archs at once) take a lock per dependency, as ``index.fetch_verified`` does."""
    dest = cache / dep.cache_name
    with cache_lock(dest):
        return _clone_once(dep, dest, remote=remote, git=git)


def _clone_once(dep: CMakeDep, dest: Path, *, remote: str | None, git: Runner) -> Path:
    stamp = dest / ".g4build-prefetched"
    if stamp.is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    remove_tree(tmp)
    tmp.mkdir(parents=True)

    def run(*argv: str) -> None:
        git([*LONG_PATHS, *argv], tmp)

    try:
        run("init", "-q")
        run("remote", "add", "origin", remote or dep.repository)
        run("fetch", "-q", "--depth", "1", "origin", dep.tag)
        run("checkout", "-q", "--detach", "FETCH_HEAD")
        if dep.submodules:
            run("submodule", "update", "--init", "--depth", "1", "--", *dep.submodules)
        else:
            run("submodule", "update", "--init", "--recursive", "--depth", "1")
        (tmp / ".g4build-prefetched").write_text(f"{dep.repository} {dep.tag}\n")
    except BaseException:  # a failed or interrupted clone leaves no half copy in the cache
        remove_tree(tmp)
        raise
    remove_tree(dest)
    tmp.rename(dest)
    return dest


def default_cache() -> Path:
    """Where prefetched dependencies are kept unless told (``--cache``)."""
    return cache_root() / "deps"


@dataclass(frozen=True)
class Prefetched:
    """One dependency of a tree, cloned into the cache."""

    dep: CMakeDep
    path: Path

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.dep.name, "repository": self.dep.repository, "tag": self.dep.tag, "path": str(self.path),
                "variables": list(self.dep.cache_vars), "unset": list(self.dep.unset_vars)}


def prefetch_all(tree: Path, cache: Path | None = None, *, write: Path | None = None,
                 each: Callable[[CMakeDep], AbstractContextManager[Any]] | None = None,
                 git: Runner = _git) -> list[Prefetched]:
    """Prefetch every FetchContent dependency of ``tree`` into ``cache`` (default: ``default_cache()``), in the
    order the tree declares them; with ``write``, also write the ``cmake -C`` initial cache naming them there.
    ``each(dep)`` is entered around each dependency's prefetch (a progress display)."""
    cache = cache or default_cache()
    done = []
    for dep in find_deps(tree):
        with each(dep) if each is not None else nullcontext():
            path = prefetch(dep, cache, git=git)
        done.append(Prefetched(dep, path))
    if write:
        write_atomic(write, initial_cache((p.dep, p.path) for p in done).encode("utf-8"))
    return done
