"""The site's files as bytes, from the wheels' entries: pure functions, same input, same bytes.

Layout (every link relative, so the folder can be served from any URL)::

    index.html                       the human page: every wheel, its pin, series, torch, CUDA, how to install
    wheels/<file>.html               one human page per wheel
    simple/index.html, index.json    PEP 503 / PEP 691 project list
    simple/<project>/index.html      PEP 503 links with #sha256= and data-core-metadata (PEP 658, PEP 714)
    simple/<project>/index.json      the same as PEP 691 JSON (api-version 1.1)
    files/<file>, files/<file>.metadata

Every value that came from a wheel passes ``html.escape`` (text and attributes) or ``urllib.parse.quote``
(links) on its way into a page, and ``markdown_text`` on its way into install.md (release notes): there no
character of it can open a tag, a code span or fence, a link or a heading. The option values in the copy-paste
commands were checked by ``site.check_options`` and are quoted for the shell the command is for all the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

from packaging.version import Version

from g4build.index.entry import WheelEntry
from g4build.util.shellquote import bash_word, ps_quote

API_VERSION = "1.1"
# Without --torch-index the commands name no torch index (a placeholder would break the shell that runs them):
# the page says which torch and CUDA line the wheel needs, from the index the user's pip is set up with.
SUMMARY = "g4build-index.json"  # the site's own record of what it lists and of every file it wrote
# The summary's mark that the folder is a site ``index build`` wrote: the ownership check reads it (with the
# summary's list of files) before a rebuild replaces the folder.
MARKER = "g4build index site, v1"
INSTALL_NOTES = "install.md"  # install and verify commands as Markdown (the nightly's release notes)


@dataclass(frozen=True, kw_only=True)
class SiteOptions:
    base_url: str | None = None  # where the site will be served (install commands); None: a placeholder
    repo: str | None = None  # OWNER/NAME whose workflow attests the wheels (verify commands); None: a placeholder
    # where the wheels and their .metadata files are served when not from the site's files/ (release assets:
    # GitHub Pages takes no file over 100 MB); None: relative links to files/
    files_url: str | None = None
    torch_index: str | None = None  # a package index of CUDA builds of torch, {cu} in it (cu130, cu129, ...)


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()


def _link(*parts: str) -> str:
    return "/".join(quote(p, safe="") for p in parts)


def ordered(entries: Iterable[WheelEntry]) -> list[WheelEntry]:
    """By project, newest version first, then by filename: one order for every page, whatever order the folder
    listed them in (each sort is stable, so the later keys win)."""
    listed = sorted(entries, key=lambda e: e.filename)
    listed.sort(key=lambda e: Version(e.version), reverse=True)
    listed.sort(key=lambda e: e.project)
    return listed


def file_url(entry: WheelEntry, options: SiteOptions, *, up: str) -> str:
    """The link to ``entry``'s wheel from a page ``up`` levels below the root ('../', '../../')."""
    if options.files_url:
        return f"{options.files_url.rstrip('/')}/{_link(entry.filename)}"
    return f"{up}files/{_link(entry.filename)}"


_CUDA = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})", re.ASCII)


def cu_tag(cuda: str) -> str | None:
    """``13.0`` -> ``cu130``; None when the text is no MAJOR.MINOR of ASCII digits (``str.isdigit`` would take
    other scripts' digits, which then reach the torch-index commands)."""
    m = _CUDA.fullmatch(cuda)
    return f"cu{m[1]}{m[2]}" if m else None


def torch_index_of(entry: WheelEntry, options: SiteOptions) -> str | None:
    cu = cu_tag(entry.build.cuda) if entry.build else None
    return options.torch_index.replace("{cu}", cu) if cu and options.torch_index else None


def wheel_os(entry: WheelEntry) -> str:
    """What the wheel installs on, from its platform tags: windows, linux (WSL too) or any."""
    platforms = set(entry.filename.removesuffix(".whl").rsplit("-", 1)[-1].split("."))  # compressed tag sets
    if platforms and all(p.startswith("win") for p in platforms):
        return "windows"
    if platforms and all(p.startswith(("manylinux", "musllinux", "linux")) for p in platforms):
        return "linux"
    return "any"


def _base(options: SiteOptions) -> str:
    return options.base_url.rstrip("/") if options.base_url else "https://YOUR-INDEX"


_PLAIN_PS = re.compile(r"[A-Za-z0-9_./:=+-]+", re.ASCII)


def _word(value: str, *, windows: bool) -> str:
    """``value`` as one word of a bash or PowerShell command: bare when nothing in it is special there."""
    if windows:
        return value if _PLAIN_PS.fullmatch(value) else ps_quote(value)
    return bash_word(value)


def install_command(entry: WheelEntry, options: SiteOptions, *, windows: bool = False) -> str:
    """The install command, into the active venv (``python -m pip``: `py -3` would pick an interpreter outside
    it), its URLs quoted for the shell it is shown for (``windows``: PowerShell)."""
    torch_index = torch_index_of(entry, options)
    if torch_index:
        torch_index = _word(torch_index, windows=windows)
    extra = f" --extra-index-url {torch_index}" if torch_index else ""
    return (f'python -m pip install "{entry.project}=={entry.version}" '
            f"--extra-index-url {_word(_base(options) + '/simple/', windows=windows)}{extra}")


