"""A package index's project page (PEP 691 JSON or PEP 503 HTML) read into typed entries.

The page is upstream material: a file name it gives becomes a cache path and a pinned value, so each is checked
against a safe character set (no separator, no ``..``, no control character, whatever the encoding: HTML
entities are decoded before the check) and entries that fail are set aside with why, never used. Hashes are
64 hex digits or absent; sizes are integers or absent; links are http(s) (or relative to the page).
"""

from __future__ import annotations

import html.parser
import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from g4build.errors import DownloadError
from g4build.util.safetext import file_name_problem

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_HINT = "the index (or a mirror) serves a malformed page: check pip's index-url (PIP_INDEX_URL / pip config)"


@dataclass(frozen=True, kw_only=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None = None
    yanked: bool = False


@dataclass(frozen=True, kw_only=True)
class Page:
    files: list[IndexFile]
    refused: list[str] = field(default_factory=list)  # "<name as given>: why", for entries set aside


class _LinkParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()  # convert_charrefs: entities (&#47; for '/') are decoded before a name is checked
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append(("".join(self._text).strip(), self._href))
            self._href = None


def _url(page: str, href: str) -> str | None:
    """The absolute http(s) URL of a link, or None for another scheme (file:, javascript:, data:, ...)."""
    url = urllib.parse.urljoin(page, href)
    return url if urllib.parse.urlsplit(url).scheme in ("http", "https") else None


def _entry(page: str, name: Any, href: Any, sha: Any, size: Any, yanked: Any, refused: list[str]) -> IndexFile | None:
    shown = name if isinstance(name, str) else repr(name)
    if not isinstance(name, str):
        refused.append(f"{shown}: the file name is not text")
        return None
    why = file_name_problem(name)
    if why:
        refused.append(f"{name!r}: the file name has {why}")
        return None
    url = _url(page, href) if isinstance(href, str) else None
    if url is None:
        refused.append(f"{name}: the link {href!r} is not an http(s) URL")
        return None
    if sha is not None and not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        refused.append(f"{name}: the sha256 {sha!r} is not 64 hex digits")
        return None
    return IndexFile(filename=name, url=url, sha256=sha.lower() if sha else None,
                     size=size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
                     yanked=bool(yanked) if isinstance(yanked, (bool, str)) else False)


def parse_json(page: str, body: bytes) -> Page:
    """A PEP 691 page; a structure other than the PEP's is a DownloadError, an unsafe entry is set aside."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise DownloadError(f"the package index page {page} is not valid JSON: {exc}", hint=_HINT) from exc
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        found = type(data).__name__ if not isinstance(data, dict) else f"'files' as {type(files).__name__}"
        raise DownloadError(f"the package index page {page}: expected a JSON object with a 'files' list "
                            f"(PEP 691), found {found}", hint=_HINT)
    out: list[IndexFile] = []
    refused: list[str] = []
    for n, f in enumerate(files):
        if not isinstance(f, dict):
            refused.append(f"files[{n}]: expected an object, found {type(f).__name__}")
            continue
        hashes = f.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        entry = _entry(page, f.get("filename"), f.get("url"), sha, f.get("size"), f.get("yanked"), refused)
        if entry is not None:
            out.append(entry)
    return Page(files=out, refused=refused)


def parse_html(page: str, text: str) -> Page:
    """A PEP 503 page: each link's text is its file name, ``#sha256=`` on the href its hash."""
    parser = _LinkParser()
    try:
        parser.feed(text)
        parser.close()
    except (ValueError, AssertionError) as exc:  # html.parser's own complaints
        raise DownloadError(f"the package index page {page} is not readable HTML: {exc}", hint=_HINT) from exc
    out: list[IndexFile] = []
    refused: list[str] = []
    for name, href in parser.links:
        url, _, frag = href.partition("#")
        sha = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
        entry = _entry(page, name, url, sha, None, False, refused)
        if entry is not None:
            out.append(entry)
    return Page(files=out, refused=refused)
