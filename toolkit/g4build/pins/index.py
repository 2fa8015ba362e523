"""The package index: where sdists and wheels come from, verified by sha256, cached for offline use.

The index URL is the user's own pip configuration (``PIP_INDEX_URL``, then ``pip config``), falling back
to pip's built-in default, so mirrors work and no host is written here.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout
from platformdirs import user_cache_dir

from g4build.errors import DownloadError, IntegrityError, LockTimeoutError, UsageError
from g4build.pins.page import IndexFile, Page, parse_html, parse_json
from g4build.util.safetext import file_name_problem

if TYPE_CHECKING:  # requests (and urllib3) are imported where a page or a file is fetched: not at every start
    import requests

CHUNK = 1 << 20
LOCK_TIMEOUT_S = 3600.0  # G4BUILD_LOCK_TIMEOUT (seconds) overrides it
DOWNLOAD_ATTEMPTS = 3  # a stream that breaks off is fetched again from the start

ProgressHook = Callable[[int, int | None], None]  # (bytes so far, total or None)


def cache_root() -> Path:
    """``G4BUILD_CACHE`` or the user cache dir (``~/.cache/g4build`` on Linux); a folder, or nothing yet (it is
    made when first written). A file there, or on the way there, is a usage error naming where the path came from."""
    env = os.environ.get("G4BUILD_CACHE")
    root = Path(env or user_cache_dir("g4build", appauthor=False))
    for path in (root, *root.parents):
        if path.is_dir():
            break
        if path.exists() or path.is_symlink():  # a file, a special file or a dangling link: nothing can go under it
            what = "a dangling symlink" if not path.exists() else "a file" if path.is_file() else "not a folder"
            at = "" if path == root else f" ({path} is on the way)"
            source = f"G4BUILD_CACHE={env}" if env else f"the user cache folder {root}"
            raise UsageError(
                f"{source}: expected a folder for g4build's cache (or nothing there yet), found {what}{at}",
                hint="set G4BUILD_CACHE to a folder g4build may create and write, or unset it for the default"
                if env else f"remove or rename {path}, or set G4BUILD_CACHE to another folder",
            )
    return root


def _pip_default_index() -> str:
    from pip._internal.models.index import PyPI  # pip's own default, not a host of ours

    return str(PyPI.simple_url)


def _pip_config_index() -> str | None:
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        value = value.strip().strip("'\"")
        if key.endswith(".index-url") and value:
            found[key.split(".", 1)[0]] = value
    # Keys are "<section>.index-url" (pip merges its files itself). Fetching a file is what `pip download`
    # does: its own section wins over [install] and [global], as pip's would; PIP_* variables win over all.
    for section in (":env:", "download", "install", "global"):
        if section in found:
            return found[section]
    return None


def index_url() -> str:
    """The simple index base URL, ending without a slash."""
    url = os.environ.get("PIP_INDEX_URL") or _pip_config_index() or _pip_default_index()
    return url.rstrip("/")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


PAGE_DEADLINE_S = 300.0  # G4BUILD_PAGE_DEADLINE: reading one index page, retries included
PAGE_MAX_BYTES = 64 << 20  # the largest project pages are a few MB


def _read_page(http: requests.Session, base: str, project: str) -> tuple[str, bytes]:
    """(Content-Type, body) of an index page, read within the page deadline: a server that trickles or stalls
    is cut off when it passes, whatever each read does; a page over PAGE_MAX_BYTES is refused."""
    import requests

    limits = Limits(deadline_s=_env_seconds("G4BUILD_PAGE_DEADLINE", PAGE_DEADLINE_S), min_rate=0.0)
    end = time.monotonic() + limits.deadline_s
    page = f"{base}/{_normalize(project)}/"
    delay = 1.0
    for attempt in range(1, 5):
        left = end - time.monotonic()
        try:
            if left <= 0:
                raise _DeadlinePassed
            resp = http.get(page, stream=True, timeout=(min(15.0, left), min(120.0, left)),
                            headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
            with resp:
                if resp.status_code == 404:
                    raise DownloadError(f"the package index at {base} has no project '{project}'",
                                        hint="check pip's index-url (PIP_INDEX_URL / pip config): a mirror may not "
                                             "carry it")
                if resp.status_code >= 500 and attempt < 4:
                    raise requests.ConnectionError(f"server answered {resp.status_code}")
                if resp.status_code != 200:
                    raise DownloadError(f"the package index answered {resp.status_code} for {page}; expected 200",
                                        hint="run the command again later, or point PIP_INDEX_URL at a working "
                                             "mirror")
                body = bytearray()
                for chunk in _chunks(resp, limits, end):
                    body += chunk
                    if len(body) > PAGE_MAX_BYTES:
                        raise DownloadError(f"the package index page {page} is over {PAGE_MAX_BYTES} bytes; "
                                            "expected a project page of a few MB",
                                            hint="check pip's index-url (PIP_INDEX_URL / pip config)")
                return resp.headers.get("Content-Type", ""), bytes(body)
        except _DeadlinePassed:
            raise DownloadError(
                f"the package index page {page} did not arrive within {limits.deadline_s:g} s "
                "(G4BUILD_PAGE_DEADLINE)",
                hint="the index or the network is too slow or stalls: try again, use a closer mirror "
                     "(PIP_INDEX_URL), or raise G4BUILD_PAGE_DEADLINE") from None
        except (requests.RequestException, _CutShort) as exc:
            if attempt == 4 or time.monotonic() + delay >= end:
                raise DownloadError(f"could not read the package index page {page}: {exc}",
                                    hint="check your network or pip's index-url (PIP_INDEX_URL / pip config)") \
                    from exc
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def project_page(project: str, *, session: requests.Session | None = None) -> Page:
    """A project's files on the index (PEP 691 JSON, or PEP 503 HTML) with their sha256, and the entries set
    aside as unsafe (``page``)."""
    import requests

    base = index_url()
    page = f"{base}/{_normalize(project)}/"
    ctype, body = _read_page(session or requests.Session(), base, project)
    if ctype.startswith("application/vnd.pypi.simple.v1+json"):
        return parse_json(page, body)
    return parse_html(page, body.decode("utf-8", errors="replace"))


def project_files(project: str, *, session: requests.Session | None = None) -> list[IndexFile]:
    """The safe entries of ``project_page``."""
    return project_page(project, session=session).files


def find_file(project: str, filename: str) -> IndexFile:
    for f in project_files(project):
        if f.filename == filename:
            return f
    raise DownloadError(
        f"{filename} is not on the package index ({index_url()}/{_normalize(project)}/)",
        hint="is the version released? does your mirror carry it?",
    )


def _env_seconds(name: str, default: float, unit: str = "seconds", *, off: str | None = None) -> float:
    """A positive number (of seconds, or ``unit``) from the environment, or ``default`` when unset. With ``off``
    (what 0 means, e.g. "no minimum"), 0 is accepted too and returned as 0.0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if off is not None and value == 0:
        return 0.0
    if not value > 0 or value == float("inf"):
        expected = f"a positive number of {unit}" + (f", or 0 for {off}" if off is not None else "")
        raise UsageError(f"{name}: expected {expected}, found {raw!r}",
                         hint=f"set {name} to e.g. {default:g}, or unset it for the default ({default:g})")
    return value


