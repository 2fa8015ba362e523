"""A wheel's build-manifest.json is upstream material when the wheel came from elsewhere: the FlashInfer wheel
names it records are typed (a FlashInfer wheel's plain file name) before a launch script names them, and no
field of it can end the scripts' header comment. Wheels are built here with zipfile; scripts are rendered by the
real CLI; a manifest with wrong types or deep nesting is a clear error, not a traceback."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from g4build.cli import main
from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins
from g4build.recipes import load_recipe, render
from g4build.recipes.script import WheelRef
from g4build.wheelfile.manifestfile import dumps

RECIPE = "gemma4-26b-a4b-nvfp4-baseline"
GOOD = "flashinfer_python-0.6.8.post1-py3-none-any.whl"


def _wheel(folder: Path, manifest: dict[str, Any] | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vllm-0.21.0+cu130.g4.abc-cp38-abi3-linux_x86_64.whl"
    dist = "vllm-0.21.0+cu130.g4.abc.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.21.0+cu130.g4.abc\n\n")
        z.writestr(f"{dist}/build-manifest.json", manifest if isinstance(manifest, bytes) else dumps(manifest))
    return path


def _manifest(files: list[Any]) -> dict[str, Any]:
    manifest = make_manifest(load_pins().get("vllm-0.21.0"), [], route="overlay")
    manifest["flashinfer"] = {"source": "wheels", "wheels": [{"file": f, "sha256": "0" * 64} for f in files]}
    return manifest


def _render(tmp_path: Path, wheel: Path, shell: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    out = tmp_path / "launch"
    try:
        main(["recipe", "render", RECIPE, "--shell", shell, "--out", str(out), "--wheel", str(wheel)])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


HOSTILE = [
    f"{GOOD}\ntouch pwned",
    f"{GOOD}\r\ntouch pwned",
    f"{GOOD}\rtouch pwned",
    f"{GOOD}\u2028touch pwned",
    f"{GOOD}\x85touch pwned",
    f"../{GOOD}",
    f"..\\{GOOD}",
    f"/tmp/{GOOD}",
    f"{GOOD}$(touch pwned)",
    f"{GOOD}`touch pwned`",
    "flashinfer_python-0.6.8-py3-none-any.whl'; touch pwned; '",
    "evil-1.0-py3-none-any.whl",  # a wheel, but not FlashInfer's
    "flashinfer_python.whl",  # no wheel file name
]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("shell", ["bash", "powershell"])
def test_a_hostile_flashinfer_wheel_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    name: str, shell: str) -> None:
    wheel = _wheel(tmp_path / "wheelhouse", _manifest([name]))
    (tmp_path / "wheelhouse" / GOOD).write_bytes(b"")
    code, err = _render(tmp_path, wheel, shell, capsys)
    assert code == 11, err
    assert "build-manifest.json names the FlashInfer wheel" in err
    assert not (tmp_path / "launch").exists() or not any((tmp_path / "launch").iterdir())


def test_a_sound_manifest_still_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _wheel(tmp_path / "wheelhouse", _manifest([GOOD]))
    (tmp_path / "wheelhouse" / GOOD).write_bytes(b"")
    code, err = _render(tmp_path, wheel, "bash", capsys)
    assert code == 0, err
    (script,) = (tmp_path / "launch").iterdir()
    assert f"FlashInfer wheels its build recorded: {GOOD}." in script.read_text(encoding="utf-8")


@pytest.mark.parametrize("shell", ["bash", "powershell"])
def test_no_header_line_ends_the_comment_whatever_reaches_it(shell: str) -> None:
    """The header's last pass: were a name with line breaks to reach it by some other route, every piece is still
    a comment line of its own."""
    ref = WheelRef(path="x.whl", beside_script=True, companions=(f"{GOOD}\ntouch pwned", "a\r\nb\u2028c\x85d"))
    text = render(load_recipe(RECIPE), shell, wheel=ref)
    lines = text.splitlines()
    first = next(n for n, line in enumerate(lines) if "touch pwned" in line)  # the header names it first
    assert lines[first].startswith("#"), lines[first]
    header = lines[:first + 1]
    assert all(line.startswith("#") or not line.strip() for line in header[1:]), header
    assert not any(ch in text.split("touch pwned", 1)[0] for ch in "\u2028\x85\r")


MALFORMED: dict[str, Any] = {
    "series entry not an object": {"schema": 1, "series": [1]},
    "series version text": {"schema": 1, "series": [{"name": "x", "version": "3"}]},
    "series name a list": {"schema": 1, "series": [{"name": ["x"]}]},
    "pin a string": {"schema": 1, "series": [], "pin": "vllm-0.21.0"},
    "flashinfer wheels a mapping": {"schema": 1, "series": [], "flashinfer": {"source": "wheels", "wheels": {}}},
    "flashinfer wheel entry no file": {"schema": 1, "series": [], "flashinfer": {"source": "wheels",
                                                                                "wheels": [{"sha256": "0"}]}},
}


@pytest.mark.parametrize("case", [*sorted(MALFORMED), "deep nesting", "not JSON"])
def test_a_malformed_manifest_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               case: str) -> None:
    raw: dict[str, Any] | bytes = (b"[" * 200000 + b"]" * 200000 if case == "deep nesting"
                                   else b"{'schema': 1" if case == "not JSON" else MALFORMED[case])
    wheel = _wheel(tmp_path / "wheelhouse", raw)
    code, err = _render(tmp_path, wheel, "bash", capsys)
    assert code in (10, 11), err
    assert "build-manifest.json" in err and "unexpected" not in err.lower()