def _install_html(entry: WheelEntry, options: SiteOptions) -> str:
    """The install commands for the OS the wheel installs on (a Linux wheel's page offers no Windows command)."""
    shells = {"linux": ["Linux and WSL"], "windows": ["Windows (PowerShell)"]}.get(
        wheel_os(entry), ["Linux and WSL", "Windows (PowerShell)"])
    return "".join(f"<p>{where}:</p>\n<pre>{escape(install_command(entry, options))}</pre>\n" for where in shells)


def _torch_note(entry: WheelEntry, options: SiteOptions) -> str:
    b = entry.build
    if b is None or not b.torch:
        return ""
    index = torch_index_of(entry, options)
    cu = cu_tag(b.cuda) or b.cuda
    if index:
        return (f"torch {escape(b.torch)} for this wheel comes from PyTorch's index for its CUDA line: "
                f"<code>{escape(index)}</code>")
    return (f"torch {escape(b.torch)} for this wheel is PyTorch's {escape(cu)} build: install it first, or set "
            f"your pip up with PyTorch's {escape(cu)} index (its address is on PyTorch's install page)")


def verify_command(entry: WheelEntry, options: SiteOptions) -> str:
    return f"gh attestation verify {bash_word(entry.filename)} --repo {bash_word(options.repo or 'OWNER/REPO')}"


# What the pages say of provenance: nothing here verified an attestation, so none is claimed.
ATTESTATION_NOTE = (
    "g4build index build did not verify a provenance attestation: it checked each wheel itself (names, "
    "metadata, RECORD hashes, series), not who built it. If the workflow that built a wheel attests it (g4build's "
    "nightly does), check that on the downloaded file with the GitHub CLI:")


# Markdown: every ASCII punctuation character may be backslash-escaped (CommonMark); '<', '>', '&' and quotes
# become entities; line breaks and other control characters become a space, so a value stays on its line.
_MD_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;", '"': "&quot;", "'": "&#39;"}
_MD_PUNCT = frozenset("!#$%()*+,-./:;=?@[\\]^_`{|}~")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def markdown_text(value: str) -> str:
    """``value`` as inert Markdown text: it renders as the characters it holds, nothing else."""
    flat = _CONTROL.sub(" ", value)
    return "".join(_MD_ENTITIES.get(c) or (f"\\{c}" if c in _MD_PUNCT else c) for c in flat)


_HEAD = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
         '<meta name="pypi:repository-version" content="{api}">\n<title>{title}</title>\n</head>\n<body>\n')
_TAIL = "</body>\n</html>\n"


def _page(title: str, body: str) -> bytes:
    return (_HEAD.format(api=API_VERSION, title=escape(title)) + body + _TAIL).encode()


def simple_root(projects: list[str]) -> dict[str, bytes]:
    links = "".join(f'<a href="{_link(p)}/">{escape(p)}</a><br>\n' for p in projects)
    return {
        "simple/index.html": _page("Simple index", f"<h1>Simple index</h1>\n{links}"),
        "simple/index.json": _json({"meta": {"api-version": API_VERSION}, "projects": [{"name": p} for p in projects]}),
    }


def simple_project(project: str, entries: list[WheelEntry], options: SiteOptions) -> dict[str, bytes]:
    links, files = [], []
    for e in entries:
        href = file_url(e, options, up="../../")
        attrs = [f'href="{escape(href)}#sha256={e.sha256}"']
        if e.requires_python:
            attrs.append(f'data-requires-python="{escape(e.requires_python)}"')
        meta = f"sha256={e.metadata_sha256}"
        # PEP 714's name, and PEP 658's for the pip releases that predate it
        attrs += [f'data-core-metadata="{meta}"', f'data-dist-info-metadata="{meta}"']
        links.append(f"<a {' '.join(attrs)}>{escape(e.filename)}</a><br>\n")
        item: dict[str, Any] = {
            "filename": e.filename, "url": href, "hashes": {"sha256": e.sha256}, "size": e.size,
            "core-metadata": {"sha256": e.metadata_sha256}, "dist-info-metadata": {"sha256": e.metadata_sha256},
        }
        if e.requires_python:
            item["requires-python"] = e.requires_python
        files.append(item)
    title = f"Links for {project}"
    versions = sorted({e.version for e in entries}, key=Version)
    return {
        f"simple/{project}/index.html": _page(title, f"<h1>{escape(title)}</h1>\n{''.join(links)}"),
        f"simple/{project}/index.json": _json({"meta": {"api-version": API_VERSION}, "name": project,
                                               "versions": versions, "files": files}),
    }


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>\n" for k, v in pairs)


