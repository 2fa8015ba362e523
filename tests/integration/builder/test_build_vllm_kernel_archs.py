"""The vllm-kernel-archs build series against vLLM 0.21.0's real CMakeLists.txt: the recorded decisions name what
the file says, the patch applies with zero fuzz, and vLLM's own cuda_archs_loose_intersection (run by CMake in
script mode) turns the patched lists into native 12.x SASS while lists without 12.x keep upstream's result."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from g4build.builder.depapply import apply_build_series, check_dependency
from g4build.pins.model import Pin, load_pins
from g4build.series.deps import get_build_series

pytestmark = pytest.mark.network  # the pin's sdist (cached once per machine)
CMAKE = shutil.which("cmake")
_CALL = re.compile(r'cuda_archs_loose_intersection\(\s*(?P<var>\w+)\s+"(?P<src>[^"]*)"\s+"\$\{CUDA_ARCHS\}"\)')


@pytest.fixture(scope="module")
def sdist() -> Path:
    from tests.support.trees import sdist_tree

    return sdist_tree("vllm-0.21.0")


@pytest.fixture
def pin21() -> Pin:
    return load_pins().get("vllm-0.21.0")


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
                   capture_output=True)


def _tree(sdist: Path, dest: Path) -> Path:
    """The files the series touches, as the pin's sdist has them, in a one-commit git repository."""
    dest.mkdir()
    variant = get_build_series("vllm-kernel-archs").variant("vllm-0.21.0")
    assert variant is not None
    for rel in variant.files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sdist / rel, dest / rel)
    _git("init", "-q", cwd=dest)
    _git("add", "-A", cwd=dest)
    _git("commit", "-qm", "upstream vllm 0.21.0 (the files the series touches)", cwd=dest)
    return dest


def _calls(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for m in _CALL.finditer(text):
        found.setdefault(m["var"], []).append(m["src"])
    return found


def test_each_single_variable_decision_names_what_the_pins_cmake_says(sdist: Path) -> None:
    calls = _calls((sdist / "CMakeLists.txt").read_text(encoding="utf-8"))
    checked = 0
    for d in get_build_series("vllm-kernel-archs").decisions:
        if re.fullmatch(r"[A-Z0-9_]+", d.cmake):
            assert d.upstream in calls.get(d.cmake, []), (d.family, d.cmake, calls.get(d.cmake))
            checked += 1
    assert checked >= 9


def test_the_patches_apply_with_zero_fuzz_and_applying_twice_changes_nothing(sdist: Path, tmp_path: Path,
                                                                               pin21: Pin) -> None:
    series = get_build_series("vllm-kernel-archs")
    variant = series.variant(pin21.name)
    assert variant is not None
    assert hashlib.sha256((sdist / "CMakeLists.txt").read_bytes()).hexdigest() == variant.files["CMakeLists.txt"]
    tree = _tree(sdist, tmp_path / "vllm")
    check = check_dependency(tree, series, pin21)
    assert check.ok and [(p.status, p.offsets) for p in check.report.series[0].patches] == [("applies", ())] * 4
    apply_build_series(tree, series, pin21)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout
    again = apply_build_series(tree, series, pin21)
    assert again.applied
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout == head


def _intersect(sdist: Path, tmp_path: Path, lists: dict[str, str], archs: str) -> dict[str, str]:
    assert CMAKE is not None
    script = tmp_path / "intersect.cmake"
    lines = ["cmake_minimum_required(VERSION 3.20)",  # the policies vLLM's CMake runs under (IN_LIST)
             f'include("{(sdist / "cmake" / "utils.cmake").as_posix()}")', f'set(CUDA_ARCHS "{archs}")']
    for var, src in lists.items():
        lines += [f'cuda_archs_loose_intersection({var} "{src}" "${{CUDA_ARCHS}}")', f'message("{var}=${{{var}}}")']
    script.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in proc.stderr.splitlines() if "=" in line)


PATCHED = ("MARLIN_ARCHS", "MARLIN_BF16_ARCHS", "MARLIN_OTHER_ARCHS", "MARLIN_MOE_ARCHS", "MARLIN_MOE_OTHER_ARCHS",
           "HADACORE_ARCHS")


