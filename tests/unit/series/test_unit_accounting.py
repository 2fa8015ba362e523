"""The unit accounting of the vllm-kernel-archs series (units-sm120.yaml, the real data) as g4build reads it:
bad entries are config errors, check() finds a unit no group names, a unit two groups name, a unit of the
wrong profile and a glob naming no unit, and the plan's notes name each group kept without running on SM120.
The real lists of units are held against it in tests/integration/builder/test_build_unit_accounting.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from g4build.errors import ConfigError
from g4build.series.deps import get_build_series, load_build_series
from g4build.series.unitaccount import Accounting, UnitGroup, check, load_accounting, notes

SERIES = "vllm-kernel-archs"
PIN = "vllm-0.21.0"


def _real() -> Accounting:
    found = load_accounting(get_build_series(SERIES), PIN, "sm120")
    assert found is not None
    return found


def _copy(tmp_path: Path, text: str) -> Path:
    """The real series in a tmp folder with ``text`` as its units-sm120.yaml."""
    folder = tmp_path / SERIES
    shutil.copytree(get_build_series(SERIES).series.folder, folder)
    (folder / "units-sm120.yaml").write_text(text, encoding="utf-8")
    return folder


def _acc(*groups: UnitGroup) -> Accounting:
    return Accounting(series=SERIES, arch="sm120", arch_list="12.0f", pin=PIN, groups=groups)


def test_the_real_accounting_loads_and_names_no_pin_it_lacks() -> None:
    acc = _real()
    assert acc.arch_list == "12.0f" and len(acc.groups) >= 15
    assert all(bool(g.runs) != bool(g.kept) for g in acc.groups)
    assert load_accounting(get_build_series(SERIES), "vllm-0.26.0", "sm120") is None
    assert load_accounting(get_build_series(SERIES), PIN, "sm90") is None
    # QuTLASS's sm100 units are left out (0004), not accounted as kept
    assert not any(g.matches("qutlass/qutlass/csrc/fused_quantize_mx_sm100.cu") for g in acc.groups)


@pytest.mark.parametrize(("entry", "match"), [
    ("    - group: g\n      units: [a.cu]\n", r"exactly one of runs .* or kept"),
    ("    - group: g\n      units: [a.cu]\n      runs: x\n      kept: y\n", r"exactly one of runs"),
    ("    - group: g\n      units: []\n      runs: x\n", r"units: expected a non-empty list of path globs"),
    ("    - group: g\n      units: [a.cu]\n      runs: x\n      profiles: [gemma]\n", r"profiles: expected kernel"),
    ("    - units: [a.cu]\n      runs: x\n", r"group"),
])
def test_bad_entries_are_config_errors(tmp_path: Path, entry: str, match: str) -> None:
    folder = _copy(tmp_path, f'arch_list: "12.0f"\npins:\n  {PIN}:\n{entry}')
    with pytest.raises(ConfigError, match=match):
        load_accounting(load_build_series(folder), PIN, "sm120")


def test_check_finds_what_no_group_names_and_what_two_name() -> None:
    acc = _acc(UnitGroup(group="a", units=("csrc/a*.cu",), runs="r"),
               UnitGroup(group="b", units=("csrc/ab.cu", "csrc/b.cu"), runs="r"))
    found = check(acc, {"all": ["csrc/a1.cu", "csrc/ab.cu", "csrc/c.cu", "csrc/b.cu"]})
    assert found.unaccounted == ("csrc/c.cu",)
    assert found.ambiguous == ("csrc/ab.cu (a, b)",)
    assert not found.ok
    assert check(acc, {"all": ["csrc/a1.cu", "csrc/b.cu", "csrc/ab.cu"]}).ambiguous


def test_check_finds_a_glob_naming_no_unit_and_a_unit_of_another_profile() -> None:
    acc = _acc(UnitGroup(group="a", units=("csrc/a.cu", "csrc/gone.cu"), runs="r"),
               UnitGroup(group="p", units=("csrc/p.cu",), runs="r", profiles=("all",)))
    found = check(acc, {"all": ["csrc/a.cu", "csrc/p.cu"], "gemma4": ["csrc/a.cu", "csrc/p.cu"]})
    assert found.stale_globs == ("csrc/gone.cu",)
    assert found.wrong_profile == ("csrc/p.cu (gemma4: group p says all)",)
    assert found.unaccounted == () and found.ambiguous == ()
    assert check(acc, {"all": ["csrc/a.cu", "csrc/gone.cu", "csrc/p.cu"], "gemma4": ["csrc/a.cu"]}).ok


def test_notes_name_each_kept_group_once_for_its_profiles() -> None:
    acc = _acc(UnitGroup(group="runs", units=("csrc/r.cu",), runs="r"),
               UnitGroup(group="Registration only", units=("csrc/k1.cu", "csrc/k2.cu"),
                         kept="vllm imports the module", profiles=("all",)))
    lines = notes(acc, "all")
    assert lines[0].startswith("sm120 units (patches/deps/vllm-kernel-archs/units-sm120.yaml): 1 of the 2 unit "
                               "groups kernel profile all compiles run on SM120; 1 kept without running there")
    assert lines[1:] == ["sm120 units kept, not run on SM120: Registration only (csrc/k1.cu, csrc/k2.cu): "
                         "vllm imports the module"]
    assert notes(acc, "gemma4") == ["sm120 units (patches/deps/vllm-kernel-archs/units-sm120.yaml): 1 of the 1 "
                                    "unit groups kernel profile gemma4 compiles run on SM120; none is built only "
                                    "for a symbol or a registration"]


def test_the_plan_notes_say_what_the_accounting_finds(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from g4build.cli import main

    main(["wheel", "--arch", "sm120", "--os", "linux", "--kernels", "gemma4", "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    lines = [n for n in plan["notes"] if n.startswith("sm120 units")]
    groups = [g for g in _real().groups if "gemma4" in g.profiles]
    assert lines == [f"sm120 units (patches/deps/vllm-kernel-archs/units-sm120.yaml): {len(groups)} of the "
                     f"{len(groups)} unit groups kernel profile gemma4 compiles run on SM120; none is built only "
                     "for a symbol or a registration"]


def test_a_plan_for_another_arch_list_says_the_accounting_does_not_cover_it(capsys: pytest.CaptureFixture[str]) \
        -> None:
    from g4build.cli import main

    main(["wheel", "--arch", "sm120", "--os", "linux", "--cuda", "12.9", "--dry-run"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("vllm-kernel-archs's unit accounting is for TORCH_CUDA_ARCH_LIST 12.0f, this build's is 12.0a: its "
            "units are not accounted for") in out
    assert "sm120 units (" not in out