def lock_timeout() -> float:
    """How long a g4build run waits for a lock another run holds (``G4BUILD_LOCK_TIMEOUT``, seconds)."""
    return _env_seconds("G4BUILD_LOCK_TIMEOUT", LOCK_TIMEOUT_S)


@contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (made next to ``path``) so two g4build runs never work on one cache entry at once."""
    timeout = lock_timeout()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock")
    try:
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise LockTimeoutError(
            f"{lock.lock_file}: expected to get this lock within {timeout:g} s, "
            "found it still held by another g4build run",
            hint="wait for the other g4build run on the same cache entry or venv to finish, then run the command "
                 "again (G4BUILD_LOCK_TIMEOUT sets how long to wait)",
        ) from exc
    try:
        yield
    finally:
        lock.release()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class _CutShort(Exception):
    """The stream ended or stalled before the whole file arrived (retried like any broken connection, which
    requests' RequestException is)."""


class _TooSlow(_CutShort):
    """The stream ran below the minimum rate over a whole window."""


READ = 1 << 16  # one read's most bytes: small enough that the deadline and rate are checked often
DOWNLOAD_DEADLINE_S = 6 * 3600.0  # G4BUILD_DOWNLOAD_DEADLINE: the whole download, retries included
MIN_RATE = 1024.0  # G4BUILD_MIN_RATE, bytes/s averaged over RATE_WINDOW_S; slower streams are retried; 0: none
RATE_WINDOW_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Limits:
    """How long a download may take in all, and how slow a stream may run before it counts as broken."""

    deadline_s: float = DOWNLOAD_DEADLINE_S
    min_rate: float = MIN_RATE
    rate_window_s: float = RATE_WINDOW_S

    @classmethod
    def from_env(cls) -> Limits:
        return cls(deadline_s=_env_seconds("G4BUILD_DOWNLOAD_DEADLINE", DOWNLOAD_DEADLINE_S),
                   min_rate=_env_seconds("G4BUILD_MIN_RATE", MIN_RATE, "bytes per second", off="no minimum"))


@dataclass(frozen=True, kw_only=True)
class _Arrived:
    sha256: str
    size: int
    complete: bool  # the length is known (Content-Length or the index's size) and all of it arrived


class _DeadlinePassed(Exception):
    pass


def _chunks(resp: requests.Response, limits: Limits, end: float) -> Iterator[bytes]:
    """The body as it arrives, a read at a time, checking the overall deadline and the rate between reads."""
    import urllib3

    raw = resp.raw
    # read1 returns what has arrived (urllib3 >= 2.3): a trickling server cannot hold one read for long
    read = getattr(raw, "read1", None) or raw.read
    window_start, window_bytes = time.monotonic(), 0
    while True:
        try:
            data = read(READ, decode_content=True)
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # what requests' iter_content would wrap
            if time.monotonic() > end:
                raise _DeadlinePassed from exc
            raise _CutShort(f"the stream broke off: {exc}") from exc
        if not data:
            return
        now = time.monotonic()
        if now > end:
            raise _DeadlinePassed
        window_bytes += len(data)
        if limits.min_rate > 0 and now - window_start >= limits.rate_window_s:  # 0: no minimum rate
            rate = window_bytes / (now - window_start)
            if rate < limits.min_rate:
                raise _TooSlow(f"the stream ran at {rate:.0f} bytes/s over {now - window_start:.1f} s, below the "
                               f"minimum of {limits.min_rate:g} bytes/s (G4BUILD_MIN_RATE)")
            window_start, window_bytes = now, 0
        yield data


def _stream_to(
    http: requests.Session, url: str, part: Path, progress: ProgressHook | None, *, size: int | None,
    limits: Limits, end: float,
) -> _Arrived:
    """One attempt: stream ``url`` into ``part``; return the sha256 and length of what arrived."""
    import requests

    h = hashlib.sha256()
    left = end - time.monotonic()
    if left <= 0:
        raise _DeadlinePassed
    # each read waits at most until the deadline: a server that stops sending cannot outlive it
    resp = http.get(url, stream=True, timeout=(min(15.0, left), min(120.0, left)))
    with resp:
        if resp.status_code >= 500:
            raise requests.ConnectionError(f"server answered {resp.status_code}")
        if resp.status_code != 200:
            raise DownloadError(f"download of {url} failed: expected HTTP 200, found {resp.status_code}",
                                hint="run the command again; it starts from scratch")
        length = (resp.headers.get("Content-Length") or "").strip()
        total = (int(length) if length.isdigit() else 0) or size  # a malformed length counts as none
        done = 0
        with part.open("wb") as out:
            for chunk in _chunks(resp, limits, end):
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        if total is not None and done != total:
            raise _CutShort(f"the stream ended after {done} of {total} bytes")
    return _Arrived(sha256=h.hexdigest(), size=done, complete=total is not None)


def _deadline_error(url: str, limits: Limits) -> DownloadError:
    return DownloadError(
        f"download of {url} did not finish within {limits.deadline_s:g} s (G4BUILD_DOWNLOAD_DEADLINE)",
        hint="the server or the network is too slow: try a closer mirror (PIP_INDEX_URL), or raise "
             "G4BUILD_DOWNLOAD_DEADLINE",
    )


def download(
    url: str, dest: Path, sha256: str, *, progress: ProgressHook | None = None, attempts: int = DOWNLOAD_ATTEMPTS,
    size: int | None = None, limits: Limits | None = None,
) -> None:
    """Stream ``url`` to ``dest`` via ``dest.part``; verify sha256, then rename into place.

    A broken stream (cut short, stalled, below the minimum rate, a connection error) is fetched again from the
    start (``attempts`` in all) until the overall deadline. A sha256 mismatch is called tampering only when the
    download is known to be whole: its length matched Content-Length (or the index's ``size``), or, with no
    length to go by, two attempts brought the very same bytes. Only a verified file is renamed into place.
    """
    import requests

    limits = limits or Limits.from_env()
    size = size if isinstance(size, int) and size > 0 else None  # the index's size is only a hint
    want = sha256.lower()
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    http = requests.Session()
    end = time.monotonic() + limits.deadline_s
    seen: set[tuple[str, int]] = set()  # what attempts of unknown length brought
    delay = 1.0
    try:
        for attempt in range(1, attempts + 1):
            try:
                got = _stream_to(http, url, part, progress, size=size, limits=limits, end=end)
                if got.sha256 == want:
                    break
                if got.complete or (got.sha256, got.size) in seen:
                    raise IntegrityError(
                        f"sha256 mismatch for {dest.name}: expected {want}, found {got.sha256} "
                        f"(a complete download of {got.size} bytes); the download was deleted",
                        hint="the index or a mirror served other bytes than the pin records; check your index-url",
                    )
                seen.add((got.sha256, got.size))
                raise _CutShort(f"the stream ended after {got.size} bytes with no length to check them against, "
                                "and they do not hash right")
            except _DeadlinePassed:
                raise _deadline_error(url, limits) from None
            except (requests.RequestException, _CutShort) as exc:
                part.unlink(missing_ok=True)
                if time.monotonic() >= end:
                    raise _deadline_error(url, limits) from exc
                if attempt == attempts or time.monotonic() + delay > end:
                    raise DownloadError(
                        f"download of {url} failed {attempt} time(s), last: {exc}",
                        hint="check the network or the mirror, then run the command again; it starts from scratch"
                             + (" (G4BUILD_MIN_RATE sets the slowest rate accepted)"
                                if isinstance(exc, _TooSlow) else ""),
                    ) from exc
                time.sleep(delay)
                delay *= 2
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest)


