"""Wheel validation: each check is a pure function of what was read from the wheel; one pass reads it
(g4build.validate.reading)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from g4build.errors import ValidationError
from g4build.pins.model import load_pins
from g4build.validate import cudatools
from g4build.validate.check import Check
from g4build.validate.fatbin import Arch
from g4build.validate.jit_cache import check_jit_cache
from g4build.validate.reading import FA4_CUTE, Contents, is_fa4_cute, read_wheel
from g4build.validate.smoke import smoke_install
from g4build.validate.tags import check_tags, facts_from
from g4build.wheelfile.manifestfile import MANIFEST_NAME
from g4build.wheelfile.safety import (
    ZIP_READ_ERRORS,
    Hashed,
    inside,
    record_duplicates,
    record_problems,
    wheel_file_problems,
)
from g4build.wheelfile.sources import check_wheel_file
from g4build.wheelfile.wheelfile import WheelName, metadata_fields, parse_record, tags_fit_target


@dataclass(frozen=True, kw_only=True)
class LibraryReport:
    file: str
    fatbins: int
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    verdicts: dict[str, str] = field(default_factory=dict)  # target sm -> "sass" / "ptx-only" / "none"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "fatbins": self.fatbins, "sass": list(self.sass), "ptx": list(self.ptx),
                "verdicts": dict(self.verdicts)}


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    wheel: str
    checks: tuple[Check, ...]
    archs: tuple[LibraryReport, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "wheel": self.wheel,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "archs": [a.to_dict() for a in self.archs],
            "ok": self.ok,
        }


@dataclass(frozen=True, kw_only=True)
class ValidateOptions:
    archs: tuple[Arch, ...] = ()
    pin: str | None = None
    smoke: bool = False
    cuobjdump: Path | None = None  # cross-check fatbins with this tool (None: skip)
    # without a cross-check tool, an arch verdict rests on the fatbin headers alone: a pass only when asked
    trust_fatbin: bool = False


def _same_version(text: str, version: Version) -> bool:
    try:
        return Version(text) == version
    except InvalidVersion:
        return False


def check_filename(wheel: WheelName) -> Check:
    ok, detail = tags_fit_target(wheel.tags)
    return Check(name="filename", ok=ok, detail=f"{wheel.name} {wheel.version}: {detail}")


def check_metadata(wheel: WheelName, c: Contents, pin_version: str | None) -> Check:
    if c.dist_info is None:
        return Check(name="metadata", ok=False, detail="expected exactly one *.dist-info folder, found none or several")
    if c.metadata is None:
        return Check(name="metadata", ok=False, detail=f"{c.dist_info}/METADATA is missing")
    fields = metadata_fields(c.metadata)
    name, version_text = fields.get("name", ""), fields.get("version", "")
    problems = []
    if canonicalize_name(name) != wheel.project:
        problems.append(f"METADATA Name '{name}' is not the filename's '{wheel.name}'")
    try:
        version = Version(version_text)
    except InvalidVersion:
        return Check(name="metadata", ok=False, detail=f"METADATA Version '{version_text}' is not a version")
    if version != wheel.version:
        problems.append(f"METADATA Version {version} is not the filename's {wheel.version}")
    dist_name, _, dist_version = c.dist_info[: -len(".dist-info")].partition("-")
    if canonicalize_name(dist_name) != wheel.project or not _same_version(dist_version, wheel.version):
        problems.append(f"folder {c.dist_info} does not match {wheel.name} {wheel.version}")
    if pin_version and version.public != Version(pin_version).public:
        problems.append(f"version {version.public} is not the pin's {pin_version}")
    label = version.local or ""
    if c.manifest is not None:
        digest = str(c.manifest.get("digest", ""))
        if not label.endswith(f"g4.{digest}"):
            problems.append(f"local label '{label}' does not end with g4.{digest} (the build-manifest's digest)")
    elif ".g4." in f".{label}":
        problems.append(f"local label '{label}' claims g4 series but there is no {MANIFEST_NAME}")
    if problems:
        return Check(name="metadata", ok=False, detail="; ".join(problems))
    return Check(name="metadata", ok=True, detail=f"{name} {version} (local label: {label or 'none'})")


def check_record(c: Contents, where: str) -> Check:
    if c.record is None or c.dist_info is None:
        return Check(name="record", ok=False, detail="RECORD is missing")
    try:
        rows = parse_record(c.record, where)
    except ValidationError as exc:
        return Check(name="record", ok=False, detail=exc.message)
    hashed = [Hashed(name=m.name, hash=m.hash, size=m.size, error=m.error) for m in c.members.values()]
    unsafe = sorted(n for n in {*c.members, *(r.path for r in rows)} if not inside(n))
    problems = [*(f"unsafe path (absolute, '..' or '\\'; an installer would write outside site-packages): {p}"
                  for p in unsafe),
                *(f"stored twice (one copy shadows the other): {p}" for p in c.duplicates),
                *record_duplicates(rows), *record_problems(hashed, rows, c.dist_info)]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        return Check(name="record", ok=False, detail=shown)
    return Check(name="record", ok=True, detail=f"{len(c.members)} files, every sha256 and size matches RECORD")


def check_members(wheel: WheelName, c: Contents) -> Check:
    """What pip refuses or what is unsafe to install: links, mangled names, a WHEEL file that disagrees."""
    problems = [*c.unsafe, *(wheel_file_problems(c.wheel_file, wheel, c.dist_info) if c.dist_info else [])]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        return Check(name="members", ok=False, detail=shown)
    return Check(name="members", ok=True, detail="regular files only, names safe on Windows and case-insensitive "
                 "file systems, WHEEL 1.x with the filename's tags")


def check_series(c: Contents, pin_name: str | None, known_pins: frozenset[str] = frozenset()) -> Check:
    """The series the manifest claims are in the wheel, by their fingerprints for the pin it names. Fails closed:
    a claim whose fingerprints cannot be looked up (no pin, a pin or series this checkout does not know, no
    variant of the series for that pin) is no pass."""
    if c.manifest is None:
        return Check(name="series", ok=True, detail=f"no {MANIFEST_NAME}: the wheel claims no series")
    claimed_pin = str(c.manifest.get("pin", {}).get("name", ""))
    if pin_name and claimed_pin != pin_name:
        return Check(name="series", ok=False, detail=f"the wheel was made for pin {claimed_pin}, not {pin_name}")
    claimed = ", ".join(str(e.get("name")) for e in c.manifest["series"])
    if claimed and claimed_pin not in known_pins:
        which = f"an unknown pin {claimed_pin!r} (not in this checkout's pins.yaml)" if claimed_pin else "no pin"
        return Check(name="series", ok=False,
                     detail=f"the wheel claims series {claimed} but names {which}: its fingerprints cannot be "
                            "checked. Validate it with the checkout that made it, or rebuild it for a known pin")
    known = {s.name: s for s in c.series}
    problems, seen = [], []
    for entry in c.manifest["series"]:
        name = str(entry.get("name"))
        series = known.get(name)
        if series is None:
            problems.append(f"series {name} is unknown to this checkout (patches/series.yaml)")
            continue
        variant = series.variant(claimed_pin)
        if variant is None:
            problems.append(f"series {name} has no variant for pin {claimed_pin} in this checkout: its "
                            "fingerprints cannot be checked")
            continue
        missing: list[str] = []  # what the wheel lacks of this checkout's variant, each "PATH lacks TEXT"
        for rel, texts in variant.fingerprints.items():
            member = c.members.get(rel)
            if member is None or member.text is None:
                missing.append(f"{rel} is not in the wheel")
                continue
            content = member.text.decode("utf-8", "replace")
            missing.extend(f"{rel} lacks {t!r}" for t in texts if t not in content)
        claimed_version = entry.get("version")
        if missing and isinstance(claimed_version, int) and claimed_version != series.version:
            # another version of the series than this checkout's: the fingerprints it lacks are the change between
            lacks = "; ".join(missing)
            if claimed_version < series.version:
                problems.append(f"{name}: the wheel carries v{claimed_version}, this checkout v{series.version} "
                                f"({lacks}): make it again with this checkout (`g4build wheel`, or `g4build overlay` "
                                f"of the wheel it was overlaid on) to have v{series.version}, or validate it with "
                                "the checkout that made it")
            else:
                problems.append(f"{name}: the wheel carries v{claimed_version}, newer than this checkout's "
                                f"v{series.version} ({lacks}): update this checkout, or validate the wheel with the "
                                "one that made it")
        else:
            problems.extend(f"{name}: {m}" for m in missing)
        seen.append(f"{name} v{entry.get('version')}")
    if problems:
        return Check(name="series", ok=False, detail="; ".join(problems))
    return Check(name="series", ok=True, detail=f"fingerprints present: {', '.join(seen) or 'no series claimed'}")


# vLLM installs FlashAttention 4's CuteDSL files by copying flash_attn/cute/*.py with every "flash_attn.cute"
# rewritten to "vllm.vllm_flash_attn.cute" (cmake/external_projects/vllm_flash_attn.cmake). A build with
# VLLM_FLASH_ATTN_SRC_DIR set symlinks the source folder instead; setuptools stores the files behind the link as
# they are, which import a flash_attn package the wheel does not carry. The rewrite leaves no bare
# "flash_attn.cute", and applied to already rewritten files (a copy written through such a link) it doubles.
_UNREWRITTEN = re.compile(rb"(?<![\w.])flash_attn\.cute\b")
_TWICE = re.compile(rb"vllm\.vllm_vllm\.vllm_flash_attn\.cute\b")


def check_fa4_cute(c: Contents) -> Check | None:
    """The wheel's FA4 CuteDSL files import themselves as vllm.vllm_flash_attn.cute (None: the wheel has none).
    An unreadable member is the record check's to report."""
    files = sorted(n for n in c.members if is_fa4_cute(n))
    if not files:
        return None
    texts = {n: t for n in files if (t := c.members[n].text) is not None}
    bare = [n for n, t in texts.items() if _UNREWRITTEN.search(t)]
    twice = [n for n, t in texts.items() if _TWICE.search(t)]

    def names(found: list[str]) -> str:
        return ", ".join(n.removeprefix(FA4_CUTE) for n in found[:5]) + f" and {len(found) - 5} more" * (len(found) > 5)

    problems = []
    if bare:
        others = sum(1 for n in c.members if n.startswith(FA4_CUTE) and not is_fa4_cute(n))
        beside = f" ({others} non-Python files beside them)" if others else ""
        problems.append(
            f"{len(bare)} of {len(files)} FlashAttention 4 files under {FA4_CUTE} still import flash_attn.cute: "
            f"{names(bare)}{beside}. They are the source folder's files, not vLLM's rewritten copy (vLLM built with "
            "VLLM_FLASH_ATTN_SRC_DIR set installs the folder as a symlink, and the wheel then holds the files as "
            "they are); they import a flash_attn package the wheel lacks. Build without VLLM_FLASH_ATTN_SRC_DIR")
    if twice:
        problems.append(
            f"{len(twice)} FlashAttention 4 files import vllm.vllm_vllm.vllm_flash_attn.cute: {names(twice)}. "
            "vLLM's rewrite ran on files it had rewritten before: the flash-attention source the build copied "
            "from was written through a symlinked install folder. Build from a fresh prefetched copy")
    if problems:
        return Check(name="fa4-cute", ok=False, detail="; ".join(problems))
    return Check(name="fa4-cute", ok=True,
                 detail=f"{len(files)} FlashAttention 4 files, imports rewritten to vllm.vllm_flash_attn.cute")