@pytest.mark.skipif(CMAKE is None, reason="cmake not found")
@pytest.mark.parametrize(("archs", "want"), [
    ("12.0f", dict.fromkeys(PATCHED, "12.0f")),
    ("12.0a", dict.fromkeys(PATCHED, "12.0a")),  # CUDA 12.8/12.9 lists keep their suffix too
    ("12.1", dict.fromkeys(PATCHED, "12.0")),  # sm_120 SASS runs on 12.1
])
def test_patched_lists_give_12x_native_sass(sdist: Path, tmp_path: Path, pin21: Pin, archs: str,
                                            want: dict[str, str]) -> None:
    tree = _tree(sdist, tmp_path / "vllm")
    apply_build_series(tree, get_build_series("vllm-kernel-archs"), pin21)
    patched = {k: v[0] for k, v in _calls((tree / "CMakeLists.txt").read_text(encoding="utf-8")).items()
               if k in PATCHED}
    upstream = {k: v[0] for k, v in _calls((sdist / "CMakeLists.txt").read_text(encoding="utf-8")).items()
                if k in PATCHED}
    assert _intersect(sdist, tmp_path, patched, archs) == want
    # what the series fixes: upstream gives those families PTX (8.0, or 9.0 for bf16/Hadacore) and no 12.x SASS
    before = _intersect(sdist, tmp_path, upstream, archs)
    assert all(v.endswith("+PTX") and not v.startswith("12") for v in before.values()), before


@pytest.mark.skipif(CMAKE is None, reason="cmake not found")
def test_lists_without_12x_are_what_upstream_gives(sdist: Path, tmp_path: Path, pin21: Pin) -> None:
    tree = _tree(sdist, tmp_path / "vllm")
    apply_build_series(tree, get_build_series("vllm-kernel-archs"), pin21)
    pick = lambda path: {k: v[0] for k, v in _calls(path.read_text(encoding="utf-8")).items()  # noqa: E731
                         if k in PATCHED}
    for archs in ("7.5;8.0;8.6;8.9;9.0;10.0;11.0", "8.0;8.6", "9.0a"):
        assert _intersect(sdist, tmp_path, pick(tree / "CMakeLists.txt"), archs) == \
            _intersect(sdist, tmp_path, pick(sdist / "CMakeLists.txt"), archs), archs


def _c2x_archs(tree: Path, tmp_path: Path, archs: str, three_x: str) -> str:
    """SCALED_MM_2X_ARCHS as the tree's own CMakeLists computes it (its c2x block, run by CMake in script mode
    with vLLM's utils.cmake), for the requested ``archs`` and the c3x archs already built."""
    assert CMAKE is not None
    text = (tree / "CMakeLists.txt").read_text(encoding="utf-8")
    start = text.index("cuda_archs_loose_intersection(SCALED_MM_2X_ARCHS")
    block = text[start:text.index("if (SCALED_MM_2X_ARCHS)", start)]
    script = tmp_path / f"c2x-{abs(hash((str(tree), archs)))}.cmake"
    script.write_text("\n".join([
        "cmake_minimum_required(VERSION 3.20)", f'include("{(tree / "cmake" / "utils.cmake").as_posix()}")',
        f'set(CUDA_ARCHS "{archs}")', f'set(SCALED_MM_3X_ARCHS "{three_x}")', block,
        'message("C2X=${SCALED_MM_2X_ARCHS}")']) + "\n")
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True, check=True)
    return next(line.split("=", 1)[1] for line in proc.stderr.splitlines() if line.startswith("C2X="))


@pytest.mark.skipif(CMAKE is None, reason="cmake not found")
def test_scaled_mm_c2x_is_left_out_only_where_no_gpu_runs_it(sdist: Path, tmp_path: Path, pin21: Pin) -> None:
    tree = _tree(sdist, tmp_path / "vllm")
    shutil.copytree(sdist / "cmake", tree / "cmake", dirs_exist_ok=True)  # utils.cmake beside the touched ones
    apply_build_series(tree, get_build_series("vllm-kernel-archs"), pin21)
    # upstream compiles c2x for 8.9+PTX on a 12.0f-only (and a Hopper-only) list: the unit that held the build
    assert _c2x_archs(sdist, tmp_path, "12.0f", "12.0f") == "8.9+PTX"
    assert _c2x_archs(sdist, tmp_path, "9.0a", "9.0a") == "8.9+PTX"
    for archs, three_x in (("12.0f", "12.0f"), ("12.0a", "12.0a"), ("9.0a", "9.0a"), ("9.0a;12.0f", "9.0a;12.0f")):
        assert _c2x_archs(tree, tmp_path, archs, three_x) == "", archs
    # any 7.5-8.9 arch asked for: exactly upstream's result
    for archs, three_x in (("7.5;8.0;8.6;8.9;9.0;10.0;11.0;12.0+PTX", "9.0a;10.0f;12.0f"), ("8.9;12.0f", "12.0f"),
                           ("8.0", ""), ("7.5", "")):
        assert _c2x_archs(tree, tmp_path, archs, three_x) == _c2x_archs(sdist, tmp_path, archs, three_x), archs
        assert _c2x_archs(tree, tmp_path, archs, three_x) != "", archs
