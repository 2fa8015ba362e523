"""`g4build pins add`: a new pin read from the package index and the release's own sdist.

Every value comes from somewhere that can be named: the sdist's file name and sha256 from the index page (the
download is verified against it), the commit from the sdist's ``vllm/_version.py``, torch and FlashInfer from its
``requirements/cuda.txt``, the CUDA line from its ``docker/versions.json`` (or the Dockerfile's ``ARG``), each
registry wheel from the index page. What the release does not record is asked for with an option.
"""

from __future__ import annotations

import json
import re
import tarfile
import zlib
from dataclasses import dataclass, field

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from g4build.errors import DownloadError, IntegrityError, UnsafeArchiveError, UsageError
from g4build.pins.index import cache_root, fetch_verified, index_url, project_page
from g4build.pins.model import (
    PIN_NAME_RE,
    FileRef,
    GitRef,
    Pin,
    PinSet,
    cuda_problem,
    remote_problem,
    specifier_problem,
    version_problem,
)
from g4build.pins.page import IndexFile

PROJECT = "vllm"
# The wheel keys g4build looks up (overlay/registry.py platform_key): other platforms are not pinned.
WHEEL_KEYS = ("manylinux_x86_64", "win_amd64")
_MAX_MEMBER = 1 << 20  # the files read here are a few KB; a bigger member is not what we look for
_PLATFORM = re.compile(r"^(manylinux|musllinux)_\d+_\d+_(\w+)$")
_CUDA = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)*$")


@dataclass(frozen=True, kw_only=True)
class Given:
    """What the user passed for values the release may not record."""

    name: str | None = None
    commit: str | None = None
    remote: str | None = None
    torch: str | None = None
    cuda: str | None = None
    flashinfer: str | None = None
    wheels: tuple[str, ...] = ()  # wheel file names chosen where the index has several for one platform


@dataclass(frozen=True, kw_only=True)
class Proposal:
    pin: Pin
    sources: dict[str, str]  # field -> where its value was read
    unread: dict[str, str] = field(default_factory=dict)  # field -> why the release does not record it
    skipped: list[str] = field(default_factory=list)  # index files not pinned, with why

    def to_dict(self) -> dict[str, object]:
        return {"pin": self.pin.to_dict(), "sources": self.sources, "unread": self.unread, "skipped": self.skipped}


