"""`g4build validate` on small real wheels: what passes, and each way a wheel fails."""

from __future__ import annotations

import json
import os
import socket
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, build_wheel, container, elf, entry, pe, record_hash, run_g4build

from g4build.errors import ValidationError
from g4build.validate.wheel import ValidateOptions, validate_wheel


def _checks(wheel: Path, **kw: object) -> dict[str, tuple[bool, str]]:
    report = validate_wheel(wheel, ValidateOptions(**kw))  # type: ignore[arg-type]
    return {c.name: (c.ok, c.detail) for c in report.checks}


def test_a_sound_wheel_passes_every_check(small_wheel: Path, project: Path) -> None:
    checks = _checks(small_wheel, pin="vllm-0.21.0")
    assert set(checks) == {"filename", "metadata", "record", "members", "series", "tags"}
    assert all(ok for ok, _ in checks.values()), checks
    assert "no build-manifest.json" in checks["series"][1]


def test_corrupted_record_hash_fails(tmp_path: Path, project: Path) -> None:
    bad = "vllm/spec/utils.py," + record_hash(b"something else") + f",{len(PRISTINE['vllm/spec/utils.py'])}"
    wheel = build_wheel(tmp_path, record_override={"vllm/spec/utils.py": bad})
    ok, detail = _checks(wheel)["record"]
    assert not ok and "vllm/spec/utils.py: RECORD says sha256=" in detail


def test_missing_and_extra_files_fail(tmp_path: Path, project: Path) -> None:
    listed_only = build_wheel(tmp_path / "a", record_override={"vllm/ghost.py": "vllm/ghost.py,sha256=AAAA,4"})
    ok, detail = _checks(listed_only)["record"]
    assert not ok and "missing (in RECORD, not in wheel): vllm/ghost.py" in detail
    unlisted = build_wheel(tmp_path / "b", extra_members={"vllm/stowaway.py": b"X = 1\n"})
    ok, detail = _checks(unlisted)["record"]
    assert not ok and "extra (in wheel, not in RECORD): vllm/stowaway.py" in detail


def test_paths_outside_the_install_folder_fail_even_when_recorded(tmp_path: Path, project: Path) -> None:
    wheel = build_wheel(tmp_path, {**PRISTINE, "../evil.py": "X = 1\n", "vllm\\win.py": "Y = 2\n"})
    ok, detail = _checks(wheel)["record"]
    why = "unsafe path (absolute, '..' or '\\'; an installer would write outside site-packages)"
    assert not ok and f"{why}: ../evil.py" in detail and f"{why}: vllm\\win.py" in detail


def test_a_member_stored_twice_fails(small_wheel: Path, project: Path) -> None:
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(small_wheel, "a") as zf:
        zf.writestr("vllm/version.py", PRISTINE["vllm/version.py"])  # same bytes: RECORD alone cannot tell
    ok, detail = _checks(small_wheel)["record"]
    assert not ok and detail == "stored twice (one copy shadows the other): vllm/version.py"


def test_member_with_bad_crc_fails(small_wheel: Path, project: Path) -> None:
    data = bytearray(small_wheel.read_bytes())
    with zipfile.ZipFile(small_wheel) as zf:
        info = zf.getinfo("vllm/spec/dflash.py")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 5
    data[at] ^= 0xFF
    small_wheel.write_bytes(bytes(data))
    ok, detail = _checks(small_wheel)["record"]
    assert not ok and "vllm/spec/dflash.py" in detail


def test_metadata_version_mismatch_and_pin(tmp_path: Path, project: Path) -> None:
    wheel = build_wheel(tmp_path, version="0.33.0")
    ok, detail = _checks(wheel, pin="vllm-0.21.0")["metadata"]
    assert not ok and "version 0.33.0 is not the pin's 0.21.0" in detail
    renamed = wheel.with_name(wheel.name.replace("0.33.0", "0.33.1"))
    wheel.rename(renamed)
    ok, detail = _checks(renamed)["metadata"]
    assert not ok and "METADATA Version 0.33.0 is not the filename's 0.33.1" in detail


def test_unsupported_tags_fail(tmp_path: Path, project: Path) -> None:
    wheel = build_wheel(tmp_path, tag="cp312-cp312-macosx_11_0_arm64")
    ok, detail = _checks(wheel)["filename"]
    assert not ok and "macosx_11_0_arm64" in detail


def test_cli_table_prints_member_names_as_text(tmp_path: Path, project: Path) -> None:
    # Member names are the wheel author's text; one that looks like rich markup must not be interpreted.
    bad = build_wheel(tmp_path, extra_members={"vllm/[/x][bold]odd.py": b"X = 1\n"})
    done = run_g4build("validate", str(bad))
    assert "Traceback" not in done.stderr and done.returncode == ValidationError.exit_code, done.stderr
    assert "extra (in wheel, not in RECORD): vllm/[/x][bold]odd.py" in done.stdout


