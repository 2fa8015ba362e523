"""FlashInfer's JIT modules compiled ahead of time, packed as the ``flashinfer-jit-cache`` wheel FlashInfer reads.

How FlashInfer finds them (read in the flashinfer-python sdists of the pins): ``flashinfer/jit/env.py`` imports
an installed ``flashinfer_jit_cache`` package. Through 0.6.x (``_get_aot_dir``) it requires its ``__version__`` to
start with FlashInfer's own version and takes ``get_jit_cache_dir()`` as ``FLASHINFER_AOT_DIR``; from 0.7
(``_get_aot_providers``) it requires ``__version__`` to be FlashInfer's or ``<version>+<local>`` and asks
``get_jit_cache_providers()`` for providers, each naming its distribution, version (equal to the package's),
``jit_cache_dir``, ``cuda_architectures`` (``sm90a``, ``sm120f``) and ``modules``; ``get_aot_artifacts`` then
picks a provider whose architectures run on the device. Either way a module ``NAME`` is the file
``<jit_cache_dir>/NAME/NAME.so``, and ``JitSpec.build_and_load`` loads it instead of compiling
(``FLASHINFER_DISABLE_JIT=1`` makes a module missing there an error instead of a compile).

The wheel written here is that package with our own small ``__init__``: both entry points, answered from
``jit_cache/g4build-modules.json`` (modules, architectures, the FlashInfer version and source sha256). Its version
is ``<flashinfer version>+g4jit.<digest>`` (not ``g4.``: that label means vLLM series and a build-manifest),
the digest over the libraries, so a rebuild with other kernels is another version. Tag ``cp39-abi3-<platform>``,
as upstream's jit-cache wheels (the libraries are tvm-ffi modules: no CPython ABI beyond the stable one).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import UsageError, ValidationError
from g4build.wheelfile.wheelfile import RecordRow, dist_info_name, format_record, record_hash

PROJECT = "flashinfer-jit-cache"
PACKAGE = "flashinfer_jit_cache"
CACHE_DIR = "jit_cache"  # the folder upstream's package keeps its modules in
MODULES_FILE = "g4build-modules.json"
TAG = "cp39-abi3"  # upstream's jit-cache tag: any CPython 3.9+
RECORD_FILE = "flashinfer-aot.json"  # beside the wheels: what `g4build flashinfer-aot` built, for the manifest
_ARCH_RE = re.compile(r"^(\d{1,2})\.(\d)([af]?)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_]+$")  # FlashInfer's module names are identifiers (folder and file names)


def flashinfer_arch_name(item: str) -> str:
    """One ``FLASHINFER_CUDA_ARCH_LIST`` item as FlashInfer names the target it builds (``CompilationContext``):
    a suffix given is kept; else 9.x gets ``a``, 12.0 ``f``, 12.1 and 10+ ``a``."""
    match = _ARCH_RE.match(item.strip())
    if match is None:
        raise UsageError(f"FlashInfer arch {item!r}: expected MAJOR.MINOR with an optional a/f suffix, e.g. 12.0f or "
                         "9.0")
    major, minor, suffix = int(match[1]), int(match[2]), match[3]
    if not suffix and major >= 9:
        suffix = "f" if (major, minor) == (12, 0) else "a"
    return f"sm{major}{minor}{suffix}"


def arch_names(arch_list: str) -> tuple[str, ...]:
    names = tuple(sorted({flashinfer_arch_name(a) for a in arch_list.split()}))
    if not names:
        raise UsageError("FlashInfer arch list is empty: expected e.g. '12.0f'")
    return names


@dataclass(frozen=True, kw_only=True)
class JitCacheInfo:
    flashinfer: str  # flashinfer-python's version the modules were compiled from
    source_file: str
    source_sha256: str
    arch_list: str  # FLASHINFER_CUDA_ARCH_LIST as given, e.g. "12.0f"
    modules: tuple[str, ...]
    majors: tuple[tuple[str, tuple[int, ...]], ...] = ()  # module -> the majors its generator emits code for

    def module_archs(self, module: str) -> list[str]:
        """The architectures ``module`` has code for: all of the list, or those of its majors."""
        majors = dict(self.majors).get(module) or ()
        return [a for a in arch_names(self.arch_list) if not majors or int(a[2:].rstrip("af")[:-1]) in majors]

    def to_dict(self) -> dict[str, Any]:
        return {"flashinfer": self.flashinfer, "sdist": {"file": self.source_file, "sha256": self.source_sha256},
                "arch_list": self.arch_list, "cuda_architectures": list(arch_names(self.arch_list)),
                "modules": list(self.modules), "module_archs": {m: self.module_archs(m) for m in self.modules}}


def library_digest(built: Path, modules: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(modules):
        digest.update(name.encode() + b"\0")
        digest.update((built / name / f"{name}.so").read_bytes())
    return digest.hexdigest()[:12]


def init_text() -> str:
    """The package's ``__init__``: what FlashInfer 0.6 (``__version__``, ``get_jit_cache_dir``) and 0.7
    (``get_jit_cache_providers``) ask of an installed ``flashinfer_jit_cache``."""
    return f'''"""FlashInfer JIT modules compiled ahead of time by g4build (only those its launch recipes load)."""

import json
from pathlib import Path
from types import SimpleNamespace

_HERE = Path(__file__).parent
_INFO = json.loads((_HERE / "{CACHE_DIR}" / "{MODULES_FILE}").read_text(encoding="utf-8"))
__version__ = _INFO["version"]
__git_version__ = "g4build"


def get_jit_cache_dir():
    return str(_HERE / "{CACHE_DIR}")


def get_jit_cache_providers():
    return (SimpleNamespace(provider_id="g4build", distribution="{PROJECT}", version=__version__,
                            jit_cache_dir=Path(get_jit_cache_dir()),
                            cuda_architectures=frozenset(_INFO["cuda_architectures"]),
                            modules=frozenset(_INFO["modules"])),)
'''


def _metadata(version: str, info: JitCacheInfo) -> bytes:
    summary = f"FlashInfer {info.flashinfer} JIT modules ({', '.join(info.modules)}) for {info.arch_list}, by g4build"
    return (f"Metadata-Version: 2.1\nName: {PROJECT}\nVersion: {version}\nSummary: {summary}\n"
            f"Requires-Dist: flashinfer-python=={info.flashinfer}\n").encode()


def check_built(built: Path, modules: Sequence[str]) -> None:
    for name in modules:
        if not _NAME_RE.match(name):
            raise UsageError(f"FlashInfer module name {name!r}: expected letters, digits and '_'")
        library = built / name / f"{name}.so"
        if not library.is_file():
            raise ValidationError(f"{library}: expected the compiled module {name} there, found nothing",
                                  hint="run the FlashInfer AOT compile step again")


def pack_wheel(built: Path, out: Path, info: JitCacheInfo, platform: str) -> Path:
    """Write ``flashinfer_jit_cache-<version>-cp39-abi3-<platform>.whl`` into ``out`` from ``built/NAME/NAME.so``
    (a temporary name first, renamed when whole). Returns its path."""
    check_built(built, info.modules)
    version = f"{info.flashinfer}+g4jit.{library_digest(built, info.modules)}"
    record = {**info.to_dict(), "version": version}
    files: dict[str, bytes] = {
        f"{PACKAGE}/__init__.py": init_text().encode(),
        f"{PACKAGE}/{CACHE_DIR}/{MODULES_FILE}": json.dumps(record, indent=1, sort_keys=True).encode() + b"\n",
    }
    for name in info.modules:
        files[f"{PACKAGE}/{CACHE_DIR}/{name}/{name}.so"] = (built / name / f"{name}.so").read_bytes()
    dist_info = dist_info_name(PROJECT, version)
    files[f"{dist_info}/METADATA"] = _metadata(version, info)
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: g4build\nRoot-Is-Purelib: false\n"
                                   f"Tag: {TAG}-{platform}\n").encode()
    rows = [RecordRow(path=p, hash=record_hash(d), size=str(len(d))) for p, d in files.items()]
    rows.append(RecordRow(path=f"{dist_info}/RECORD", hash="", size=""))
    files[f"{dist_info}/RECORD"] = format_record(rows)
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{PACKAGE}-{version}-{TAG}-{platform}.whl"
    tmp = out / f".{wheel.name}.part"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    os.replace(tmp, wheel)
    return wheel


def read_packed(zf: zipfile.ZipFile, where: str) -> dict[str, Any]:
    """The module record a jit-cache wheel carries (what it claims to hold), checked for shape."""
    name = f"{PACKAGE}/{CACHE_DIR}/{MODULES_FILE}"
    try:
        raw = json.loads(zf.read(name))
    except KeyError:
        raise ValidationError(f"{where}: expected {name} (a jit-cache wheel g4build packed), found none") from None
    except ValueError as exc:
        raise ValidationError(f"{where}: {name} is not JSON ({exc})") from exc
    modules = raw.get("modules") if isinstance(raw, dict) else None
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and _NAME_RE.match(m)
                                                               for m in modules):
        raise ValidationError(f"{where}: {name}: expected a non-empty list of module names, found {modules!r:.80}")
    return dict(raw)


def manifest_record(info: JitCacheInfo, wheel: Path, seconds: float | None = None,
                    sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """build-manifest.json's ``flashinfer`` for a scoped ahead-of-time build."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    record: dict[str, Any] = {"source": "aot", "version": info.flashinfer, **info.to_dict(),
                              "wheels": [{"file": wheel.name, "sha256": digest}]}
    if seconds is not None:
        record["seconds"] = round(seconds, 1)
    if sizes is not None:
        record["bytes"] = dict(sizes)
    return record


def read_record(out: Path, flashinfer: str) -> dict[str, Any] | None:
    """The scoped build's record in ``out`` (None: no scoped build ran there), its wheel re-hashed."""
    path = out / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        wheels = record["wheels"]
        version = record["flashinfer"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError(f"{path}: expected the record `g4build flashinfer-aot` writes ({exc})",
                              hint="run the flashinfer-aot step again") from exc
    if version != flashinfer:
        raise ValidationError(f"{path}: expected FlashInfer {flashinfer} (the pin's), found {version}",
                              hint="a record of another build: run the flashinfer-aot step again")
    for wheel in wheels:
        dest = out / str(wheel.get("file"))
        found = hashlib.sha256(dest.read_bytes()).hexdigest() if dest.is_file() else "missing"
        if found != wheel.get("sha256"):
            raise ValidationError(f"{dest}: expected sha256 {wheel.get('sha256')} (recorded in {RECORD_FILE}), "
                                  f"found {found}", hint="run the flashinfer-aot step again")
    return dict(record)