# vLLM libraries built for, and only ever used on, some GPU generations (compute capability majors), read from
# vLLM's selection code: FlashAttention 3 is chosen on Hopper only (get_flash_attn_version), FlashMLA serves
# MLA models on Hopper and data-centre Blackwell (sm_90a / sm_100f kernels). On any other arch vLLM never
# launches them, so their missing code for that arch is no defect of the wheel.
ARCH_SPECIFIC = (
    (re.compile(r"(^|/)_vllm_fa3_C\.[^/]*$"), frozenset({9}), "FlashAttention 3, Hopper only"),
    (re.compile(r"(^|/)_flashmla(_extension)?_C\.[^/]*$"), frozenset({9, 10}), "FlashMLA, Hopper and sm_100 only"),
)


def arch_specific(name: str, target: Arch) -> str | None:
    """Why vLLM never uses library ``name`` on ``target`` (None: it may)."""
    for pattern, majors, what in ARCH_SPECIFIC:
        if pattern.search(name) and target.major not in majors:
            return what
    return None


# An arch verdict no tool cross-checked: what it rests on, and how to get a pass.
UNCHECKED = ("by the fatbin headers alone: no cuobjdump cross-checked them (none found on PATH, in $CUDA_HOME/bin "
             "or the nvidia-cuda-cuobjdump package, or --no-cuobjdump)")