def wheel_key(filename: str) -> str | None:
    """``manylinux_2_24_x86_64`` -> ``manylinux_x86_64``, ``win_amd64`` stays; None for a name that is no wheel."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    plats = {t.platform for t in tags}
    keys = {(f"{m.group(1)}_{m.group(2)}" if (m := _PLATFORM.match(p)) else p) for p in plats}
    return keys.pop() if len(keys) == 1 else None


def _release_files(version: Version) -> tuple[IndexFile, list[IndexFile]]:
    page = project_page(PROJECT)
    files = page.files
    sdists: list[IndexFile] = []
    wheels: list[IndexFile] = []
    seen: set[Version] = set()
    for f in files:
        try:
            if f.filename.endswith(".whl"):
                name, v = parse_wheel_filename(f.filename)[:2]
            else:
                name, v = parse_sdist_filename(f.filename)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if canonicalize_name(name) != PROJECT:  # another project's file on this page: not ours to pin
            continue
        seen.add(v)
        if v == version and f.filename.endswith(".whl"):
            wheels.append(f)
        elif v == version and f.filename.endswith(".tar.gz"):
            sdists.append(f)
    if not sdists:
        near = ", ".join(str(v) for v in sorted(seen)[-5:]) or "none"
        refused = (f"; entries set aside as unsafe: {'; '.join(page.refused[:5])}"
                   + (f" and {len(page.refused) - 5} more" if len(page.refused) > 5 else "")) if page.refused else ""
        raise DownloadError(
            f"the package index ({index_url()}) has no sdist of {PROJECT} {version}; "
            f"expected {PROJECT}-{version}.tar.gz, found these latest versions: {near}{refused}",
            hint="check the version, or point pip's index-url (PIP_INDEX_URL / pip config) at an index that has it",
        )
    if len(sdists) > 1:
        raise DownloadError(f"the package index lists {len(sdists)} sdists of {PROJECT} {version}: "
                            f"{', '.join(s.filename for s in sdists)}; expected one",
                            hint="check pip's index-url: this index is not a plain mirror")
    sdist = sdists[0]
    if sdist.yanked:
        raise UsageError(f"{sdist.filename} is yanked on the package index; expected a release that stands",
                         hint="pin another release")
    if not sdist.sha256:
        raise IntegrityError(f"the package index publishes no sha256 for {sdist.filename}; expected one to pin",
                             hint="use an index that publishes hashes (PIP_INDEX_URL / pip config)")
    return sdist, wheels


class _Sdist:
    """Small text members of a verified sdist, read without extracting it."""

    def __init__(self, tar: tarfile.TarFile, top: str) -> None:
        self._tar, self.top = tar, top

    def read(self, rel: str) -> str | None:
        try:
            member = self._tar.getmember(f"{self.top}/{rel}")
        except KeyError:
            return None
        if not member.isfile() or member.size > _MAX_MEMBER:
            return None
        fh = self._tar.extractfile(member)
        return None if fh is None else fh.read().decode("utf-8", errors="replace")


def _requirement(text: str | None, project: str) -> str | None:
    """The ``==`` version of ``project`` in a requirements file, or None (no exact pin there)."""
    if text is None:
        return None
    wanted = re.sub(r"[-_.]+", "-", project).lower()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*(?:;.*)?$", line)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == wanted:
            return m.group(2)
    return None


def _cuda(sd: _Sdist) -> tuple[str, str] | None:
    """(major.minor, where) of the CUDA the release's images build against."""
    raw: str | None = None
    where = ""
    text = sd.read("docker/versions.json")
    if text is not None:
        try:
            value = json.loads(text)["variable"]["CUDA_VERSION"]["default"]
        except (ValueError, KeyError, TypeError):
            value = None
        if isinstance(value, str):
            raw, where = value, "docker/versions.json CUDA_VERSION"
    if raw is None:
        m = re.search(r"^ARG CUDA_VERSION=(\S+)", sd.read("docker/Dockerfile") or "", re.M)
        if m:
            raw, where = m.group(1), "docker/Dockerfile ARG CUDA_VERSION"
    m = _CUDA.match(raw or "")
    return (f"{m.group(1)}.{m.group(2)}", f"sdist {where} ({raw})") if m else None


def _pick(field_: str, option: str, read: tuple[str, str] | None, given: str | None,
          sources: dict[str, str], unread: dict[str, str], why: str) -> str:
    """The read value, or the option's where the release records none; both must agree when both exist."""
    if read is not None:
        value, where = read
        if given is not None and given != value:
            raise UsageError(f"{option} {given}: the release records {field_} {value} ({where})",
                             hint=f"drop {option}, or pass {option} {value}")
        sources[field_] = where
        return value
    if given is None:
        raise UsageError(f"cannot read {field_} from the release: {why}", hint=f"pass it with {option}")
    sources[field_] = f"given ({option})"
    unread[field_] = why
    return given