@dataclass(frozen=True, kw_only=True)
class Fetched:
    path: Path
    sha256: str
    cached: bool


def fetch_verified(
    project: str, filename: str, sha256: str | None, *, cache_dir: Path, progress: ProgressHook | None = None,
) -> Fetched:
    """Return a verified copy of ``filename`` from the cache, downloading it once if needed.

    ``sha256=None`` means "trust the sha256 the index publishes" (used for releases nobody pinned yet).
    A cached file is re-hashed before use; a cached file with the right hash needs no network at all.
    """
    why = file_name_problem(filename)
    if why:  # a name decides a cache path: one that could leave cache_dir is never joined to it
        raise UsageError(f"{filename!r} is not a file name a package index serves: it has {why}",
                         hint="expected a plain name such as vllm-0.21.0.tar.gz")
    dest = cache_dir / filename
    with cache_lock(dest):
        if sha256 and dest.is_file():
            if sha256_file(dest) == sha256.lower():
                return Fetched(path=dest, sha256=sha256.lower(), cached=True)
            dest.unlink()  # a corrupted cache entry is never used
        entry = find_file(project, filename)
        if sha256 is None:
            if not entry.sha256:
                raise IntegrityError(
                    f"the index publishes no sha256 for {filename}; expected one to verify it against",
                    hint="pin the release with its sha256 in patches/pins.yaml, or use an index that publishes hashes",
                )
            sha256 = entry.sha256
            if dest.is_file() and sha256_file(dest) == sha256.lower():
                return Fetched(path=dest, sha256=sha256.lower(), cached=True)
        elif entry.sha256 and entry.sha256.lower() != sha256.lower():
            raise IntegrityError(
                f"the index publishes sha256 {entry.sha256} for {filename}, the pin expects {sha256}",
                hint="the pin or the mirror is wrong; nothing was downloaded",
            )
        download(entry.url, dest, sha256, progress=progress, size=entry.size)
        return Fetched(path=dest, sha256=sha256.lower(), cached=False)