def wheel_page(entry: WheelEntry, options: SiteOptions) -> bytes:
    b = entry.build
    facts = [("project", entry.project), ("version", entry.version)]
    if b is not None:
        facts += [("pin", b.pin), ("series", ", ".join(b.series) or "none"), ("torch", b.torch),
                  ("CUDA", b.cuda), ("GPU arch", b.arch or "as the pin's upstream wheel"),
                  ("OS", b.os or wheel_os(entry)),
                  ("g4build route", b.route), ("digest", b.digest)]
    else:
        facts.append(("build manifest", "none: the wheel does not say what made it"))
    facts += [("requires Python", entry.requires_python or "any"), ("sha256", entry.sha256),
              ("size", f"{entry.size} bytes")]
    href = file_url(entry, options, up="../")
    note = _torch_note(entry, options)
    torch_line = f"<p>{note}</p>\n" if note else ""
    body = (
        f"<h1>{escape(entry.filename)}</h1>\n<table>\n{_rows(facts)}</table>\n"
        f'<p><a href="{escape(href)}#sha256={entry.sha256}">download</a> · '
        f'<a href="{escape(href)}.metadata">METADATA</a></p>\n'
        f"<h2>Install</h2>\n{_install_html(entry, options)}"
        f"{torch_line}"
        f"<h2>Verify</h2>\n<p>{escape(ATTESTATION_NOTE)}</p>\n"
        f"<pre>{escape(verify_command(entry, options))}</pre>\n"
    )
    return _page(entry.filename, body)


def front_page(entries: list[WheelEntry], options: SiteOptions) -> bytes:
    rows = []
    for e in entries:
        b = e.build
        cells = [e.version, b.pin if b else "", b.torch if b else "", b.cuda if b else "", b.arch if b else "",
                 e.sha256]
        rows.append(f'<tr><td><a href="wheels/{escape(_link(e.filename))}.html">{escape(e.filename)}</a></td>'
                    + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>\n")
    head = "".join(f"<th>{h}</th>" for h in ("wheel", "version", "pin", "torch", "CUDA", "arch", "sha256"))
    body = (
        "<h1>g4build wheels</h1>\n"
        f"<p>A PEP 503 package index: <code>{escape(_base(options))}/simple/</code>. Each wheel's page names the "
        "pin, series, torch and CUDA it was made for and the exact install and verify commands.</p>\n"
        f"<table>\n<tr>{head}</tr>\n{''.join(rows)}</table>\n"
    )
    return _page("g4build wheels", body)


def install_notes(entries: list[WheelEntry], options: SiteOptions) -> bytes:
    """Markdown for release notes: per wheel, what it needs, how to install it, how to verify it."""
    md = markdown_text
    lines = ["## Install", "",
             f"Package index: {md(_base(options) + '/simple/')} (add it to pip with `--extra-index-url`; the torch "
             "a wheel needs comes from PyTorch's index for its CUDA line, named in each command).", ""]
    for e in entries:
        b = e.build
        needs = (f"pin {md(b.pin)}, torch {md(b.torch)}, CUDA {md(b.cuda)}, series: "
                 f"{md(', '.join(b.series) or 'none')}") if b else "no build manifest"
        shells = {"linux": [("Linux / WSL", False)], "windows": [("Windows (PowerShell)", True)]}.get(
            wheel_os(e), [("Linux / WSL", False), ("Windows (PowerShell)", True)])
        lines += [f"### {md(e.filename)}", "", f"- {needs}", f"- sha256 `{e.sha256}`", ""]
        for where, windows in shells:
            lines += [f"{where}:", "```", install_command(e, options, windows=windows), "```"]
        lines.append("")
    lines += ["## Verify", "", ATTESTATION_NOTE, "", "```",
              *(verify_command(e, options) for e in entries), "```", "",
              "The release is immutable once published: its files cannot be replaced.", ""]
    return "\n".join(lines).encode()


def summary(entries: list[WheelEntry], options: SiteOptions, site_files: list[str]) -> dict[str, Any]:
    return {"generator": "g4build index", "marker": MARKER, "base_url": options.base_url, "repo": options.repo,
            "files_url": options.files_url, "site_files": site_files,
            "wheels": [e.to_dict() for e in entries]}


def render_site(entries: Iterable[WheelEntry], options: SiteOptions) -> dict[str, bytes]:
    """Every page of the site (not the wheels themselves), by path relative to the site's root."""
    listed = ordered(entries)
    projects = sorted({e.project for e in listed})
    files: dict[str, bytes] = {"index.html": front_page(listed, options), INSTALL_NOTES: install_notes(listed, options)}
    files.update(simple_root(projects))
    for project in projects:
        files.update(simple_project(project, [e for e in listed if e.project == project], options))
    for e in listed:
        files[f"wheels/{e.filename}.html"] = wheel_page(e, options)
        files[f"files/{e.filename}.metadata"] = e.metadata
    # every file of the site (the wheels' copies too): what a rebuild may replace, and nothing else
    site_files = sorted({*files, *(f"files/{e.filename}" for e in listed)})
    files[SUMMARY] = _json(summary(listed, options, site_files))
    return files