def read_release(release: str, given: Given, pinset: PinSet) -> Proposal:
    """Read a new pin for ``release`` from the package index and the verified sdist."""
    try:
        version = Version(release)
    except InvalidVersion as exc:
        raise UsageError(f"--release {release!r}: expected a version such as 0.21.0", hint="e.g. --release 0.33.0") \
            from exc
    _check_given(given)
    name = given.name or f"{PROJECT}-{version}"
    if not PIN_NAME_RE.fullmatch(name):
        raise UsageError(f"--name {name!r}: expected lower case letters, digits, '.', '-', '_'",
                         hint="names become folder names, e.g. vllm-0.33.0")
    if name in pinset.pins:
        raise UsageError(f"pin '{name}' already exists in {pinset.source}",
                         hint=f"see it with `g4build pins show {name}`; pass --name for another name, "
                              "or remove the entry from pins.yaml first")
    sdist, wheel_files = _release_files(version)
    assert sdist.sha256 is not None  # checked in _release_files
    sources: dict[str, str] = {"sdist": "package index page (sha256 verified on download)"}
    unread: dict[str, str] = {}
    # what needs no download is settled first: a missing option costs no 40 MB
    remote = _remote(given.remote, pinset, sources)
    wheels, skipped = _wheels(wheel_files, given.wheels)
    sources["wheels"] = "package index page"
    got = fetch_verified(PROJECT, sdist.filename, sdist.sha256, cache_dir=cache_root() / "sdists")
    try:
        with tarfile.open(got.path) as tar:
            sd = _Sdist(tar, sdist.filename[: -len(".tar.gz")])
            file_version, short = _version_file(sd.read("vllm/_version.py"))
            if file_version is not None and Version(file_version) != version:
                raise IntegrityError(f"{sdist.filename}: vllm/_version.py records version {file_version}, "
                                     f"expected {version}", hint="the index serves another release under this name")
            commit = _commit(short, given.commit, sources, unread)
            odd: dict[str, str] = {}
            torch = _pick("torch", "--torch", _req(sd, "torch", odd), given.torch, sources, unread,
                          odd.get("torch", "requirements/cuda.txt pins no torch=="))
            flashinfer = _pick("flashinfer", "--flashinfer", _req(sd, "flashinfer-python", odd), given.flashinfer,
                               sources, unread,
                               odd.get("flashinfer-python", "requirements/cuda.txt pins no flashinfer-python=="))
            cuda = _pick("cuda", "--cuda", _cuda(sd), given.cuda, sources, unread,
                         "neither docker/versions.json nor docker/Dockerfile records CUDA_VERSION")
            transformers = _transformers(sd, sources, unread)
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error) as exc:
        raise UnsafeArchiveError(f"{got.path.name}: not a readable tar archive: {exc}",
                                 hint="expected a .tar.gz sdist: delete the cached file and run again") from exc
    # Per-OS bases are forks of other projects (e.g. the Windows fork): no upstream release records them.
    unread["bases"] = "per-OS fork bases are not part of the upstream release; add one by hand where an OS needs it"
    pin = Pin(name=name, version=str(version), upstream=GitRef(remote=remote, commit=commit),
              sdist=FileRef(file=sdist.filename, sha256=sdist.sha256.lower()), torch=torch, cuda=cuda,
              flashinfer=flashinfer, wheels=wheels, transformers=transformers)
    return Proposal(pin=pin, sources=sources, unread=unread, skipped=skipped)


def _check_given(given: Given) -> None:
    """The options' values are typed as the pins loader types them (they are written to pins.yaml as they are)."""
    for option, value, check in (("--torch", given.torch, version_problem),
                                 ("--flashinfer", given.flashinfer, version_problem),
                                 ("--cuda", given.cuda, cuda_problem), ("--remote", given.remote, remote_problem)):
        why = check(value) if value is not None else None
        if why:
            raise UsageError(f"{option} {value!r}: it has {why}",
                             hint="e.g. --cuda 13.0, --torch 2.11.0, --remote https://github.com/OWNER/vllm.git")


def _version_file(text: str | None) -> tuple[str | None, str | None]:
    """(version, commit id) as setuptools-scm writes them into vllm/_version.py (the id without its 'g')."""
    ver = re.search(r"^__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]", text or "", re.M)
    cid = re.search(r"^__commit_id__\s*=\s*commit_id\s*=\s*['\"]g?([0-9a-f]{7,40})['\"]", text or "", re.M)
    return (ver.group(1) if ver else None), (cid.group(1) if cid else None)


def _req(sd: _Sdist, project: str, unreadable: dict[str, str]) -> tuple[str, str] | None:
    """The release's ``project==`` version, when it is one (anything else is unread, and says why)."""
    value = _requirement(sd.read("requirements/cuda.txt"), project)
    if value is None:
        return None
    why = version_problem(value)
    if why:
        unreadable[project] = f"requirements/cuda.txt pins {project}=={value!r}, which has {why}"
        return None
    return value, f"sdist requirements/cuda.txt ({project}=={value})"