def build_os(tags: tuple[str, ...]) -> str:
    """The ``g4build wheel --os`` that builds a wheel for the platform ``tags`` name: windows for a win_* wheel,
    else linux (a Linux wheel serves WSL too)."""
    return "windows" if any(t.rsplit("-", 1)[-1].startswith("win") for t in tags) else "linux"


def arch_verdict(target: Arch, reports: list[LibraryReport], skipped: list[str], os_name: str = "linux", *,
                 checked: bool = True, trusted: bool = False) -> Check:
    """One line per arch: does the wheel run natively there, which libraries JIT from PTX, what to do (a command
    that runs as printed: the build for the wheel's OS). Without a cross-check (``checked`` False) a native
    verdict passes only when the headers are ``trusted``."""
    sm = target.sm()
    jit = [r.file for r in reports if r.verdicts.get(sm) == "ptx-only" and r.file not in skipped]
    none = [r.file for r in reports if r.verdicts.get(sm) == "none" and r.fatbins and r.file not in skipped]
    unused = f"; not used on {sm}: {', '.join(Path(f).name for f in skipped)}" if skipped else ""
    if not jit and not none:
        native = f"runs natively on {sm}: every library vLLM uses there has {sm} SASS{unused}"
        if checked:
            return Check(name=f"verdict {sm}", ok=True, detail=native)
        if trusted:
            return Check(name=f"verdict {sm}", ok=True, detail=f"{native}, {UNCHECKED}; --trust-fatbin accepts them")
        return Check(name=f"verdict {sm}", ok=False,
                     detail=f"{native}, but {UNCHECKED}, and a library can claim an arch it lacks. Install "
                            "cuobjdump (the CUDA toolkit, or pip install nvidia-cuda-cuobjdump), or pass "
                            "--trust-fatbin to accept the headers")
    parts = []
    if jit:
        parts.append(f"{len(jit)} JIT-compile from PTX at load ({', '.join(Path(f).name for f in jit)}: minutes "
                     "at each cold start, and a driver older than the compiler refuses the PTX)")
    if none:
        parts.append(f"{len(none)} have no code for it ({', '.join(Path(f).name for f in none)}: "
                     "'no kernel image is available')")
    return Check(name=f"verdict {sm}", ok=False,
                 detail=f"not native on {sm}: {'; '.join(parts)}{unused}. Build for it: "
                        f"g4build wheel --arch {sm.replace('_', '')} --os {os_name}")


