from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.support.yamltext import yaml_text

from g4build.errors import ConfigError, UnknownPinError
from g4build.pins.model import load_pins

REPO = Path(__file__).resolve().parents[3]


def test_real_pins_hold_both_releases() -> None:
    pins = load_pins()
    assert set(pins.pins) >= {"vllm-0.21.0", "vllm-0.33.0"}
    p21 = pins.get("vllm-0.21.0")
    assert p21.sdist.sha256 == "05ff89c3e926b88b77d7878e317a659ffba678afc21c1d48952037aa5457f058"
    assert p21.upstream.commit.startswith("9da56fd18")  # full sha of tag v0.21.0 since the build work
    assert (p21.torch, p21.flashinfer) == ("2.11.0", "0.6.8.post1")
    p33 = pins.get("vllm-0.33.0")
    assert p33.sdist.sha256 == "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
    assert p33.upstream.commit.startswith("4ba787ec9")
    assert (p33.torch, p33.flashinfer) == ("2.14.0", "0.7.2.post1")
    assert pins.nearest("0.34.1").name == "vllm-0.33.0"
    assert pins.nearest("0.25.0").name == "vllm-0.21.0"


def test_unknown_pin_names_the_known_ones() -> None:
    with pytest.raises(UnknownPinError) as info:
        load_pins().get("vllm-9.9.9")
    assert "vllm-0.21.0" in info.value.message and "vllm-0.33.0" in info.value.message
    assert info.value.exit_code == 2


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "pins.yaml"
    path.write_text(yaml_text(data))
    return path


def _good() -> dict:  # type: ignore[type-arg]
    raw = yaml.safe_load((REPO / "patches" / "pins.yaml").read_text())
    return raw  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda d: d["pins"]["vllm-0.21.0"].pop("sdist"), "pins.vllm-0.21.0: missing key 'sdist'"),
        (lambda d: d["pins"]["vllm-0.21.0"]["sdist"].update(sha256="abc"), "sdist.sha256: expected 64 hex digits"),
        (lambda d: d["pins"]["vllm-0.21.0"]["upstream"].update(commit="xyz"), "upstream.commit: expected 7-40 hex"),
        (lambda d: d.update(default="nope"), "default pin 'nope' is not one of"),
        (lambda d: d["pins"]["vllm-0.21.0"].update(version="not a version"), "version: not a version"),
        (lambda d: d["pins"]["vllm-0.21.0"].update(torch=2.10), "torch: expected a quoted version string"),
        (lambda d: d["pins"]["vllm-0.21.0"].update(cuda=13.0), "cuda: expected a quoted version string"),
    ],
)
def test_malformed_pins_name_file_and_key(tmp_path: Path, mutate, expect: str) -> None:  # type: ignore[no-untyped-def]
    data = _good()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_pins(path)
    assert str(path) in info.value.message
    assert expect in info.value.message


def test_cli_pins_list_json_and_exit_codes(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "g4build"]
    env = {"PYTHONPATH": str(REPO / "toolkit"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([*run, "pins", "list", "--json"], capture_output=True, text=True, env=env, check=True)
    rows = json.loads(out.stdout)
    by_name = {r["name"]: r for r in rows}
    for key in ("name", "version", "commit", "sdist", "sha256"):
        assert key in by_name["vllm-0.33.0"]
    assert by_name["vllm-0.21.0"]["sdist"] == "vllm-0.21.0.tar.gz"
    bad = subprocess.run([*run, "pins", "show", "nope"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert "vllm-0.21.0" in bad.stderr
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "pins.yaml").write_text("pins: [1, 2]\ndefault: x\n")
    broken = subprocess.run(
        [*run, "pins", "list"], capture_output=True, text=True, env=env | {"G4BUILD_HOME": str(tmp_path)}
    )
    assert broken.returncode == 3
    assert "pins.yaml" in broken.stderr and "pins" in broken.stderr


def test_error_messages_print_user_values_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    from g4build.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["pins", "show", "[red]x[/red]"])
    assert exit_info.value.code == 2
    assert "unknown pin '[red]x[/red]'" in capsys.readouterr().err
