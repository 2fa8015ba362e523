"""The index pages as pure functions: values from a wheel are escaped wherever they land, links are quoted,
the order does not depend on the folder's, and the same entries give the same bytes."""

from __future__ import annotations

import json
import re
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
    assert "--extra-index-url &lt;PyTorch&#x27;s cu130 wheel index&gt;" in page  # no --torch-index: named, no URL
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


def test_cu_tag() -> None:
    assert cu_tag("13.0") == "cu130" and cu_tag("12.9") == "cu129" and cu_tag("") is None and cu_tag("x.y") is None