def _transformers(sd: _Sdist, sources: dict[str, str], unread: dict[str, str]) -> str | None:
    """The release's own transformers range (requirements/common.txt), as pins.yaml holds one: maintainers narrow
    it by hand where a model needs that (pins.yaml says why)."""
    for line in (sd.read("requirements/common.txt") or "").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        m = re.match(r"^transformers(?![A-Za-z0-9._-])\s*(\S.*)?$", line, re.I)
        if m is None:
            continue
        spec = re.sub(r"\s+", "", m.group(1) or "")
        if spec and specifier_problem(spec) is None:
            sources["transformers"] = f"sdist requirements/common.txt (transformers {spec})"
            return spec
        unread["transformers"] = f"requirements/common.txt gives transformers no version range ({line!r})"
        return None
    unread["transformers"] = "requirements/common.txt names no transformers"
    return None


def _commit(short: str | None, given: str | None, sources: dict[str, str], unread: dict[str, str]) -> str:
    given = given.lower() if given else None
    if given is not None and not re.fullmatch(r"[0-9a-f]{7,40}", given):
        raise UsageError(f"--commit {given!r}: expected 7-40 hex digits", hint="e.g. the full sha of the release tag")
    if short is None:
        if given is None:
            raise UsageError("cannot read the upstream commit: the sdist's vllm/_version.py records no commit_id",
                             hint="pass the release tag's commit with --commit")
        sources["commit"] = "given (--commit)"
        unread["commit"] = "vllm/_version.py records no commit_id"
        return given
    if given is None:
        sources["commit"] = "sdist vllm/_version.py commit_id"
        # A short id is valid (a git source verifies it as a prefix); only the full sha cannot be read.
        if len(short) < 40:
            unread["commit (full sha)"] = (f"vllm/_version.py records the short id {short} only; "
                                           "pass --commit FULL-SHA to pin the full sha")
        return short
    if not (given.startswith(short) or short.startswith(given)):
        raise UsageError(f"--commit {given}: the sdist's vllm/_version.py records commit {short}",
                         hint=f"pass the commit that starts with {short}, or drop --commit")
    sources["commit"] = f"given (--commit), matches vllm/_version.py commit_id {short}"
    return given if len(given) >= len(short) else short


def _remote(given: str | None, pinset: PinSet, sources: dict[str, str]) -> str:
    if given:
        sources["remote"] = "given (--remote)"
        return given
    # The sdist names no git remote; the project's own pins do, and one upstream is what all of them share.
    remotes = sorted({p.upstream.remote for p in pinset.pins.values()})
    if len(remotes) != 1:
        raise UsageError(f"cannot tell the upstream git remote: the pins in {pinset.source} name "
                         f"{len(remotes)} ({', '.join(remotes)}), expected one", hint="pass it with --remote URL")
    sources["remote"] = f"the existing pins' upstream remote ({pinset.source.name})"
    return remotes[0]


def _wheels(files: list[IndexFile], chosen: tuple[str, ...]) -> tuple[dict[str, FileRef], list[str]]:
    by_key: dict[str, list[IndexFile]] = {}
    skipped: list[str] = []
    names = {f.filename for f in files}
    unknown = [c for c in chosen if c not in names]
    if unknown:
        raise UsageError(f"--wheel {', '.join(unknown)}: not a wheel of this release on the index; "
                         f"expected one of {', '.join(sorted(names)) or 'none'}", hint="copy the name from the list")
    for f in files:
        key = wheel_key(f.filename)
        if key not in WHEEL_KEYS:
            skipped.append(f"{f.filename}: g4build uses no registry wheel for {key or 'its tags'}")
        elif f.yanked:
            skipped.append(f"{f.filename}: yanked")
        elif not f.sha256:
            skipped.append(f"{f.filename}: the index publishes no sha256")
        elif chosen and any(wheel_key(c) == key for c in chosen) and f.filename not in chosen:
            skipped.append(f"{f.filename}: another --wheel was chosen for {key}")
        else:
            by_key.setdefault(key, []).append(f)
    out: dict[str, FileRef] = {}
    for key in WHEEL_KEYS:
        found = by_key.get(key, [])
        if len(found) > 1:
            raise UsageError(f"the index has {len(found)} wheels for {key} ({', '.join(f.filename for f in found)}); "
                             "expected one, and which build to pin cannot be read",
                             hint="choose one with --wheel FILE")
        if found:
            sha = found[0].sha256
            assert sha is not None  # files without one were skipped above
            out[key] = FileRef(file=found[0].filename, sha256=sha.lower())
    return out, skipped