def test_cli_json_shape_and_exit_code(tmp_path: Path, small_wheel: Path, project: Path) -> None:
    bad = build_wheel(tmp_path / "bad", extra_members={"vllm/stowaway.py": b"X = 1\n"})
    done = run_g4build("validate", str(small_wheel), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # one wheel or two: the same object, a list of reports and the overall verdict
    assert set(out) == {"wheels", "ok"} and out["ok"] is True
    (report,) = out["wheels"]
    assert set(report) == {"wheel", "checks", "archs", "ok"} and report["ok"] is True
    assert {"name", "ok", "detail"} == set(report["checks"][0])
    done = run_g4build("validate", str(small_wheel), str(bad), "--json")
    assert done.returncode == 10
    out = json.loads(done.stdout)
    assert set(out) == {"wheels", "ok"} and out["ok"] is False
    assert [r["ok"] for r in out["wheels"]] == [True, False]
    assert "1 of 2 wheel(s) failed validation" in done.stderr and "record" in done.stderr


def test_smoke_installs_and_imports(tmp_path: Path, small_wheel: Path, project: Path) -> None:
    ok, detail = _checks(small_wheel, smoke=True)["smoke"]
    assert ok, detail
    broken = build_wheel(tmp_path / "broken", {**PRISTINE, "vllm/__init__.py": "import vllm.nowhere\n"})
    ok, detail = _checks(broken, smoke=True)["smoke"]
    assert not ok and "ModuleNotFoundError" in detail


@pytest.mark.parametrize("arch", ["sm_12x", "volta"])
def test_bad_arch_is_a_usage_error(small_wheel: Path, project: Path, arch: str) -> None:
    done = run_g4build("validate", str(small_wheel), "--arch", arch)
    assert done.returncode == 2 and "not a GPU arch" in done.stderr


def test_archs_of_elf_and_pe_libraries_and_a_malformed_fatbin(tmp_path: Path, project: Path) -> None:
    good = elf({".nv_fatbin": container(entry(2, 120, b"cubin"), entry(1, 90, b"ptx"))})
    windows = pe({b".nv_fatb": container(entry(2, 80, b"cubin"), entry(1, 80, b"ptx"))})
    broken = elf({".nv_fatbin": container(entry(2, 120, b"cubin"))[:-3]})
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": good, "vllm/_fa2.pyd": windows,
                                   "vllm/_broken.so": broken, "vllm/plain.so": elf({".text": b"\x90"})})
    done = run_g4build("validate", str(wheel), "--arch", "sm120", "--no-cuobjdump", "--json")
    assert done.returncode == 10, done.stderr
    (out,) = json.loads(done.stdout)["wheels"]
    checks = {c["name"]: c for c in out["checks"]}
    assert checks["record"]["ok"] and checks["arch sm_120 vllm/_C.abi3.so"]["ok"]
    assert checks["arch sm_120 vllm/_fa2.pyd"]["detail"].startswith("PTX-only for sm_120")
    assert not checks["fatbin vllm/_broken.so"]["ok"] and "claims" in checks["fatbin vllm/_broken.so"]["detail"]
    libs = {a["file"]: a for a in out["archs"]}
    assert libs["vllm/_C.abi3.so"] == {"file": "vllm/_C.abi3.so", "fatbins": 1, "sass": ["sm_120"],
                                       "ptx": ["compute_90"], "verdicts": {"sm_120": "sass"}}
    assert libs["vllm/plain.so"]["fatbins"] == 0 and "arch sm_120 vllm/plain.so" not in checks


def test_verdict_line_native_unused_and_missing(tmp_path: Path, project: Path) -> None:
    native = elf({".nv_fatbin": container(entry(2, 120, b"cubin"))})
    hopper_only = elf({".nv_fatbin": container(entry(2, 90, b"cubin"))})
    # a wheel whose libraries are native on sm_120, with an FA3 library vLLM only uses on Hopper
    ok_wheel = build_wheel(tmp_path / "ok", {**PRISTINE, "vllm/_C.abi3.so": native,
                                             "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": hopper_only})
    done = run_g4build("validate", str(ok_wheel), "--arch", "sm120", "--no-cuobjdump", "--trust-fatbin", "--json")
    assert done.returncode == 0, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["wheels"][0]["checks"]}
    assert checks["verdict sm_120"]["ok"]
    assert checks["verdict sm_120"]["detail"].startswith("runs natively on sm_120")
    assert "not used on sm_120: _vllm_fa3_C.abi3.so" in checks["verdict sm_120"]["detail"]
    # the same Hopper-only code in a library vLLM does use on sm_120 is a failure: no kernel image
    bad_wheel = build_wheel(tmp_path / "bad", {**PRISTINE, "vllm/_C.abi3.so": native,
                                               "vllm/_moe_C.abi3.so": hopper_only})
    done = run_g4build("validate", str(bad_wheel), "--arch", "sm120", "--no-cuobjdump", "--json")
    assert done.returncode == 10
    checks = {c["name"]: c for c in json.loads(done.stdout)["wheels"][0]["checks"]}
    assert not checks["arch sm_120 vllm/_moe_C.abi3.so"]["ok"]
    assert "1 have no code for it (_moe_C.abi3.so" in checks["verdict sm_120"]["detail"]