def check_archs(c: Contents, targets: tuple[Arch, ...], os_name: str = "linux", *, checked: bool = True,
                trusted: bool = False) -> tuple[list[Check], list[LibraryReport]]:
    checks, reports = [], []
    skipped: dict[str, list[str]] = {t.sm(): [] for t in targets}
    for name, m in sorted(c.members.items()):
        if m.fatbins is None:
            if m.fatbin_error and targets:
                checks.append(Check(name=f"fatbin {name}", ok=False, detail=m.fatbin_error))
            continue
        verdicts = {t.sm(): m.fatbins.verdict(t) for t in targets}
        reports.append(LibraryReport(
            file=name, fatbins=len(m.fatbins.fatbins), sass=tuple(m.fatbins.names("sass")),
            ptx=tuple(m.fatbins.names("ptx")), verdicts={k: v.verdict for k, v in verdicts.items()},
        ))
        if not m.fatbins.fatbins:
            continue
        for target in targets:
            sm, v = target.sm(), verdicts[target.sm()]
            why_unused = None if v.ok else arch_specific(name, target)
            if why_unused:
                skipped[sm].append(name)
                checks.append(Check(name=f"arch {sm} {name}", ok=True,
                                    detail=f"not used on {sm} ({why_unused}): {v.detail}"))
            else:
                checks.append(Check(name=f"arch {sm} {name}", ok=v.ok, detail=v.detail))
        if m.cuobjdump_error is not None:
            checks.append(Check(
                name=f"cuobjdump {name}", ok=False,
                detail=f"{m.cuobjdump_error}; the reader found {cudatools.show(cudatools.counts(m.fatbins))} "
                       "(check the library with cuobjdump by hand, or pass --no-cuobjdump)",
            ))
        elif m.cuobjdump is not None:
            mine = cudatools.counts(m.fatbins)
            same = mine == m.cuobjdump
            checks.append(Check(
                name=f"cuobjdump {name}", ok=same,
                detail="cuobjdump lists the same entries" if same
                else f"cuobjdump lists {cudatools.show(m.cuobjdump)}; the reader found {cudatools.show(mine)}",
            ))
    if any(r.fatbins for r in reports):
        checks.extend(arch_verdict(t, reports, skipped[t.sm()], os_name, checked=checked, trusted=trusted)
                      for t in targets)
    else:  # an arch asked of a wheel that has no readable CUDA code at all is no pass
        unreadable = [n for n, m in c.members.items() if m.fatbin_error]
        why = (f"its native libraries are unreadable ({', '.join(Path(n).name for n in sorted(unreadable)[:5])})"
               if unreadable else "no library in it carries a fatbin")
        checks.extend(Check(name=f"verdict {t.sm()}", ok=False,
                            detail=f"no code for {t.sm()}: {why}. Expected CUDA libraries with {t.sm()} SASS; "
                                   "rebuild the wheel, or validate without --arch for a wheel without CUDA code")
                      for t in targets)
    return checks, reports


