"""The index pages as pure functions: values from a wheel are escaped wherever they land, links are quoted,
the order does not depend on the folder's, and the same entries give the same bytes."""

from __future__ import annotations

import html
import json
import re
import subprocess
from html.parser import HTMLParser

import pytest

from g4build.errors import ValidationError
from g4build.index.entry import Build, WheelEntry, build_of, safe_filename
from g4build.index.pages import SiteOptions, cu_tag, render_site

HOSTILE = '"><script>alert(1)</script>&amp;'


def _entry(version: str, *, build: Build | None = None, requires: str | None = ">=3.10") -> WheelEntry:
    return WheelEntry(filename=f"vllm-{version}-cp38-abi3-manylinux_2_24_x86_64.whl", project="vllm",
                      version=version, sha256="ab" * 32, size=10, metadata=b"Metadata-Version: 2.1\n",
                      requires_python=requires, build=build)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.hrefs += [v or "" for k, v in attrs if k == "href"]


def test_hostile_manifest_values_stay_text() -> None:
    build = build_of({"pin": {"name": HOSTILE, "torch": HOSTILE, "cuda": "13.0"},
                      "series": [{"name": HOSTILE, "version": 1}], "target": {"arch": HOSTILE}, "route": "build"})
    site = render_site([_entry("0.21.0+cu130.g4.ab", build=build, requires=HOSTILE)],
                       SiteOptions(repo="owner/repo"))
    for path, data in site.items():
        if path.endswith(".html"):
            parsed = _Tags()
            parsed.feed(data.decode())
            assert "script" not in parsed.tags, path
            assert "<script>" not in data.decode(), path
    page = site["wheels/vllm-0.21.0+cu130.g4.ab-cp38-abi3-manylinux_2_24_x86_64.whl.html"].decode()
    assert "&lt;script&gt;" in page and "&amp;amp;" in page
    # no --torch-index: no placeholder in the command (it would break the shell), the torch named beside it
    assert "wheel index&gt;" not in page and "PyTorch's cu130 build: install it first" in page
    assert json.loads(site["simple/vllm/index.json"])["files"][0]["requires-python"] == HOSTILE


def test_links_carry_the_hashes_and_are_quoted() -> None:
    site = render_site([_entry("0.21.0+cu130.g4.ab")], SiteOptions())
    parsed = _Tags()
    parsed.feed(site["simple/vllm/index.html"].decode())
    assert parsed.hrefs == [f"../../files/vllm-0.21.0%2Bcu130.g4.ab-cp38-abi3-manylinux_2_24_x86_64.whl"
                            f"#sha256={'ab' * 32}"]
    html = site["simple/vllm/index.html"].decode()
    meta = re.search(r'data-core-metadata="sha256=([0-9a-f]{64})"', html)
    assert meta and f'data-dist-info-metadata="sha256={meta[1]}"' in html
    assert '<meta name="pypi:repository-version" content="1.1">' in html
    assert json.loads(site["simple/index.json"]) == {"meta": {"api-version": "1.1"}, "projects": [{"name": "vllm"}]}


def test_order_and_bytes_do_not_depend_on_the_input_order() -> None:
    entries = [_entry("0.9.0"), _entry("0.21.0"), _entry("0.21.0+cu129.g4.ab")]
    first = render_site(entries, SiteOptions())
    assert render_site(list(reversed(entries)), SiteOptions()) == first
    versions = json.loads(first["simple/vllm/index.json"])["versions"]
    assert versions == ["0.9.0", "0.21.0", "0.21.0+cu129.g4.ab"]
    front = first["index.html"].decode()
    assert front.index("vllm-0.21.0+cu129") < front.index("vllm-0.21.0-") < front.index("vllm-0.9.0-")


@pytest.mark.parametrize("name", ["../x-1.0-py3-none-any.whl", "a/b-1.0-py3-none-any.whl", "x-1.0#-py3-none-any.whl",
                                  "é-1.0-py3-none-any.whl", ".x-1.0-py3-none-any.whl", "x-1.0-py3-none-any.zip"])
def test_filenames_that_cannot_name_a_file_are_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        safe_filename(name)


def test_links_carry_requires_python_so_pip_skips_a_wheel_for_another_python() -> None:
    site = render_site([_entry("0.21.0", requires=">=3.10"), _entry("0.9.0", requires=None)], SiteOptions())
    html = site["simple/vllm/index.html"].decode()
    assert html.count("data-requires-python=") == 1 and 'data-requires-python="&gt;=3.10"' in html
    files = json.loads(site["simple/vllm/index.json"])["files"]
    assert [f.get("requires-python") for f in files] == [">=3.10", None]


@pytest.mark.parametrize("name", ["x..y-1.0-py3-none-any.whl", "x-1.0..2-py3-none-any.whl", "x-1.0-py3-none-any..whl"])
def test_a_double_dot_is_refused_even_where_every_character_is_allowed(name: str) -> None:
    with pytest.raises(ValidationError, match="letters, digits"):
        safe_filename(name)
    assert safe_filename("x.y-1.0-py3-none-any.whl") == "x.y-1.0-py3-none-any.whl"  # one dot at a time is fine


def test_cu_tag() -> None:
    assert cu_tag("13.0") == "cu130" and cu_tag("12.9") == "cu129" and cu_tag("") is None and cu_tag("x.y") is None


def _commands(page: str) -> list[str]:
    return [html.unescape(c) for c in re.findall(r"<pre>(.*?)</pre>", page, re.S)]


def test_install_commands_run_as_written_and_only_where_the_wheel_installs() -> None:
    """Every command on a page runs when copied (bash parses it; no placeholder), installs into the active venv
    (python -m pip, never `py -3`), and a Linux wheel's page offers no Windows command nor says "OS any"."""
    build = build_of({"pin": {"name": "vllm-0.21.0", "torch": "2.11.0", "cuda": "13.0"}, "series": [],
                      "route": "overlay"})
    linux = _entry("0.21.0+cu130.g4.ab", build=build)
    windows = WheelEntry(filename="vllm-0.21.0+cu130.g4.ab-cp312-cp312-win_amd64.whl", project="vllm",
                         version="0.21.0+cu130.g4.ab", sha256="cd" * 32, size=10, metadata=b"Metadata-Version: 2.1\n",
                         requires_python=">=3.10", build=build)
    site = render_site([linux, windows], SiteOptions(base_url="https://example.org/g4b", repo="owner/repo"))
    lpage = site[f"wheels/{linux.filename}.html"].decode()
    wpage = site[f"wheels/{windows.filename}.html"].decode()
    assert "Windows (PowerShell)" not in lpage and "<td>linux</td>" in lpage and "<td>any</td>" not in lpage
    assert "Linux and WSL" not in wpage and "<td>windows</td>" in wpage
    notes = site["install.md"].decode()
    for command in [*_commands(lpage), *_commands(wpage), *re.findall(r"```\n(.*?)\n```", notes, re.S)]:
        assert "py -3" not in command and "<" not in command, command
        if "pip install" in command:
            assert command.startswith("python -m pip install ")
        done = subprocess.run(["bash", "-n"], input=command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (command, done.stderr)
