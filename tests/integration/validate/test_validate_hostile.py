"""Hostile wheels: each is refused by `validate` and by `overlay` (before anything is written), with the member
named. Without these refusals `overlay` would copy the bad member raw, write a fresh RECORD and label it g4."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from tests.support.hostile import SOUND_WHEEL_FILE, SYMLINK, hostile_wheel, tamper
from tests.support.wheelsfactory import PRISTINE, TAG, build_wheel, record_hash, run_g4build

from g4build.errors import ValidationError
from g4build.overlay.wheel import overlay_wheel, plan_overlay
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.wheel import ValidateOptions, validate_wheel

PIN = "vllm-0.21.0"


def _overlay(src: Path, out: Path) -> None:
    overlay_wheel(src, plan_overlay(load_pins().get(PIN), load_all()), out)


def _failed(wheel: Path) -> dict[str, str]:
    return {c.name: c.detail for c in validate_wheel(wheel, ValidateOptions()).failures()}


def test_appended_payload_on_a_member_copied_raw_is_refused(tmp_path: Path, project: Path) -> None:
    src = build_wheel(tmp_path / "in")
    tamper(src, "vllm/version.py", b"import os; os.system('id')\n")  # RECORD keeps the genuine hash
    assert "vllm/version.py: RECORD says" in _failed(src)["record"]
    with pytest.raises(ValidationError, match=r"refused to overlay.*vllm/version.py: RECORD says sha256="):
        _overlay(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_wrong_record_hash_on_a_patched_member_is_refused(tmp_path: Path, project: Path) -> None:
    row = f"vllm/spec/dflash.py,{record_hash(b'other')},{len(PRISTINE['vllm/spec/dflash.py'])}"
    src = build_wheel(tmp_path / "in", record_override={"vllm/spec/dflash.py": row})
    with pytest.raises(ValidationError, match=r"vllm/spec/dflash.py: RECORD says"):
        _overlay(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_overlay_of_a_tampered_wheel_exits_10_and_writes_nothing(tmp_path: Path, project: Path) -> None:
    src = build_wheel(tmp_path / "in")
    tamper(src, "vllm/__init__.py", b"\nprint('pwned')\n")
    out = tmp_path / "out"
    out.mkdir()
    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out))
    assert done.returncode == 10, done.stderr
    assert "vllm/__init__.py: RECORD says" in done.stderr and list(out.iterdir()) == []


@pytest.mark.parametrize("damage", ["not-a-zip", "truncated"])
def test_cli_overlay_of_an_unreadable_wheel_exits_10(tmp_path: Path, project: Path, damage: str) -> None:
    src = build_wheel(tmp_path / "in")
    data = src.read_bytes()
    src.write_bytes(b"<html>not found</html>" if damage == "not-a-zip" else data[: len(data) // 2])
    out = tmp_path / "out"
    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out), "--json")
    assert done.returncode == 10, done.stderr
    assert "not a readable wheel" in done.stderr and "unexpected" not in done.stderr
    assert json.loads(done.stdout)["exit_code"] == 10
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["manifest-folder", "out-is-a-file"])
def test_an_out_the_overlay_could_not_complete_is_refused_before_writing(
    tmp_path: Path, project: Path, where: str,
) -> None:
    src = build_wheel(tmp_path / "in")
    out = tmp_path / "out"
    if where == "out-is-a-file":
        out.write_bytes(b"x")
    else:
        (out / "build-manifest.json").mkdir(parents=True)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in out.parent.rglob("*") if "in" not in p.parts)
    done = run_g4build("overlay", str(src), "--pin", PIN, "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert "unexpected" not in done.stderr
    after = sorted(p.relative_to(tmp_path).as_posix() for p in out.parent.rglob("*") if "in" not in p.parts)
    assert after == before  # no wheel without its manifest, no staging folder left


DIST = "vllm-0.21.0.dist-info"
CASES = {
    "symlink": (dict(add={"vllm/link.py": b"/etc/passwd"}, attrs={"vllm/link.py": SYMLINK}),
                "members", "vllm/link.py: a symlink"),
    "tag": (dict(wheel_file=SOUND_WHEEL_FILE.replace(TAG.encode(), b"py3-none-any")),
            "members", f"{DIST}/WHEEL: Tag py3-none-any disagrees with the filename's {TAG}"),
    "no-wheel-file": (dict(wheel_file=None), "members", f"{DIST}/WHEEL is missing"),
    "wheel-version": (dict(wheel_file=SOUND_WHEEL_FILE.replace(b"1.0", b"9.0")),
                      "members", f"{DIST}/WHEEL: Wheel-Version '9.0', expected 1.x"),
    "case": (dict(add={"vllm/Evil.py": b"A = 1\n", "vllm/evil.py": b"B = 2\n"}),
             "members", "vllm/Evil.py and vllm/evil.py: differ only in case"),
    "device-file": (dict(add={"vllm/con.py": b"C = 1\n"}), "members", "vllm/con.py: 'con.py' is a Windows device"),
    "device-folder": (dict(add={"vllm/aux/x.py": b"C = 1\n"}), "members", "vllm/aux/x.py: 'aux' is a Windows device"),
    "stream": (dict(add={"vllm/x.py:stream": b"S = 1\n"}), "members", "vllm/x.py:stream: 'x.py:stream' has ':'"),
    "file-and-folder": (dict(add={"vllm/spec": b"F = 1\n"}), "members", "vllm/spec: is both a file and a folder"),
    "folder-entry-and-file": (dict(add={"vllm/tool": b"F = 1\n"}, folders=("vllm/tool/",)),
                              "members", "vllm/tool: is both a file and a folder"),
    # a second spelling of a patched file: pip writes 'vllm//spec/dflash.py' over vllm/spec/dflash.py
    "double-slash": (dict(add={"vllm//spec/dflash.py": b"print('evil')\n"}),
                     "members", "vllm//spec/dflash.py: empty or '.' path part"),
    "dot-part": (dict(add={"vllm/./spec/dflash.py": b"print('evil')\n"}),
                 "members", "vllm/./spec/dflash.py: empty or '.' path part"),
    "wheel-version-trailing-dot": (dict(wheel_file=SOUND_WHEEL_FILE.replace(b"1.0", b"1.")),
                                   "members", f"{DIST}/WHEEL: Wheel-Version '1.', expected 1.x"),
    "record-rows": (dict(extra_rows=[f"vllm/version.py,{record_hash(PRISTINE['vllm/version.py'].encode())},22"]),
                    "record", "vllm/version.py: listed twice in RECORD"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unsafe_or_uninstallable_wheel_is_refused_with_the_member_named(tmp_path: Path, project: Path,
                                                                        case: str) -> None:
    kwargs, check, why = CASES[case]
    src = hostile_wheel(tmp_path / "in", **kwargs)  # type: ignore[arg-type]
    failed = _failed(src)
    assert check in failed and why in failed[check], failed
    with pytest.raises(ValidationError, match="refused to overlay") as err:
        _overlay(src, tmp_path / "out")
    assert why in err.value.message
    assert not (tmp_path / "out").exists()


def test_the_sound_builder_wheel_passes_and_overlays(tmp_path: Path, project: Path) -> None:
    # the control for CASES: without the hostile change the same builder's wheel is accepted everywhere
    src = hostile_wheel(tmp_path / "in", add={"vllm/Good.py": b"G = 1\n", "vllm/con_fig.py": b"C = 1\n"},
                        folders=("vllm/",))
    assert _failed(src) == {}
    _overlay(src, tmp_path / "out")
    assert len(list((tmp_path / "out").glob("*.whl"))) == 1


def test_wheel_tags_may_refine_linux_to_manylinux_as_vllm_releases_do(tmp_path: Path, project: Path) -> None:
    # vLLM's registry wheel is named manylinux_2_24_x86_64 while its WHEEL says linux_x86_64
    src = hostile_wheel(tmp_path / "in", wheel_file=SOUND_WHEEL_FILE.replace(b"manylinux_2_24_x86_64", b"linux_x86_64"))
    assert _failed(src) == {}


def test_cli_validate_of_a_symlink_member_exits_10(tmp_path: Path, project: Path) -> None:
    src = hostile_wheel(tmp_path / "in", add={"vllm/link.py": b"../../etc"}, attrs={"vllm/link.py": SYMLINK})
    done = run_g4build("validate", str(src))
    assert done.returncode == 10 and "vllm/link.py: a symlink" in done.stdout + done.stderr


def test_record_signatures_beside_record_are_the_only_unlisted_members_allowed(tmp_path: Path,
                                                                              project: Path) -> None:
    for name in ("RECORD.jws", "RECORD.p7s"):
        wheel = build_wheel(tmp_path / name, extra_members={f"{DIST}/{name}": b"signature"})
        assert _failed(wheel) == {}, name
    for name in ("RECORD.sig", "RECORD.jws.bak", "vllm/RECORD.jws"):
        path = name if "/" in name else f"{DIST}/{name}"
        wheel = build_wheel(tmp_path / name.replace("/", "_"), extra_members={path: b"signature"})
        assert f"extra (in wheel, not in RECORD): {path}" in _failed(wheel)["record"], name


def test_symlink_member_written_by_zipfile_reads_as_a_link(tmp_path: Path) -> None:
    # the fixture itself: the mode bits are where installers look for a link
    src = hostile_wheel(tmp_path, add={"vllm/link.py": b"x"}, attrs={"vllm/link.py": SYMLINK})
    with zipfile.ZipFile(src) as zf:
        assert zf.getinfo("vllm/link.py").external_attr >> 28 == 0xA


def test_a_tampered_patched_member_is_refused_as_tampered_not_as_a_conflict_and_fetches_nothing(
    tmp_path: Path, project: Path,
) -> None:
    # the members are verified while the new wheel is written: a patch that fails on a tampered member must
    # still end in the members' refusal, and the three-way merge it falls back to (which fetches the pin's
    # sdist) must not run for a wheel its own RECORD refutes
    src = build_wheel(tmp_path / "in", tag="cp38-abi3-linux_x86_64")  # not the pin's file: verified member-wise
    with zipfile.ZipFile(src) as zf:
        items = [(info, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in items:  # RECORD keeps the genuine hash of the file the series patches
            zf.writestr(info, data.replace(b"return x + 7", b"return x - 7") if info.filename ==
                        "vllm/spec/dflash.py" else data)
    asked: list[tuple[str, ...]] = []

    def pristine(paths: object) -> dict[str, bytes]:
        asked.append(tuple(paths))  # type: ignore[arg-type]
        return {}

    plan = plan_overlay(load_pins().get(PIN), load_all(), pristine=pristine)
    with pytest.raises(ValidationError, match=r"refused to overlay.*vllm/spec/dflash.py: RECORD says"):
        overlay_wheel(src, plan, tmp_path / "out")
    assert asked == [] and not (tmp_path / "out").exists()
