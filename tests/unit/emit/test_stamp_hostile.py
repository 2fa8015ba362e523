"""The stamp (`g4build manifest`'s write into --out) under hostile or unlucky conditions, on real wheels and real
libraries: two wheels that would take one name are refused with nothing changed, two stamps of one --out take
turns, a planted ``<final>.whl.tmp`` link is never written through, SIGTERM mid-rewrite cleans up as Ctrl-C does,
a zip bomb and a WHEEL/METADATA that is not UTF-8 are clear errors, a library that cannot be read or binds a
forged version refuses the retag, and the manifest names the wheels after the retag. Nothing is written outside
--out and no wheel is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.elflibs import LIBM_C, MACHINE, OLD_C, SectionTable, compile_library, needing_version, needs_cc
from tests.support.wheelsfactory import build_wheel, run_g4build

import g4build
from g4build.emit.stamp import LOCK, stamp
from g4build.errors import BuildError, ValidationError
from g4build.pins.index import cache_lock

VERSION = "0.21.0+cu130.local"
MANIFEST = {"schema": 1, "series": [], "digest": "x"}
LOCK_FILE = LOCK + ".lock"


def _wheel(out: Path, lib: bytes | None = None, *, tag: str = f"cp312-cp312-linux_{MACHINE}",
           extra: dict[str, str | bytes] | None = None, members: dict[str, bytes] | None = None) -> Path:
    files: dict[str, str | bytes] = {"vllm/__init__.py": "", **({"vllm/_C.abi3.so": lib} if lib else {}),
                                     **(extra or {})}
    return build_wheel(out, files, version=VERSION, tag=tag, extra_members=members)


def _state(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != LOCK_FILE}


def _final(tag: str) -> str:
    return f"vllm-{VERSION}-{tag}.whl"


@pytest.fixture
def old_lib(tmp_path: Path) -> bytes:
    if sys.platform != "linux":
        pytest.skip("needs a C compiler on Linux")
    return compile_library(tmp_path / "libs", "libold.so", OLD_C).read_bytes()


@needs_cc
def test_the_manifest_names_the_wheels_after_the_retag(tmp_path: Path, old_lib: bytes) -> None:
    out = tmp_path / "out"
    before = _wheel(out, old_lib)
    names = stamp(out, MANIFEST, version=VERSION, retag=True)
    final = _final(f"cp312-cp312-manylinux_2_17_{MACHINE}")
    assert names == [final] and not before.exists()
    beside = json.loads((out / "build-manifest.json").read_text())
    with zipfile.ZipFile(out / final) as zf:
        inside = json.loads(zf.read(f"vllm-{VERSION}.dist-info/build-manifest.json"))
    assert beside["wheels"] == inside["wheels"] == [final] and list(beside["tags"]) == [final]


@needs_cc
def test_two_fresh_wheels_that_take_one_name_are_refused_with_nothing_changed(tmp_path: Path, old_lib: bytes) -> None:
    out = tmp_path / "out"
    _wheel(out, old_lib)  # linux_x86_64 and manylinux_2_5: both become manylinux_2_17
    _wheel(out, old_lib, tag=f"cp312-cp312-manylinux_2_5_{MACHINE}", extra={"vllm/other.py": "X = 2\n"})
    before = _state(out)
    with pytest.raises(BuildError, match="would all become") as caught:
        stamp(out, MANIFEST, version=VERSION, retag=True)
    assert caught.value.exit_code == 9 and "\n" not in caught.value.message
    assert _state(out) == before


@needs_cc
def test_a_wheel_at_another_ones_final_name_is_not_overwritten(tmp_path: Path, old_lib: bytes) -> None:
    """The data loss of issue 53: B sits at the name A's retag gives, but B's own libraries say another tag; the
    rewrite of A would destroy B before B is stamped, and B's content would then carry A's tag."""
    out = tmp_path / "out"
    libm = compile_library(tmp_path / "libs", "libm_user.so", LIBM_C, args=("-lm",)).read_bytes()
    _wheel(out, old_lib)
    _wheel(out, libm, tag=f"cp312-cp312-manylinux_2_17_{MACHINE}")  # needs 2.31: becomes manylinux_2_31
    before = _state(out)
    with pytest.raises(BuildError, match="would all become"):
        stamp(out, MANIFEST, version=VERSION, retag=True)
    assert _state(out) == before


@needs_cc
def test_an_earlier_runs_output_is_replaced_by_the_fresh_build(tmp_path: Path, old_lib: bytes) -> None:
    out = tmp_path / "out"
    _wheel(out, old_lib)
    stamp(out, MANIFEST, version=VERSION, retag=True)
    _wheel(out, old_lib, extra={"vllm/new.py": "NEW = 1\n"})  # the next build writes its wheel beside it
    final = _final(f"cp312-cp312-manylinux_2_17_{MACHINE}")
    assert stamp(out, MANIFEST, version=VERSION, retag=True) == [final]
    assert sorted(_state(out)) == ["build-manifest.json", final]
    with zipfile.ZipFile(out / final) as zf:
        assert "vllm/new.py" in zf.namelist()


def _stamp_in_child(out: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    code = ("import sys; from pathlib import Path; from g4build.emit.stamp import stamp; "
            f"stamp(Path(sys.argv[1]), {MANIFEST!r}, version={VERSION!r}, retag=True)")
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    full = {**os.environ, "PYTHONPATH": toolkit, **(env or {})}
    return subprocess.Popen([sys.executable, "-c", code, str(out)], env=full, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@needs_cc
def test_two_stamps_of_one_out_take_turns(tmp_path: Path, old_lib: bytes) -> None:
    out = tmp_path / "out"
    _wheel(out, old_lib, extra={f"vllm/m{i}.py": f"X = {i}\n" * 50 for i in range(1500)})
    runs = [_stamp_in_child(out), _stamp_in_child(out)]
    results = [(r.wait(timeout=300), r.stderr.read() if r.stderr else "") for r in runs]
    assert all(code == 0 for code, _ in results), results  # never "FileNotFoundError"
    final = _final(f"cp312-cp312-manylinux_2_17_{MACHINE}")
    assert sorted(_state(out)) == ["build-manifest.json", final]
    assert json.loads((out / "build-manifest.json").read_text())["wheels"] == [final]


@needs_cc
def test_a_stamp_waits_for_the_lock_and_says_so_when_it_times_out(tmp_path: Path, old_lib: bytes,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    _wheel(out, old_lib)
    before = _state(out)
    monkeypatch.setenv("G4BUILD_LOCK_TIMEOUT", "1")
    with cache_lock(out / LOCK):
        child = _stamp_in_child(out, {"G4BUILD_LOCK_TIMEOUT": "1"})
        assert child.wait(timeout=120) == 1
        assert "LockTimeoutError" in (child.stderr.read() if child.stderr else "")
    assert _state(out) == before


@needs_cc
def test_a_planted_tmp_link_is_never_written_through(tmp_path: Path, old_lib: bytes) -> None:
    out = tmp_path / "out"
    _wheel(out, old_lib)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    final = _final(f"cp312-cp312-manylinux_2_17_{MACHINE}")
    for planted in (f"{final}.tmp", f".{final}.tmp"):  # the old fixed name, and one like the new ones
        (out / planted).symlink_to(victim)
    stamp(out, MANIFEST, version=VERSION, retag=True)
    assert victim.read_text() == "keep me\n"
    assert all((out / p).is_symlink() for p in (f"{final}.tmp", f".{final}.tmp"))
    assert zipfile.is_zipfile(out / final)


@needs_cc
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_mid_rewrite_leaves_the_wheel_and_no_temporary_file(tmp_path: Path, old_lib: bytes,
                                                                      signal_name: str) -> None:
    out = tmp_path / "out"
    _wheel(out, old_lib)
    before = _state(out)
    child = _stamp_in_child(out, {"G4BUILD_FAULT": f"stamp-mid-rewrite:{signal_name}"})
    assert child.wait(timeout=120) != 0
    assert _state(out) == before  # the wheel as it was; no .tmp copy, no manifest
    assert [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != LOCK_FILE] == []


@needs_cc
@pytest.mark.parametrize("retag", [True, False])
def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path: Path, retag: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    wheel = out / f"vllm-{VERSION}-cp312-cp312-linux_{MACHINE}.whl"
    dist = f"vllm-{VERSION}.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n")
        zf.writestr(f"{dist}/WHEEL", f"Wheel-Version: 1.0\nTag: cp312-cp312-linux_{MACHINE}\n")
        zf.writestr(f"{dist}/RECORD", "")
        with zf.open("vllm/_C.abi3.so", "w") as member:  # 64 MiB of zeros: about 1000:1
            block = b"\x7fELF" + bytes((1 << 20) - 4)
            for _ in range(64):
                member.write(block)
    before = _state(out)
    with pytest.raises(ValidationError, match="zip bomb") as caught:
        stamp(out, MANIFEST, version=VERSION, retag=retag)
    assert caught.value.exit_code == 10
    assert _state(out) == before and sorted(p.name for p in out.iterdir()) == [LOCK_FILE, wheel.name]


@pytest.mark.parametrize("member", ["WHEEL", "METADATA"])
def test_a_dist_info_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path, member: str) -> None:
    out = tmp_path / "out"
    raw = {"WHEEL": b"Wheel-Version: 1.0\nTag: cp312-cp312-linux_x86_64\nGenerator: b\xe4d\n",
           "METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.21.0+cu130.local\nSummary: \xff\n"}[member]
    _wheel(out, members={f"vllm-{VERSION}.dist-info/{member}": raw})
    before = _state(out)
    with pytest.raises(BuildError, match=f"{member} is not UTF-8") as caught:
        stamp(out, MANIFEST, version=VERSION, requires={"transformers": ">=4.56"}, retag=True)
    assert caught.value.exit_code == 9 and _state(out) == before


@needs_cc
def test_a_vendored_packages_dist_info_does_not_refuse_a_good_wheel(tmp_path: Path, old_lib: bytes) -> None:
    out = tmp_path / "out"
    vendored = "vllm/third_party/triton_kernels-1.0.dist-info"
    _wheel(out, old_lib, extra={f"{vendored}/METADATA": "Metadata-Version: 2.1\nName: triton_kernels\n"
                                                       "Version: 1.0\n",
                                f"{vendored}/RECORD": f"{vendored}/METADATA,,\n{vendored}/RECORD,,\n",
                                f"{vendored}/WHEEL": "Wheel-Version: 1.0\nTag: py3-none-any\n"})
    final = _final(f"cp312-cp312-manylinux_2_17_{MACHINE}")
    assert stamp(out, MANIFEST, version=VERSION, retag=True) == [final]
    with zipfile.ZipFile(out / final) as zf:
        assert f"vllm-{VERSION}.dist-info/build-manifest.json" in zf.namelist()
        assert f"{vendored}/build-manifest.json" not in zf.namelist()
        assert zf.read(f"{vendored}/WHEEL").endswith(b"py3-none-any\n")


@needs_cc
@pytest.mark.parametrize("case", ["unreadable", "forged"])
def test_a_library_without_a_trustworthy_tag_refuses_the_retag(tmp_path: Path, case: str) -> None:
    out = tmp_path / "out"
    if case == "forged":
        lib = needing_version(tmp_path / "libs", "GLIBC_999.99").read_bytes()
    else:
        data = bytearray(compile_library(tmp_path / "libs", "libm_user.so", LIBM_C, args=("-lm",)).read_bytes())
        table = SectionTable(data)
        table.put(table.sections()[table.verneed().link], "size", 2**64 - 1)
        lib = bytes(data)
    _wheel(out, lib)
    before = _state(out)
    with pytest.raises(BuildError, match="cannot tag it") as caught:
        stamp(out, MANIFEST, version=VERSION, retag=True)
    assert caught.value.exit_code == 9 and "\n" not in caught.value.message
    assert ("GLIBC_999.99" if case == "forged" else "claims bytes") in caught.value.message
    assert _state(out) == before and "manylinux_999" not in str(sorted(out.iterdir()))


@needs_cc
def test_nothing_is_written_outside_out(tmp_path: Path, old_lib: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    # a temporary folder that does not exist: any scratch file the stamp put outside --out fails it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-tmpdir"))
    out = tmp_path / "out"
    _wheel(out, old_lib)
    stamp(out, MANIFEST, version=VERSION, retag=True)
    assert not (tmp_path / "no-tmpdir").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([LOCK_FILE, "build-manifest.json",
                                                            _final(f"cp312-cp312-manylinux_2_17_{MACHINE}")])


@needs_cc
@pytest.mark.parametrize(("case", "code", "says"), [
    ("collision", 9, "would all become"), ("forged", 9, "GLIBC_999.99"), ("not-utf8", 9, "WHEEL is not UTF-8"),
])
def test_g4build_manifest_fails_closed_with_one_line_and_its_exit_code(tmp_path: Path, old_lib: bytes, case: str,
                                                                      code: int, says: str) -> None:
    out = tmp_path / "out"
    if case == "collision":
        _wheel(out, old_lib)
        _wheel(out, old_lib, tag=f"cp312-cp312-manylinux_2_5_{MACHINE}")
    elif case == "forged":
        _wheel(out, needing_version(tmp_path / "libs", "GLIBC_999.99").read_bytes())
    else:
        _wheel(out, old_lib, members={f"vllm-{VERSION}.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: \xff\n"})
    before = _state(out)
    done = run_g4build("manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--os", "linux")
    assert done.returncode == code, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and says in errors[0] and "Traceback" not in done.stderr
    assert _state(out) == before
