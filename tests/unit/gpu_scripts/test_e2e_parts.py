"""tests/gpu/e2e/parts.py: the registry wheel travels to the GPU machine in parts and is accepted there only
when the joined file's sha256 is the one the pin records. Real files, real pins file layout; the GPU run itself
happens on the device machine."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import pytest
from tests.support.yamltext import yaml_text

SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "e2e" / "parts.py"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def parts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_parts", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel_and_pins(tmp_path: Path) -> tuple[Path, Path]:
    data = os.urandom(2 * MIB + 12345)
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_24_x86_64.whl"
    wheel.write_bytes(data)
    pins = tmp_path / "pins.yaml"
    pins.write_text(yaml_text({"pins": {"vllm-9.9.9": {"wheels": {"manylinux_x86_64": {
        "file": wheel.name, "sha256": hashlib.sha256(data).hexdigest()}}}}}))
    return wheel, pins


def test_split_stash_join_round_trip(parts: ModuleType, tmp_path: Path) -> None:
    wheel, pins = _wheel_and_pins(tmp_path)
    doc = parts.split(wheel, tmp_path / "carry", [1, 1, 1])
    assert [p["size"] for p in doc["parts"]] == [MIB, MIB, 12345]
    # each transfer carries one folder; the stage fills up over several calls
    staged = []
    for index in (1, 2, 3):
        transfer = tmp_path / f"transfer{index}"
        transfer.mkdir()
        (tmp_path / "carry" / str(index)).rename(transfer / str(index))
        staged = parts.stash(transfer, tmp_path / "stage")
        assert staged == list(range(1, index + 1))
    joined = parts.join(tmp_path / "stage", pins, "vllm-9.9.9", tmp_path / "dest")
    assert joined.read_bytes() == wheel.read_bytes()
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == [wheel.name]


def test_split_refuses_sizes_too_small(parts: ModuleType, tmp_path: Path) -> None:
    wheel, _ = _wheel_and_pins(tmp_path)
    with pytest.raises(SystemExit, match="add a transfer"):
        parts.split(wheel, tmp_path / "carry", [1, 1])


def test_missing_part_is_named_and_nothing_written(parts: ModuleType, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    wheel, pins = _wheel_and_pins(tmp_path)
    parts.split(wheel, tmp_path / "carry", [1, 1, 1])
    parts.stash(tmp_path / "carry", tmp_path / "stage")
    (tmp_path / "stage" / "part-2").unlink()
    with pytest.raises(SystemExit) as exc:
        parts.join(tmp_path / "stage", pins, "vllm-9.9.9", tmp_path / "dest")
    assert exc.value.code == parts.EXIT_MISSING
    assert "parts [2] of 3" in capsys.readouterr().err
    assert not (tmp_path / "dest").exists()


def test_part_damaged_in_transfer_is_refused_at_stash(parts: ModuleType, tmp_path: Path) -> None:
    wheel, _ = _wheel_and_pins(tmp_path)
    parts.split(wheel, tmp_path / "carry", [1, 1, 1])
    part = tmp_path / "carry" / "2" / "part"
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as exc:
        parts.stash(tmp_path / "carry", tmp_path / "stage")
    assert exc.value.code == parts.EXIT_MISMATCH
    assert not (tmp_path / "stage" / "part-2").exists()


def test_joined_file_not_the_pinned_one_is_not_installed(parts: ModuleType, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # parts consistent with each other (a wrong wheel split on purpose) but not the wheel the pin records
    wheel, pins = _wheel_and_pins(tmp_path)
    other = tmp_path / "other" / wheel.name
    other.parent.mkdir()
    other.write_bytes(os.urandom(wheel.stat().st_size))
    parts.split(other, tmp_path / "carry", [1, 1, 1])
    parts.stash(tmp_path / "carry", tmp_path / "stage")
    with pytest.raises(SystemExit) as exc:
        parts.join(tmp_path / "stage", pins, "vllm-9.9.9", tmp_path / "dest")
    assert exc.value.code == parts.EXIT_MISMATCH
    assert "not installed" in capsys.readouterr().err
    assert list((tmp_path / "dest").iterdir()) == []


def test_the_real_pin_names_a_wheel_and_sha(parts: ModuleType) -> None:
    name, sha = parts.pin_wheel(Path(__file__).resolve().parents[3] / "patches" / "pins.yaml", "vllm-0.21.0")
    assert name.startswith("vllm-0.21.0-") and name.endswith(".whl")
    assert len(sha) == 64


# --- bundles: a pin's torch stack (several wheels) as one stream of parts ---

def _wheels(tmp_path: Path) -> list[Path]:
    out = []
    for name, size in (("torch-9.9-cp312-cp312-manylinux_2_28_x86_64.whl", MIB + 7),
                       ("triton-9.9-cp312-cp312-manylinux_2_28_x86_64.whl", 3),
                       ("nvidia_nccl_cu13-9.9-py3-none-manylinux_2_18_x86_64.whl", MIB - 5)):
        f = tmp_path / "src" / name
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(os.urandom(size))
        out.append(f)
    return out


def test_bundle_round_trip_across_transfers(parts: ModuleType, tmp_path: Path) -> None:
    wheels = _wheels(tmp_path)
    doc = parts.bundle(wheels, tmp_path / "carry", [1, 1, 1])  # member boundaries fall inside parts
    assert [m["name"] for m in doc["members"]] == [w.name for w in wheels]
    assert not (tmp_path / "carry" / "bundle").exists()  # only the part folders travel
    for index in (1, 2, 3):
        transfer = tmp_path / f"t{index}"
        transfer.mkdir()
        (tmp_path / "carry" / str(index)).rename(transfer / str(index))
        parts.stash(transfer, tmp_path / "stage")
    written = parts.unbundle(tmp_path / "stage", tmp_path / "dest")
    assert [p.name for p in written] == [w.name for w in wheels]
    for w in wheels:
        assert (tmp_path / "dest" / w.name).read_bytes() == w.read_bytes()
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == sorted(w.name for w in wheels)


def test_unbundle_with_a_part_missing_writes_nothing(parts: ModuleType, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    parts.bundle(_wheels(tmp_path), tmp_path / "carry", [1, 1, 1])
    parts.stash(tmp_path / "carry", tmp_path / "stage")
    (tmp_path / "stage" / "part-2").unlink()
    with pytest.raises(SystemExit) as exc:
        parts.unbundle(tmp_path / "stage", tmp_path / "dest")
    assert exc.value.code == parts.EXIT_MISSING
    assert "parts [2] of 3" in capsys.readouterr().err
    assert not (tmp_path / "dest").exists()


def _doctor(stage: Path, change) -> None:  # type: ignore[no-untyped-def]
    index = stage / "parts.json"
    doc = json.loads(index.read_text())
    change(doc)
    index.write_text(json.dumps(doc))


@pytest.mark.parametrize("name", ["../evil.whl", "/abs/x.whl", "sub/x.whl", ".hidden.whl", "notawheel.sh"])
def test_a_member_name_never_becomes_a_path_outside_dest(parts: ModuleType, tmp_path: Path, name: str) -> None:
    parts.bundle(_wheels(tmp_path), tmp_path / "carry", [1, 1, 1])
    parts.stash(tmp_path / "carry", tmp_path / "stage")
    _doctor(tmp_path / "stage", lambda d: d["members"][0].__setitem__("name", name))
    with pytest.raises(SystemExit) as exc:
        parts.unbundle(tmp_path / "stage", tmp_path / "dest")
    assert exc.value.code == parts.EXIT_MISMATCH
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path / "evil.whl").exists()


def test_a_member_that_differs_from_its_sha256_leaves_no_file(parts: ModuleType, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    parts.bundle(_wheels(tmp_path), tmp_path / "carry", [1, 1, 1])
    parts.stash(tmp_path / "carry", tmp_path / "stage")
    _doctor(tmp_path / "stage", lambda d: d["members"][1].__setitem__("sha256", "0" * 64))
    with pytest.raises(SystemExit) as exc:
        parts.unbundle(tmp_path / "stage", tmp_path / "dest")
    assert exc.value.code == parts.EXIT_MISMATCH
    assert "triton-9.9" in capsys.readouterr().err
    assert list((tmp_path / "dest").iterdir()) == []  # not even the members before it


def test_a_plain_split_is_not_unbundled(parts: ModuleType, tmp_path: Path) -> None:
    wheel, _ = _wheel_and_pins(tmp_path)
    parts.split(wheel, tmp_path / "carry", [1, 1, 1])
    parts.stash(tmp_path / "carry", tmp_path / "stage")
    with pytest.raises(SystemExit) as exc:
        parts.unbundle(tmp_path / "stage", tmp_path / "dest")
    assert exc.value.code == 2


def test_bundle_refuses_duplicate_or_odd_names(parts: ModuleType, tmp_path: Path) -> None:
    wheels = _wheels(tmp_path)
    with pytest.raises(SystemExit, match="distinct wheel file names"):
        parts.bundle([wheels[0], wheels[0]], tmp_path / "carry", [2])
    odd = tmp_path / "src" / "setup.sh"
    odd.write_text("echo")
    with pytest.raises(SystemExit, match="distinct wheel file names"):
        parts.bundle([odd], tmp_path / "carry", [1])
