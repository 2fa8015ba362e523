"""FlashAttention 4's cute folder in a wheel built as `g4build wheel` builds vLLM, for real: CMake runs vLLM's own
cmake/external_projects/vllm_flash_attn.cmake (each pin's sdist) with the initial cache g4build writes, setuptools
builds the wheel with the plan's own `pip wheel` command and environment, and g4build's validate judges it.

vLLM's file installs flash_attn/cute two ways. With VLLM_FLASH_ATTN_SRC_DIR set (a developer mode) it makes
build_lib/vllm/vllm_flash_attn/cute a symlink to the source folder, whose files import `flash_attn.cute`; without
it, it copies the *.py rewriting that to `vllm.vllm_flash_attn.cute`. setuptools follows the symlink when it
stages the wheel, so the wheel holds no symlink member either way: the difference is in the files.

The harness (tests/fixtures/fa4_cute_wheel) is vLLM's setup.py build_ext cut to the FA4 component. The
dependency tree is the vllm-flash-attn fixture's flash_attn/cute files (upstream text at f5bc33c, the commit
vLLM 0.21.0 pins; 0.33.0's file has the same install rules); its CMakeLists.txt is left out, as it needs CUDA
and torch and installs nothing (checked below), so what is installed is vLLM's rules alone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.cmake import find_cmake

from g4build.builder.arch import parse_arch
from g4build.builder.deps import CMakeDep, find_deps, initial_cache
from g4build.builder.plan import BuildPlan, Layout, Options, Target
from g4build.builder.planner import make_plan
from g4build.pins.model import load_pins
from g4build.validate.wheel import ValidateOptions, validate_wheel

REPO = Path(__file__).resolve().parents[3]
FA_FIXTURE = REPO / "tests" / "fixtures" / "vllm_flash_attn_f5bc33c"
HARNESS = REPO / "tests" / "fixtures" / "fa4_cute_wheel"
CUTE = "vllm/vllm_flash_attn/cute/"


CMAKE = find_cmake()
_skip = pytest.mark.skipif(CMAKE is None, reason="needs CMake >= 3.26 (pip install cmake)")


def need_cmake(test):  # type: ignore[no-untyped-def]
    """Real CMake, and the pin's sdist from the package index (network unless cached)."""
    return pytest.mark.cmake(pytest.mark.network(_skip(test)))


def _rewrite(data: bytes) -> bytes:
    """vLLM's rule for each copied file: string(REPLACE "flash_attn.cute" "vllm.vllm_flash_attn.cute" ...)."""
    return data.replace(b"flash_attn.cute", b"vllm.vllm_flash_attn.cute")


@dataclasses.dataclass(frozen=True)
class Built:
    wheel: Path
    project: Path
    fa: Path  # the dependency's source tree

    @property
    def staged_cute(self) -> Path:
        (lib,) = (self.project / "build").glob("lib*")
        return lib / "vllm" / "vllm_flash_attn" / "cute"

    def members(self) -> dict[str, tuple[int, bytes]]:
        with zipfile.ZipFile(self.wheel) as zf:
            return {i.filename: (i.external_attr >> 16, zf.read(i)) for i in zf.infolist()
                    if i.filename.startswith(CUTE)}


def _source_files(fa: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((fa / "flash_attn" / "cute").iterdir())}


def _fa_dep(tree: Path) -> CMakeDep:
    (dep,) = [d for d in find_deps(tree) if d.name == "vllm-flash-attn"]
    return dep


def _plan(pin_name: str, root: Path) -> BuildPlan:
    """The plan `g4build wheel --arch sm120 --os linux --no-flashinfer` makes, run by this interpreter."""
    target = Target(os="linux", arch=parse_arch("sm120"), python="3.12", cuda="13.0", executor="native")
    layout = Layout(root=str(root), out=str(root / "wheels"), cache=str(root / "deps"))
    return make_plan(load_pins().get(pin_name), [], target, layout=layout,
                     opts=Options(jobs=1, flashinfer=False, python=(sys.executable,)))


