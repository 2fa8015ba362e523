"""The environment a pin serves in (patches/pins.yaml ``transformers``, torch, FlashInfer): the program launch
scripts and doctor run, run for real against dist-info folders of the versions in question, and the METADATA
narrowing a g4build wheel carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from g4build.builder.probe import SystemProbe
from g4build.doctor.serving import check_serving
from g4build.errors import ConfigError
from g4build.pins.model import load_pins
from g4build.pins.serving import MISMATCH_EXIT, check_program, requires_dist
from g4build.wheelfile.wheelfile import metadata_fields, narrow_requires_dist


def _site(root: Path, **versions: str) -> Path:
    """A folder of dist-info records only (``flashinfer_python="0.6.8.post1"``): what importlib.metadata reads."""
    for project, version in versions.items():
        info = root / f"{project}-{version}.dist-info"
        info.mkdir(parents=True)
        name = project.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    return root


def _run(pin: str, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}  # before site-packages: these versions are the ones found
    return subprocess.run([sys.executable, "-c", check_program(load_pins().get(pin)), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_pins_program_survives_windows_powershell() -> None:
    for pin in load_pins().pins.values():
        assert '"' not in check_program(pin), pin.name  # 5.1 drops double quotes from native arguments


def test_a_transformers_outside_the_range_stops_with_both_versions_named(tmp_path: Path) -> None:
    done = _run("vllm-0.21.0", _site(tmp_path, transformers="5.17.0", torch="2.11.0+cu130"))
    assert done.returncode == MISMATCH_EXIT
    assert done.stderr.splitlines() == [
        "error: transformers 5.17.0 is installed here, expected transformers>=5.5.1,<5.15: vLLM 0.21.0 reads the "
        "configs of the published Gemma 4 checkpoints with these transformers only (g4build pin data)",
        "hint: pip install 'transformers>=5.5.1,<5.15' (in this environment), then start again",
    ]


def test_inside_the_range_nothing_is_said(tmp_path: Path) -> None:
    done = _run("vllm-0.21.0", _site(tmp_path, transformers="5.14.0", torch="2.11.0+cu130",
                                     flashinfer_python="0.6.8.post1"))
    assert (done.returncode, done.stderr) == (0, "")
    assert _run("vllm-0.33.0", _site(tmp_path / "b", transformers="5.20.2", torch="2.14.0")).returncode == 0


def test_another_torch_or_flashinfer_only_warns(tmp_path: Path) -> None:
    done = _run("vllm-0.21.0", _site(tmp_path, transformers="5.14.0", torch="2.13.0", flashinfer_python="0.6.14"))
    assert done.returncode == 0
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == ["warning", "warning"]
    assert "torch 2.13.0 is installed here, expected torch==2.11.0" in done.stderr
    assert "flashinfer-python 0.6.14 is installed here, expected flashinfer-python==0.6.8.post1" in done.stderr


def test_json_rows_for_doctor(tmp_path: Path) -> None:
    done = _run("vllm-0.26.0", _site(tmp_path, transformers="5.20.2", torch="2.11.0+cu130"), "--json")
    assert done.returncode == 0
    rows = {r["project"]: (r["found"], r["ok"]) for r in json.loads(done.stdout)}
    assert rows == {"transformers": ("5.20.2", False), "torch": ("2.11.0+cu130", True),
                    "flashinfer-python": (None, True)}


def test_doctor_fails_an_installed_transformers_outside_the_range(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pin = load_pins().get("vllm-0.21.0")
    monkeypatch.setenv("PYTHONPATH", str(_site(tmp_path / "a", transformers="5.17.0")))
    [transformers, flashinfer] = check_serving(SystemProbe(), sys.executable, pin)
    assert (transformers.check, transformers.status) == ("transformers", "fail")
    assert "transformers 5.17.0 installed; vLLM 0.21.0 (vllm-0.21.0) wants >=5.5.1,<5.15" in transformers.summary
    assert transformers.fix == ("python -m pip install 'transformers>=5.5.1,<5.15' in the environment that serves "
                                "(its venv active)")
    assert (flashinfer.check, flashinfer.status) == ("flashinfer-version", "ok")
    monkeypatch.setenv("PYTHONPATH", str(_site(tmp_path / "b", transformers="5.14.0")))
    assert [f.status for f in check_serving(SystemProbe(), sys.executable, pin)] == ["ok", "ok"]


# Each release's own transformers requirement (requirements/common.txt, as its wheel's METADATA says it); a network
# test holds these texts equal to the sdists' (tests/integration/pins/test_pin_transformers.py).
RELEASE_TRANSFORMERS = {
    "vllm-0.21.0": "transformers >= 4.56.0, != 5.0.*, != 5.1.*, != 5.2.*, != 5.3.*, != 5.4.*, != 5.5.0",
    "vllm-0.26.0": "transformers >= 5.5.3", "vllm-0.29.0": "transformers >= 5.10.4",
    "vllm-0.33.0": "transformers >= 5.16.1, < 5.21.0"}
# transformers releases on the registry around the edges (Gemma 4 first in 5.5; per-layer head_dim from 5.15)
REGISTRY = ("4.57.6", "5.4.0", "5.5.0", "5.5.1", "5.5.2", "5.5.3", "5.5.4", "5.10.4", "5.14.0", "5.14.1", "5.15.0",
            "5.15.1", "5.16.1", "5.20.2", "5.21.0", "5.24.0")


def test_the_recorded_ranges_are_the_releases_own_narrowed_only_where_they_cannot_read_gemma4() -> None:
    """0.29.0 and 0.33.0 record their own requirement as it is (0.29.0 reads per-layer configs: no upper bound;
    0.33.0 below 5.16 reads the full layers' head size wrong, which its own lower bound excludes); 0.21.0 and 0.26.0
    their own, from the first release with Gemma 4 (5.5.1; 0.26.0's own 5.5.3) to before 5.15 (per-layer head_dim
    they cannot read). Offline, over the registry's releases around the edges."""
    narrowing = {"vllm-0.21.0": ">=5.5.1,<5.15", "vllm-0.26.0": "<5.15", "vllm-0.29.0": "", "vllm-0.33.0": ""}
    for name, line in RELEASE_TRANSFORMERS.items():
        recorded = Requirement(f"transformers{load_pins().get(name).transformers}").specifier
        expected = Requirement(line).specifier & SpecifierSet(narrowing[name])
        assert [v for v in REGISTRY if v in recorded] == [v for v in REGISTRY if v in expected], name


def test_the_recorded_ranges_are_within_each_releases_own() -> None:
    """pins.yaml narrows a release's own requirement (requirements/common.txt, as its wheel's METADATA says it),
    never widens it: the releases' own lines, as read from their sdists."""
    own = RELEASE_TRANSFORMERS
    for name, line in own.items():
        recorded = load_pins().get(name).transformers
        assert recorded is not None
        release = Requirement(line).specifier
        for version in ("4.57.6", "5.5.0", "5.5.1", "5.5.4", "5.10.4", "5.14.0", "5.15.0", "5.16.1", "5.20.2",
                        "5.21.0"):
            if version in Requirement(f"transformers{recorded}").specifier:
                assert version in release, (name, version)


def test_metadata_narrowed_as_pip_reads_it() -> None:
    raw = (b"Metadata-Version: 2.4\r\nName: vllm\r\nVersion: 0.21.0\r\nRequires-Dist: regex\r\n"
           b"Requires-Dist: transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0\r\n"
           b"Requires-Dist: tokenizers>=0.21.1\r\n\r\nThe body: Requires-Dist: transformers stays.\r\n")
    out = narrow_requires_dist(raw, requires_dist(load_pins().get("vllm-0.21.0")))
    head, _, body = out.partition(b"\r\n\r\n")
    assert body == b"The body: Requires-Dist: transformers stays.\r\n"
    lines = head.split(b"\r\n")
    assert lines[:4] == raw.split(b"\r\n")[:4] and lines[5] == b"Requires-Dist: tokenizers>=0.21.1"
    spec = Requirement(lines[4].decode().removeprefix("Requires-Dist: ")).specifier
    assert [v for v in ("4.57.6", "5.5.0", "5.5.1", "5.14.0", "5.15.0", "5.20.2") if v in spec] == ["5.5.1", "5.14.0"]
    assert metadata_fields(out)["version"] == "0.21.0"
    bare = narrow_requires_dist(b"Metadata-Version: 2.1\nName: x\nVersion: 1\n", {"transformers": "<5.15"})
    assert bare == b"Metadata-Version: 2.1\nName: x\nVersion: 1\nRequires-Dist: transformers<5.15\n"
    assert narrow_requires_dist(raw, {}) == raw


@pytest.mark.parametrize("value", ["'>=5; rm -rf /'", "'>=5.5.1,<5.15\"'", "'not a range'", "5.15", "''"])
def test_a_transformers_range_that_is_no_range_is_refused(tmp_path: Path, value: str) -> None:
    text = Path(load_pins().source).read_text(encoding="utf-8")
    bad = text.replace('transformers: ">=5.5.1,<5.15"', f"transformers: {value}", 1)
    assert bad != text
    (tmp_path / "pins.yaml").write_text(bad, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"pins\.vllm-0\.21\.0\.transformers: expected a quoted version range"):
        load_pins(tmp_path / "pins.yaml")


def test_every_pins_program_reaches_python_whole_through_legacy_argument_passing() -> None:
    """Windows PowerShell 5.1 joins native arguments into a command line without escaping; the program (multi-line,
    single quotes) must come back out of it as it went in, as the C runtime splits it."""
    from tests.unit.recipes.recipe_shell_semantics import ps_legacy_command_line, windows_split

    for pin in load_pins().pins.values():
        program = check_program(pin)
        assert windows_split(ps_legacy_command_line(["-c", program, "--json"])) == ["-c", program, "--json"]


def test_a_built_wheel_is_stamped_with_the_narrowed_requirement(tmp_path: Path) -> None:
    """The build route's stamp (emit.stamp) narrows METADATA as an overlay does, and RECORD still verifies."""
    import zipfile

    from tests.support.wheelsfactory import build_wheel, record_hash

    from g4build.emit.manifest import make_manifest
    from g4build.emit.stamp import stamp
    from g4build.validate.wheel import ValidateOptions, validate_wheel

    pin = load_pins().get("vllm-0.21.0")
    wheel = build_wheel(tmp_path, version="0.21.0+cu130")
    stamp(tmp_path, make_manifest(pin, [], route="build"), requires=requires_dist(pin))
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read("vllm-0.21.0+cu130.dist-info/METADATA")
        record = zf.read("vllm-0.21.0+cu130.dist-info/RECORD").decode()
    assert "Requires-Dist: transformers>=5.5.1,<5.15" in metadata.decode().splitlines()
    assert f"vllm-0.21.0+cu130.dist-info/METADATA,{record_hash(metadata)},{len(metadata)}" in record.splitlines()
    checks = {c.name: c.ok for c in validate_wheel(wheel, ValidateOptions()).checks}
    assert checks["record"] and checks["members"], checks  # RECORD verifies every member, METADATA included