CUTE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_flash_attn_f5bc33c" / "flash_attn" / "cute"
CUTE_DIR = "vllm/vllm_flash_attn/cute/"


def _rewrite(data: bytes) -> bytes:
    """What vLLM's install rule does to each copied file (string(REPLACE ...) in vllm_flash_attn.cmake)."""
    return data.replace(b"flash_attn.cute", b"vllm.vllm_flash_attn.cute")


def test_fa4_cute_files_must_carry_vllms_rewritten_imports(tmp_path: Path, project: Path) -> None:
    py = sorted(f for f in CUTE.iterdir() if f.suffix == ".py")
    copied = {CUTE_DIR + f.name: _rewrite(f.read_bytes()) for f in py}  # vLLM's copy: *.py, rewritten
    checks = _checks(build_wheel(tmp_path / "copied", {**PRISTINE, **copied}))
    assert checks["fa4-cute"] == (True, "4 FlashAttention 4 files, imports rewritten to vllm.vllm_flash_attn.cute")
    assert all(ok for ok, _ in checks.values()), checks
    # the folder as a symlink to the source: setuptools stores the source's files (all of them) as they are
    linked = {CUTE_DIR + f.name: f.read_bytes() for f in CUTE.iterdir()}
    checks = _checks(build_wheel(tmp_path / "linked", {**PRISTINE, **linked}))
    assert checks["members"][0] and checks["record"][0]  # regular files: nothing else catches it
    ok, detail = checks["fa4-cute"]
    assert not ok and detail.startswith(f"2 of 4 FlashAttention 4 files under {CUTE_DIR} still import "
                                        "flash_attn.cute: __init__.py, flash_fwd_sm120.py (2 non-Python files")
    assert "Build without VLLM_FLASH_ATTN_SRC_DIR" in detail
    # the rewrite run on files rewritten before (a source copy written through such a link)
    twice = {name: _rewrite(data) for name, data in copied.items()}
    ok, detail = _checks(build_wheel(tmp_path / "twice", {**PRISTINE, **twice}))["fa4-cute"]
    assert not ok and "2 FlashAttention 4 files import vllm.vllm_vllm.vllm_flash_attn.cute: __init__.py" in detail


@pytest.mark.skipif(os.name == "nt" or os.geteuid() == 0, reason="a file its owner cannot read: POSIX, not root")
def test_cli_json_reports_every_wheel_when_the_first_cannot_be_read(
    tmp_path: Path, small_wheel: Path, project: Path
) -> None:
    first = tmp_path / "first" / small_wheel.name
    first.parent.mkdir()
    first.write_bytes(small_wheel.read_bytes())
    first.chmod(0)
    _json_reports_every_wheel(first, small_wheel, "Permission denied")


@pytest.mark.skipif(os.name == "nt", reason="a Unix socket")
def test_cli_json_reports_every_wheel_when_the_first_cannot_be_opened(
    tmp_path: Path, small_wheel: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket under a wheel's name: it exists and is no folder, and opening it fails (for root too)."""
    (tmp_path / "first").mkdir()
    monkeypatch.chdir(tmp_path / "first")  # a short relative name: socket paths are limited to ~100 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(small_wheel.name)
        _json_reports_every_wheel(tmp_path / "first" / small_wheel.name, small_wheel, "cannot be read")


def test_cli_json_reports_every_wheel_when_the_first_is_not_a_zip(
    tmp_path: Path, small_wheel: Path, project: Path
) -> None:
    first = tmp_path / "first" / small_wheel.name
    first.parent.mkdir()
    first.write_bytes(small_wheel.read_bytes()[:100])  # cut short in transfer
    _json_reports_every_wheel(first, small_wheel, "not a readable zip")


def _json_reports_every_wheel(first: Path, good: Path, why: str) -> None:
    done = run_g4build("validate", str(first), str(good), "--json")
    assert done.returncode == 10, done.stderr
    out = json.loads(done.stdout)  # one document: the wheels' reports, not an error object
    assert set(out) == {"wheels", "ok"} and out["ok"] is False
    bad, fine = out["wheels"]
    assert (bad["wheel"], bad["ok"], fine["wheel"], fine["ok"]) == (str(first), False, str(good), True)
    (check,) = bad["checks"]
    assert check["name"] == "readable" and str(first) in check["detail"] and why in check["detail"]
    assert "1 of 2 wheel(s) failed validation" in done.stderr and "readable" in done.stderr