def _build(work: Path, pin_name: str, cache_text: str, *, user_env: dict[str, str], plan_env: bool = True) -> Built:
    """The plan's vllm step (its command and environment) run in the harness, with ``cache_text`` as the
    initial cache the plan's CMAKE_ARGS names. ``user_env``: what the user's shell exports; ``plan_env=False``
    leaves out what the plan sets for vllm-flash-attn (as g4build did before)."""
    from tests.support.trees import sdist_tree

    assert CMAKE is not None
    tree = sdist_tree(pin_name)
    fa = work / "deps" / _fa_dep(tree).cache_name
    shutil.copytree(FA_FIXTURE / "flash_attn", fa / "flash_attn")
    project = shutil.copytree(HARNESS, work / "src")
    package = project / "vllm" / "vllm_flash_attn"
    package.mkdir()
    for f in (tree / "vllm" / "vllm_flash_attn").glob("*.py"):  # vLLM's own files of the package (its __init__)
        shutil.copy2(f, package / f.name)
    plan = _plan(pin_name, work)
    Path(plan.layout.deps_file).write_text(cache_text.replace("@FA@", fa.as_posix()), encoding="utf-8")
    shell = {k: v for k, v in os.environ.items() if k != "VLLM_FLASH_ATTN_SRC_DIR"}
    planned = {k: v for k, v in plan.env.items() if plan_env or k != "VLLM_FLASH_ATTN_SRC_DIR"}
    env = {**shell, **user_env, **planned, "G4_TEST_CMAKE": CMAKE,
           "G4_TEST_VLLM_FA_CMAKE": str(tree / "cmake" / "external_projects" / "vllm_flash_attn.cmake")}
    assert plan.env["CMAKE_ARGS"] == f"-C {plan.layout.deps_file}"
    step = plan.step("vllm")
    proc = subprocess.run(step.command, cwd=project, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (wheel,) = Path(plan.layout.out).glob("vllm-*.whl")
    return Built(wheel=wheel, project=project, fa=fa)


def test_the_dependencys_own_cmake_installs_nothing() -> None:
    """Why the harness may leave vllm-flash-attn's CMakeLists.txt (f5bc33c) out: every install rule is vLLM's."""
    text = (FA_FIXTURE / "CMakeLists.txt").read_text(encoding="utf-8")
    assert not re.search(r"\binstall\s*\(", text, re.IGNORECASE)


@need_cmake
@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.33.0"])
def test_a_g4build_build_copies_the_cute_files_with_vllms_imports(tmp_path: Path, pin: str) -> None:
    from tests.support.trees import sdist_tree

    dep = _fa_dep(sdist_tree(pin))
    cache = initial_cache([(dep, Path("@FA@"))])  # what `g4build prefetch --write` writes
    # even with vLLM's switch exported by the user's shell: the plan blanks it
    built = _build(tmp_path, pin, cache, user_env={"VLLM_FLASH_ATTN_SRC_DIR": str(tmp_path / "deps" / dep.cache_name)})
    assert built.staged_cute.is_dir() and not built.staged_cute.is_symlink()
    source = _source_files(built.fa)
    py = {name: data for name, data in source.items() if name.endswith(".py")}
    members = built.members()
    assert sorted(members) == sorted(CUTE + name for name in py)  # the *.py only: no README, no pyproject.toml
    for name, data in py.items():
        mode, got = members[CUTE + name]
        assert stat.S_ISREG(mode) and got == _rewrite(data), name
    assert b"from vllm.vllm_flash_attn.cute.cute_dsl_utils import" in members[CUTE + "__init__.py"][1]
    report = validate_wheel(built.wheel, ValidateOptions())
    checks = {c.name: (c.ok, c.detail) for c in report.checks}
    assert report.ok, checks
    assert checks["fa4-cute"] == (True, "4 FlashAttention 4 files, imports rewritten to vllm.vllm_flash_attn.cute")
    assert _source_files(built.fa) == source == _source_files(FA_FIXTURE)  # the dependency copy is untouched


@need_cmake
@pytest.mark.parametrize("pin", ["vllm-0.21.0", "vllm-0.33.0"])
def test_with_vllms_switch_set_the_wheel_holds_the_source_files_behind_a_symlink(tmp_path: Path, pin: str) -> None:
    """What g4build's initial cache did before (the switch set to the prefetched copy): vLLM symlinks the folder,
    setuptools stores the files behind the link as they are. No symlink member (validate's members check passes);
    the fa4-cute check is what fails the wheel."""
    from tests.support.trees import sdist_tree

    dep = dataclasses.replace(_fa_dep(sdist_tree(pin)), src_dir_dev_mode=False)
    cache = initial_cache([(dep, Path("@FA@"))])
    assert 'set(VLLM_FLASH_ATTN_SRC_DIR "@FA@" CACHE PATH' in cache
    built = _build(tmp_path, pin, cache, user_env={}, plan_env=False)
    assert built.staged_cute.is_symlink()
    assert built.staged_cute.resolve() == (built.fa / "flash_attn" / "cute").resolve()
    source = _source_files(built.fa)
    members = built.members()
    assert sorted(members) == sorted(CUTE + name for name in source)  # every file of the folder, README included
    for name, data in source.items():
        mode, got = members[CUTE + name]
        assert stat.S_ISREG(mode) and got == data, name  # regular files, not rewritten
    assert b"from flash_attn.cute.cute_dsl_utils import" in members[CUTE + "__init__.py"][1]
    report = validate_wheel(built.wheel, ValidateOptions())
    checks = {c.name: (c.ok, c.detail) for c in report.checks}
    assert [n for n, (ok, _) in checks.items() if not ok] == ["fa4-cute"]
    assert checks["members"][0]
    assert checks["fa4-cute"][1].startswith(f"2 of 4 FlashAttention 4 files under {CUTE} still import "
                                            "flash_attn.cute: __init__.py, flash_fwd_sm120.py (2 non-Python files")


@need_cmake
def test_the_initial_cache_unsets_a_switch_an_earlier_configure_stored(tmp_path: Path) -> None:
    """A build folder configured with the switch keeps it in CMakeCache.txt; configured again with g4build's
    initial cache, the switch is gone and the install copies (vLLM 0.21.0's file, CMake alone)."""
    from tests.support.trees import sdist_tree

    assert CMAKE is not None
    tree = sdist_tree("vllm-0.21.0")
    dep = _fa_dep(tree)
    fa = shutil.copytree(FA_FIXTURE / "flash_attn", tmp_path / "fa" / "flash_attn").parent
    old = tmp_path / "old.cmake"
    old.write_text(initial_cache([(dataclasses.replace(dep, src_dir_dev_mode=False), fa)]))
    new = tmp_path / "new.cmake"
    new.write_text(initial_cache([(dep, fa)]))
    build = tmp_path / "b"
    fa_cmake = tree / "cmake" / "external_projects" / "vllm_flash_attn.cmake"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_FLASH_ATTN_SRC_DIR"}

    def configure(cache: Path) -> str:
        proc = subprocess.run([CMAKE, "-S", str(HARNESS), "-B", str(build), "-C", str(cache),
                               f"-DVLLM_FA_CMAKE={fa_cmake}"], capture_output=True, text=True, env=env, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return (build / "CMakeCache.txt").read_text(encoding="utf-8")

    assert f"VLLM_FLASH_ATTN_SRC_DIR:PATH={fa.as_posix()}" in configure(old)
    assert "VLLM_FLASH_ATTN_SRC_DIR" not in configure(new)
    prefix = tmp_path / "prefix"
    subprocess.run([CMAKE, "--install", str(build), "--prefix", str(prefix), "--component", "_vllm_fa4_cutedsl_C"],
                   check=True, capture_output=True, env=env)
    cute = prefix / CUTE
    assert cute.is_dir() and not cute.is_symlink()
    assert sorted(p.name for p in cute.iterdir()) == sorted(n for n in _source_files(fa) if n.endswith(".py"))
    assert (cute / "__init__.py").read_bytes() == _rewrite((fa / "flash_attn" / "cute" / "__init__.py").read_bytes())
