"""Matrix expansion, exclusions, requiredness, runners, cache keys and target resolution."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.index_server import serve_index
from tests.support.yamltext import yaml_text

from g4build.ci import (
    MatrixSpec,
    Target,
    append_github_outputs,
    buildable,
    expand,
    github_outputs,
    latest_release,
    load_matrix,
    newest_release,
    read_github_outputs,
    resolve_target,
    select_archs,
)
from g4build.data import project_root
from g4build.errors import ConfigError, UsageError
from g4build.pins.model import PinSet, load_pins
from g4build.pins.page import IndexFile

SpecFrom = Callable[[dict[str, Any]], MatrixSpec]
PIN = Target(release="0.21.0", pin="vllm-0.21.0")


def _ids(cells: Any) -> list[str]:
    return [c.id for c in cells]


def test_default_selection_builds_sm120_only_on_both_oses() -> None:
    spec = load_matrix()
    cells = expand(spec)
    assert {c.arch for c in cells} == {"sm120"}
    builds = [c for c in cells if c.role == "build"]
    # one build per (os, cuda); every other Python checks a Linux build's abi3 wheel, a Windows wheel is cpXY-cpXY
    assert _ids(builds) == ["linux-sm120-cu12.9", "linux-sm120-cu13.0", "windows-sm120-cu12.9", "windows-sm120-cu13.0"]
    assert all(c.python == spec.build_python for c in builds)
    linux = [c for c in cells if c.os == "linux"]
    assert len(linux) == 2 * len(spec.axes["python"]) and len(cells) == len(linux) + 2
    assert len(set(_ids(cells))) == len(cells)


def test_published_wheels_carry_every_kernel_family() -> None:
    """`g4build wheel` builds sm120's shorter gemma4 profile by default (a desktop's time); a nightly wheel serves
    whatever its users load, so every build cell asks for all, and plans it (not a stale script's own idea)."""
    from g4build.builder.request import WheelRequest, plan_wheel

    builds = [c for c in expand(load_matrix(), select_archs(load_matrix(), "all")) if c.role == "build"]
    assert builds
    for cell in builds:
        command = cell.command(PIN)
        assert command[command.index("--kernels") + 1] == "all", cell.id
    linux = next(c for c in builds if c.os == "linux" and c.arch == "sm120")
    planned = plan_wheel(WheelRequest(arch="sm120", os_name="linux", pin_name="vllm-0.21.0", cuda=linux.cuda,
                                      kernels="all", flashinfer=False))
    manifest = planned.plan.step("manifest").command
    assert manifest[manifest.index("--kernels") + 1] == "all" and ".gemma4." not in planned.plan.version


def test_exclusions_drop_windows_for_sm121_and_sm100() -> None:
    spec = load_matrix()
    cells = expand(spec, select_archs(spec, "all"))
    pairs = {(c.os, c.arch) for c in cells}
    assert ("windows", "sm121") not in pairs and ("windows", "sm100") not in pairs
    assert {("linux", "sm121"), ("linux", "sm100"), ("windows", "sm120"), ("linux", "sm120")} <= pairs


def test_required_cells_are_sm120_with_cuda_13_on_both_oses() -> None:
    spec = load_matrix()
    required = {(c.os, c.arch, c.cuda) for c in expand(spec, select_archs(spec, "all")) if c.required}
    assert required == {("linux", "sm120", "13.0"), ("windows", "sm120", "13.0")}


def test_optional_arch_is_never_required(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["required"].append({"arch": "sm121"})
    spec = spec_from(matrix_data)
    sm121 = [c for c in expand(spec, ("sm121",))]
    assert sm121 and not any(c.required for c in sm121)


def test_runner_override_sends_gb10_to_an_arm_runner() -> None:
    spec = load_matrix()
    cells = expand(spec, select_archs(spec, "all"))
    runners = {(c.os, c.arch): c.runner for c in cells}
    assert runners[("linux", "sm121")] == "ubuntu-24.04-arm"
    assert runners[("linux", "sm120")] == spec.runners["linux"]
    assert runners[("windows", "sm120")] == spec.runners["windows"]


def test_exclusion_on_one_python_removes_only_that_check(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["exclude"].append({"match": {"os": "linux", "arch": "sm120", "python": "3.10"}, "why": "test"})
    cells = expand(spec_from(matrix_data), ("sm120", "sm100"))
    sm120 = {c.python for c in cells if c.os == "linux" and c.arch == "sm120"}
    sm100 = {c.python for c in cells if c.os == "linux" and c.arch == "sm100"}
    assert sm120 == {"3.11", "3.12", "3.13"}
    assert sm100 == {"3.10", "3.11", "3.12", "3.13"}


def test_excluding_the_build_python_alone_is_refused(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["exclude"].append({"match": {"os": "linux", "python": matrix_data["build_python"]}, "why": "test"})
    with pytest.raises(ConfigError, match="nothing would build their wheel"):
        expand(spec_from(matrix_data))


def test_excluding_a_whole_group_is_fine(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["exclude"].append({"match": {"os": "windows", "cuda": "12.9"}, "why": "test"})
    ids = _ids(expand(spec_from(matrix_data)))
    assert not any(i.startswith("windows-sm120-cu12.9") for i in ids)
    assert "windows-sm120-cu13.0" in ids


def test_a_selection_with_no_cell_is_an_error(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["exclude"].append({"match": {"arch": "sm100"}, "why": "test"})
    spec = spec_from(matrix_data)
    with pytest.raises(ConfigError, match="no cell for arch sm100"):
        expand(spec, ("sm100",))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["exclude"].append({"match": {"os": "widnows"}, "why": "typo"}), "'widnows' is not a value"),
        (lambda d: d["exclude"].append({"match": {"gpu": "5090"}, "why": "x"}), "unknown axis 'gpu'"),
        (lambda d: d["required"].append({"arch": "sm_120"}), "'sm_120' is not a value"),
        (lambda d: d["axes"]["os"].append("macos"), "'macos' is not one of"),
        (lambda d: d["axes"]["cuda"].append("13"), "does not look like"),
        (lambda d: d["axes"]["python"].append("3.12"), "duplicate values"),
        (lambda d: d.update(build_python="3.9"), "build_python 3.9 is not in axes.python"),
        (lambda d: d.update(optional_arch=["sm90"]), "optional_arch names 'sm90'"),
        (lambda d: d["cuda_toolkit"].pop("12.9"), "cuda_toolkit needs a 12.9.x release"),
        (lambda d: d["runners"].pop("windows"), "no label for os 'windows'"),
        (lambda d: d["actions"]["checkout"].update(sha="v4"), "full 40-hex commit sha"),
        (lambda d: d["nightly"].update(gpu_runner_variable="GPU RUNNER"), "not a variable name"),
        (lambda d: d["nightly"]["smoke_cell"].update(arch="sm89"), "'sm89' is not a value"),
        # unquoted versions: YAML makes 3.10 the number 3.1, which would silently become another Python
        (lambda d: d["axes"]["python"].append(3.10), "found the number 3.1"),
        (lambda d: d.update(build_python=3.12), "build_python: expected a quoted version string"),
        (lambda d: d["nightly"].update(tool_python=3.12), "tool_python: expected a quoted version string"),
    ],
)
def test_malformed_data_names_the_problem(
    matrix_data: dict[str, Any], spec_from: SpecFrom, edit: Callable[[dict[str, Any]], Any], message: str,
) -> None:
    edit(matrix_data)
    with pytest.raises(ConfigError, match=message):
        spec_from(matrix_data)


def test_select_archs() -> None:
    spec = load_matrix()
    assert select_archs(spec) == ("sm120",)
    assert select_archs(spec, "all") == ("sm120", "sm121", "sm100")
    assert select_archs(spec, "sm_121") == ("sm121",)
    with pytest.raises(UsageError, match="expected default, all or one of sm120, sm121, sm100"):
        select_archs(spec, "sm89")


def test_cache_keys_are_shared_across_pythons_and_split_by_pin_arch_cuda_os() -> None:
    spec = load_matrix()
    cells = expand(spec, select_archs(spec, "all"))
    by_group: dict[str, set[str]] = {}
    for c in cells:
        by_group.setdefault(c.build_id, set()).add(c.cache_key(PIN))
    assert all(len(keys) == 1 for keys in by_group.values())  # every Python of a group shares one namespace
    all_keys = [next(iter(k)) for k in by_group.values()]
    assert len(set(all_keys)) == len(all_keys)  # groups never share
    cell = next(c for c in cells if c.id == "linux-sm120-cu13.0")
    assert cell.cache_key(PIN) == "g4build-vllm-0.21.0-sm120-cu13.0-linux"
    assert cell.cache_key(Target(release="0.33.0", pin="vllm-0.33.0")) == "g4build-vllm-0.33.0-sm120-cu13.0-linux"


def test_build_cell_command_names_the_target_and_the_cell() -> None:
    spec = load_matrix()
    cell = next(c for c in expand(spec) if c.id == "windows-sm120-cu13.0")
    cmd = cell.command(PIN)
    assert cmd[:2] == ("g4build", "wheel")
    assert cmd[cmd.index("--pin"):cmd.index("--pin") + 2] == ("--pin", "vllm-0.21.0")
    for flag, value in (("--arch", "sm120"), ("--os", "windows"), ("--cuda", "13.0"), ("--python", "3.12")):
        assert cmd[cmd.index(flag) + 1] == value
    unpinned = cell.command(Target(release="0.40.1", pin=None))
    assert "--pin" not in unpinned and unpinned[unpinned.index("--release") + 1] == "0.40.1"
    check = next(c for c in expand(spec) if c.role == "check")
    assert check.command(PIN)[:2] == ("g4build", "validate") and "--smoke" in check.command(PIN)
    assert check.artifact == f"g4build-{check.build_id}"


def _file(name: str, *, yanked: bool = False) -> IndexFile:
    return IndexFile(filename=name, url=f"files/{name}", sha256=None, yanked=yanked)


def test_latest_release_reads_the_package_index(monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_index() as idx:
        for name in ("vllm-0.33.0.tar.gz", "vllm-0.34.0rc1.tar.gz", "vllm-0.21.0.tar.gz"):
            idx.add(name, b"sdist")
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        assert latest_release() == "0.33.0"


def test_github_outputs_are_appended_in_the_delimiter_form(tmp_path: Path) -> None:
    out = tmp_path / "github_output"
    out.write_text("earlier=step\n", encoding="utf-8")
    append_github_outputs(out, {"release": "0.33.0", "left_out": '["a"]'})
    append_github_outputs(out, {"pin": ""})
    text = out.read_bytes().decode()
    assert "\r" not in text and text.startswith("earlier=step\n")
    assert re.fullmatch(r"earlier=step\n(release|left_out|pin)<<(g4build_[0-9a-f]{32})\n.*\n\2\n.*", text, re.S)
    assert read_github_outputs(text) == {"earlier": "step", "release": "0.33.0", "left_out": '["a"]', "pin": ""}


@pytest.mark.parametrize("value", [
    "0.33.0\npin=evil", "x\r\nbuild_matrix={}", "a\nEOF\nrelease=1", "line\n\nanother=1\n", "=\n<<\n",
    "x\u2028pin=evil",  # a line separator GitHub does not split on: one value either way
])
def test_a_value_with_newlines_adds_no_key(tmp_path: Path, value: str) -> None:
    """A value (a release name, a note from upstream text) holding newlines or key=value lines stays one value."""
    out = tmp_path / "github_output"
    append_github_outputs(out, {"release": value, "pin": "vllm-0.33.0"})
    assert read_github_outputs(out.read_bytes().decode()) == {"release": value, "pin": "vllm-0.33.0"}


def test_a_value_holding_the_delimiter_gets_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = iter(["a" * 32, "b" * 32])
    monkeypatch.setattr("g4build.ci.matrix.secrets.token_hex", lambda n: next(tokens))
    out = tmp_path / "github_output"
    value = f"x\ng4build_{'a' * 32}\nrelease=evil"
    append_github_outputs(out, {"note": value})
    assert read_github_outputs(out.read_text(encoding="utf-8")) == {"note": value}


def test_an_output_name_is_checked() -> None:
    with pytest.raises(UsageError, match="output name"):
        append_github_outputs(Path("unused"), {"a\nb": "x"})


def test_newest_release_skips_pre_dev_yanked_and_wheels() -> None:
    files = [
        _file("vllm-0.21.0.tar.gz"),
        _file("vllm-0.33.0.tar.gz"),
        _file("vllm-0.34.0rc1.tar.gz"),
        _file("vllm-0.35.0.dev3.tar.gz"),
        _file("vllm-0.34.0.tar.gz", yanked=True),
        _file("vllm-0.40.0-cp38-abi3-manylinux_2_28_x86_64.whl"),
        _file("vllm-0.10.0.tar.gz"),
        _file("vllm-notaversion.tar.gz"),
    ]
    assert newest_release(files) == "0.33.0"
    with pytest.raises(UsageError, match="no final vllm sdist"):
        newest_release([_file("vllm-1.0.0rc1.tar.gz")])


def test_resolve_target() -> None:
    pins = load_pins()
    never: Callable[[], str] = lambda: pytest.fail("the index must not be asked")  # noqa: E731
    assert resolve_target(pins, pin="vllm-0.33.0", release=None, latest=never) == Target(
        release="0.33.0", pin="vllm-0.33.0")
    assert resolve_target(pins, pin="", release="0.21.0", latest=never) == PIN
    assert resolve_target(pins, pin=None, release="0.40.1", latest=never) == Target(release="0.40.1", pin=None)
    assert resolve_target(pins, pin=" ", release="", latest=lambda: "0.33.0").pin == "vllm-0.33.0"
    with pytest.raises(UsageError, match="not both"):
        resolve_target(pins, pin="vllm-0.21.0", release="0.21.0", latest=never)
    with pytest.raises(UsageError, match="not a version"):
        resolve_target(pins, pin=None, release="latest!", latest=never)
    with pytest.raises(UsageError, match="unknown pin 'vllm-9'"):
        resolve_target(pins, pin="vllm-9", release=None, latest=never)


def test_github_outputs_are_one_line_and_carry_both_matrices() -> None:
    spec = load_matrix()
    cells = expand(spec)
    out = github_outputs(spec, PIN, cells)
    assert all("\n" not in v for v in out.values())
    builds = json.loads(out["build_matrix"])["include"]
    checks = json.loads(out["check_matrix"])["include"]
    assert [b["id"] for b in builds] == [c.id for c in cells if c.role == "build"]
    assert {c["artifact"] for c in checks} <= {b["artifact"] for b in builds}
    assert out["smoke_artifact"] == "g4build-linux-sm120-cu13.0"
    assert (out["release"], out["pin"], out["has_checks"]) == ("0.21.0", "vllm-0.21.0", "true")
    only_gb10 = github_outputs(spec, PIN, expand(spec, ("sm121",)))
    assert only_gb10["smoke_artifact"] == ""  # the smoke job is skipped when its cell was not built


def test_single_python_matrix_has_no_checks(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["axes"]["python"] = [matrix_data["build_python"]]
    spec = spec_from(matrix_data)
    out = github_outputs(spec, PIN, expand(spec))
    assert out["has_checks"] == "false" and json.loads(out["check_matrix"]) == {"include": []}


def _pins_with_windows(tmp_path: Path, *pins_with_base: str) -> PinSet:
    data = yaml.safe_load((project_root() / "patches" / "pins.yaml").read_text(encoding="utf-8"))
    for name, pin in data["pins"].items():
        pin["bases"] = {"windows": {"remote": "https://example.invalid/w.git", "commit": "abcdef1"}} \
            if name in pins_with_base else {}
    path = tmp_path / "pins.yaml"
    path.write_text(yaml_text(data), encoding="utf-8")
    return load_pins(path)


def test_windows_cells_need_the_pin_to_name_a_windows_base(tmp_path: Path) -> None:
    spec = load_matrix()
    assert spec.needs_base == ("windows",)
    cells = expand(spec)
    pins = _pins_with_windows(tmp_path, "vllm-0.21.0")
    kept, notes = buildable(spec, cells, PIN, pins)
    assert kept == cells and notes == ()
    newest = Target(release="0.33.0", pin="vllm-0.33.0")
    kept, notes = buildable(spec, cells, newest, pins)
    assert kept == tuple(c for c in cells if c.os == "linux")
    assert notes == ("windows: left out: pin vllm-0.33.0 names no windows base tree "
                     "(patches/pins.yaml: pins.vllm-0.33.0.bases.windows)",)
    kept, notes = buildable(spec, cells, Target(release="0.40.1", pin=None), pins)
    assert {c.os for c in kept} == {"linux"} and "0.40.1 is not pinned" in notes[0]
    windows_only = tuple(c for c in cells if c.os == "windows")
    with pytest.raises(UsageError, match=r"nothing to build for vllm-0\.33\.0"):
        buildable(spec, windows_only, newest, pins)


def test_needs_base_must_name_an_os(matrix_data: dict[str, Any], spec_from: SpecFrom) -> None:
    matrix_data["needs_base"] = ["macos"]
    with pytest.raises(ConfigError, match="needs_base names 'macos'"):
        spec_from(matrix_data)


def test_windows_wheel_is_checked_on_its_own_python_only() -> None:
    spec = load_matrix()
    assert spec.wheel_abi == {"linux": "abi3", "windows": "cpython"}
    cells = expand(spec, select_archs(spec, "all"))
    windows = [c for c in cells if c.os == "windows"]
    # `pip wheel` on Windows makes cp312-cp312-win_amd64: a py3.10/3.11/3.13 cell could never install it
    assert {(c.role, c.python) for c in windows} == {("build", spec.build_python)}
    assert [c.id for c in windows if c.required] == ["windows-sm120-cu13.0"]
    assert "cp312 wheels (vLLM) for sm120" in windows[0].builds(PIN)
    linux = next(c for c in cells if c.id == "linux-sm120-cu13.0")
    assert "abi3 wheels (vLLM + FlashInfer AOT)" in linux.builds(PIN)
    checks = {c.python for c in cells if c.os == "linux" and c.build_id == "linux-sm120-cu13.0" and c.role == "check"}
    assert checks == set(spec.axes["python"]) - {spec.build_python}
    out = github_outputs(spec, PIN, expand(spec))
    assert not any(e["os"] == "windows" for e in json.loads(out["check_matrix"])["include"])


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["wheel_abi"].pop("windows"), r"wheel_abi\.windows: expected one of abi3, cpython, found None"),
    (lambda d: d["wheel_abi"].update(linux="abi4"), r"wheel_abi\.linux: expected one of abi3, cpython, found 'abi4'"),
    (lambda d: d.pop("wheel_abi"), "wheel_abi"),
])
def test_wheel_abi_is_checked(matrix_data: dict[str, Any], spec_from: SpecFrom, edit: Callable[[dict[str, Any]], Any],
                              message: str) -> None:
    edit(matrix_data)
    with pytest.raises(ConfigError, match=message):
        spec_from(matrix_data)


def test_a_release_given_with_spaces_or_newlines_is_typed() -> None:
    pins = load_pins()
    never: Callable[[], str] = lambda: pytest.fail("the index must not be asked")  # noqa: E731
    assert resolve_target(pins, pin="", release=" 0.40.1\n", latest=never).release == "0.40.1"
    for bad in ("0.40.1\npin=evil", "0.40.1'; touch x; '", "0.40.1/../.."):
        with pytest.raises(UsageError, match="is not a version"):
            resolve_target(pins, pin="", release=bad, latest=never)