def tags_check(wheel: WheelName, c: Contents) -> Check:
    """The filename's tags held to what the libraries need (glibc symbol versions, machine, stable ABI)."""
    needs = {n: m.elf for n, m in c.members.items() if m.elf is not None}
    bad = {n: m.elf_error for n, m in c.members.items() if m.elf_error is not None}
    return check_tags(wheel.tags, facts_from(needs, bad, list(c.members)))


def unreadable(wheel: Path, exc: ValidationError | OSError) -> ValidationReport:
    """The report of a wheel that could not be read at all: one failing check saying why."""
    why = exc.message if isinstance(exc, ValidationError) else f"{wheel}: cannot be read ({exc.strerror or exc})"
    return ValidationReport(wheel=str(wheel), checks=(Check(name="readable", ok=False, detail=why),), archs=())


def validate_wheel(
    path: Path, options: ValidateOptions, *, smoke: Callable[[Path], Check] | None = None,
) -> ValidationReport:
    """Run every check on one wheel. Raises only when the file is not a readable zip."""
    wheel = WheelName.parse(path.name)
    try:  # a FIFO would block the zip reader, a link to /dev/zero feed it without end
        check_wheel_file(path)
    except OSError as exc:
        why = f"{path}: cannot be read ({exc.strerror})" if exc.strerror else str(exc)
        raise ValidationError(why, hint="pass the wheel file itself") from exc
    pins = load_pins()
    pin_version = pins.get(options.pin).version if options.pin else None
    try:
        contents = read_wheel(path, keep=set(), cuobjdump=options.cuobjdump if options.archs else None)
    except ZIP_READ_ERRORS as exc:
        raise ValidationError(f"{path}: not a readable zip file ({type(exc).__name__}: {exc})") from exc
    checks = [check_filename(wheel), check_metadata(wheel, contents, pin_version), check_record(contents, path.name),
              check_members(wheel, contents), check_series(contents, options.pin, frozenset(pins.pins)),
              tags_check(wheel, contents)]
    if (cute := check_fa4_cute(contents)) is not None:
        checks.append(cute)
    arch_checks, reports = check_archs(contents, options.archs, build_os(wheel.tags),
                                       checked=options.cuobjdump is not None, trusted=options.trust_fatbin)
    checks.extend(arch_checks)
    if wheel.project == "flashinfer-jit-cache":  # FlashInfer's modules: each listed one, SASS for its archs
        checks.extend(check_jit_cache(path, contents, options.archs))
    if options.smoke:
        if smoke is None:
            smoke = smoke_install
        checks.append(smoke(path))
    return ValidationReport(wheel=str(path), checks=tuple(checks), archs=tuple(reports))
