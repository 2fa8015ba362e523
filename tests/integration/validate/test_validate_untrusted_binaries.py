"""A wheel's native libraries are upstream material: truncated or lying ELF and PE headers (a section table of
2^40 entries, sections past the end), emptied libraries and docker-save images whose documents are links or of
the wrong shape each end in a failing check or a clear error with its exit code, never a traceback or an
allocation the file does not back; and an arch asked of a wheel whose CUDA code is unreadable fails."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import struct
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, build_wheel, container, elf, entry, pe, run_g4build

from g4build.errors import ImageError
from g4build.image.sources import open_image
from g4build.validate.fatbin import Arch, FatbinFormatError, read_library_archs
from g4build.validate.wheel import ValidateOptions, validate_wheel

GOOD_ELF = elf({".nv_fatbin": container(entry(2, 120, b"cubin"))})
GOOD_PE = pe({b".nv_fatb": container(entry(2, 120, b"cubin"))})
SM120 = (Arch.parse("sm120"),)


def _elf_with(shoff: int | None = None, shentsize: int | None = None, shnum: int | None = None,
              size0: int | None = None, section_off: int | None = None, section_size: int | None = None) -> bytes:
    """GOOD_ELF with one header field changed (offsets of the ELF64 header and of its first real section)."""
    data = bytearray(GOOD_ELF)
    (real_shoff,) = struct.unpack_from("<Q", data, 0x28)
    if shoff is not None:
        struct.pack_into("<Q", data, 0x28, shoff)
    if shentsize is not None:
        struct.pack_into("<H", data, 0x3A, shentsize)
    if shnum is not None:
        struct.pack_into("<H", data, 0x3C, shnum)
    if size0 is not None:  # extended numbering: section 0's size holds the count
        struct.pack_into("<Q", data, real_shoff + 32, size0)
    if section_off is not None:
        struct.pack_into("<Q", data, real_shoff + 64 + 24, section_off)
    if section_size is not None:
        struct.pack_into("<Q", data, real_shoff + 64 + 32, section_size)
    return bytes(data)


def _pe_with(pe_offset: int | None = None, nsections: int | None = None, raw_ptr: int | None = None) -> bytes:
    data = bytearray(GOOD_PE)
    if pe_offset is not None:
        struct.pack_into("<I", data, 0x3C, pe_offset)
    if nsections is not None:
        struct.pack_into("<H", data, 0x40 + 6, nsections)
    if raw_ptr is not None:
        struct.pack_into("<I", data, 0x40 + 24 + 20, raw_ptr)
    return bytes(data)


BROKEN = {
    "ELF cut after 5 bytes": GOOD_ELF[:5],
    "ELF cut inside its header": GOOD_ELF[:0x30],
    "ELF cut inside the section table": GOOD_ELF[:-10],
    "ELF section table of 2^40 entries (extended numbering)": _elf_with(shnum=0, size0=1 << 40),
    "ELF section table of 2^40 entries, zero-byte entries": _elf_with(shnum=0, size0=1 << 40, shentsize=0),
    "ELF section table past the end": _elf_with(shoff=1 << 40),
    "ELF section past the end": _elf_with(section_off=1 << 40),
    "ELF section of 2^60 bytes": _elf_with(section_size=1 << 60),
    "PE cut after the MZ": GOOD_PE[:2],
    "PE cut inside the DOS header": GOOD_PE[:0x30],
    "PE signature offset past the end": _pe_with(pe_offset=1 << 31),
    "PE of 65535 sections": _pe_with(nsections=0xFFFF),
    "PE section data past the end": _pe_with(raw_ptr=1 << 31),
    "PE cut inside the section table": GOOD_PE[:0x40 + 24 + 20],
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_malformed_library_is_a_format_error_with_bounded_memory(case: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(FatbinFormatError):
            read_library_archs(BROKEN[case], "lib.so")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{case}: {peak} bytes at the peak"


def test_the_sound_libraries_still_read() -> None:
    assert read_library_archs(GOOD_ELF, "a.so").names("sass") == ["sm_120"]
    assert read_library_archs(GOOD_PE, "a.pyd").names("sass") == ["sm_120"]


def test_validate_reports_each_malformed_library_and_exits_10(tmp_path: Path) -> None:
    members = {f"vllm/_b{n}.so": data for n, data in enumerate(BROKEN[c] for c in sorted(BROKEN))}
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": GOOD_ELF, **members})
    done = run_g4build("validate", str(wheel), "--arch", "sm120", "--no-cuobjdump", "--json")
    assert done.returncode == 10, done.stderr
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr.lower()
    checks = {c["name"]: c for c in json.loads(done.stdout)["wheels"][0]["checks"]}
    assert all(not checks[f"fatbin {name}"]["ok"] for name in members)
    assert checks["arch sm_120 vllm/_C.abi3.so"]["ok"]


@pytest.mark.parametrize("emptied", [b"", b"\x7f", b"\x7fEL", b"not a library at all"])
def test_an_emptied_library_fails_the_arch_check(tmp_path: Path, emptied: bytes) -> None:
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": emptied, "vllm/_moe_C.abi3.so": emptied})
    report = validate_wheel(wheel, ValidateOptions(archs=SM120))
    failed = {c.name: c.detail for c in report.failures()}
    assert "verdict sm_120" in failed and "no code for sm_120" in failed["verdict sm_120"]
    assert "fatbin vllm/_C.abi3.so" in failed and "expected an ELF or PE library" in failed["fatbin vllm/_C.abi3.so"]
    assert {c.name for c in report.checks if c.ok} >= {"record"}  # the wheel itself is consistent
    # without --arch nothing is asked about GPU code: the same wheel passes
    assert validate_wheel(wheel, ValidateOptions()).ok


def test_a_wheel_without_any_fatbin_fails_an_arch_check(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": elf({".text": b"\x90"})})
    failed = {c.name: c.detail for c in validate_wheel(wheel, ValidateOptions(archs=SM120)).failures()}
    assert "no library in it carries a fatbin" in failed["verdict sm_120"]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.mark.heavy
def test_the_real_wheel_with_every_library_emptied_fails_sm120(tmp_path: Path) -> None:
    from g4build.pins.index import cache_root, fetch_verified
    from g4build.pins.model import load_pins

    ref = load_pins().get("vllm-0.21.0").wheels["manylinux_x86_64"]
    real = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    out = tmp_path / real.name
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        rows: list[list[str]] = []
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename == record:
                continue
            data = b"" if ".so" in info.filename.rsplit("/", 1)[-1] else src.read(info)
            dst.writestr(info.filename, data)
            rows.append([info.filename, _record_hash(data), str(len(data))])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, [record, "", ""]])
        dst.writestr(record, text.getvalue())
    report = validate_wheel(out, ValidateOptions(archs=SM120))
    failed = {c.name: c.detail for c in report.failures()}
    assert "verdict sm_120" in failed and "record" not in failed
    assert "fatbin vllm/_C.abi3.so" in failed


# --- image extract: docker-save archives whose documents are links or of the wrong shape ---------------------


def _docker_save(path: Path, members: list[tuple[str, bytes | None, str | None]]) -> Path:
    """A tarball of (name, data, link target) members: data for a file, a target for a symlink."""
    with tarfile.open(path, "w") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                assert data is not None
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


CONFIG = b'{"os": "linux", "architecture": "amd64"}'
CONFIG_ID = hashlib.sha256(CONFIG).hexdigest()
IMAGES: dict[str, list[tuple[str, bytes | None, str | None]]] = {
    "manifest.json a link to nothing": [("manifest.json", None, "missing.json")],
    "manifest.json a loop of links": [("manifest.json", None, "a.json"), ("a.json", None, "manifest.json")],
    "the config a link to nothing": [
        ("manifest.json", json.dumps([{"Config": f"{CONFIG_ID}.json", "Layers": []}]).encode(), None),
        (f"{CONFIG_ID}.json", None, "nowhere"),
    ],
    "two images, one entry a number": [("manifest.json", b'[{"RepoTags": ["a"]}, 5]', None)],
    "two images with tags of the wrong type": [("manifest.json", b'[{"RepoTags": 5}, {"RepoTags": [1]}]', None)],
    "a manifest nested past the recursion limit": [("manifest.json", b"[" * 100000 + b"]" * 100000, None)],
    "an index whose manifests are numbers": [("index.json", b'{"manifests": [1, 2]}', None)],
    "an index whose manifest names a list digest": [("index.json", b'{"manifests": [{"digest": ["x"]}]}', None)],
}


@pytest.mark.parametrize("case", sorted(IMAGES))
def test_a_hostile_image_archive_is_an_image_error(tmp_path: Path, case: str) -> None:
    tar = _docker_save(tmp_path / "image.tar", IMAGES[case])
    with pytest.raises(ImageError), open_image(str(tar)) as opened:
        list(opened.layers)


def test_image_extract_of_a_linked_manifest_exits_12(tmp_path: Path) -> None:
    tar = _docker_save(tmp_path / "image.tar", IMAGES["manifest.json a loop of links"])
    done = run_g4build("image", "extract", str(tar), "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"))
    assert done.returncode == 12, done.stderr
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr.lower()
    assert not (tmp_path / "out").exists()


# --- a wheel's build-manifest.json of the wrong shape ---------------------------------------------------------

MANIFESTS = {
    "a list at the top": b"[1]",
    "series entries that are numbers": b'{"schema": 1, "series": [1, 2]}',
    "a series version as text": b'{"schema": 1, "series": [{"name": "x", "version": "3"}]}',
    "pin as a string": b'{"schema": 1, "series": [], "pin": "vllm-0.21.0"}',
    "nested past the recursion limit": b'{"schema": 1, "series": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "not UTF-8": b'{"schema": 1, "series": [], "x": "\xff\xfe"}',
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_validate_and_overlay_refuse_a_malformed_manifest(tmp_path: Path, case: str) -> None:
    wheel = build_wheel(tmp_path / "in", {**PRISTINE, "vllm-0.21.0.dist-info/build-manifest.json": MANIFESTS[case]})
    for args in (("validate", str(wheel)), ("overlay", str(wheel), "--pin", "vllm-0.21.0", "--out",
                                            str(tmp_path / "out"))):
        done = run_g4build(*args)
        assert done.returncode == (10 if args[0] == "validate" else 2), done.stderr  # overlay: not a release wheel
        assert "build-manifest.json" in done.stderr and "unexpected" not in done.stderr.lower(), done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("section", [b"", bytes(256), b"\xff" * 64])
def test_a_fatbin_section_emptied_of_its_containers_fails(tmp_path: Path, section: bytes) -> None:
    """The library is a sound ELF and its .nv_fatbin section is there, but holds no container (zeroed, cut to
    nothing): no readable code, so the arch check fails for it even when the wheel's other libraries are fine."""
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": GOOD_ELF,
                                   "vllm/_moe_C.abi3.so": elf({".nv_fatbin": section})})
    failed = {c.name: c.detail for c in validate_wheel(wheel, ValidateOptions(archs=SM120)).failures()}
    assert "hold no fatbin container" in failed["fatbin vllm/_moe_C.abi3.so"]
