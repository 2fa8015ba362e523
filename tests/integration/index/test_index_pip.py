"""The index site from a small real wheel, served on the loopback, installed from by real pip.

pip checks what the site publishes: the #sha256 fragment of each link (a wheel that differs is refused), the
PEP 658 metadata file's hash (pip reads it before downloading the wheel), and --require-hashes against the
hashes the site lists. The same wheels give the same bytes; a wheel that fails validation leaves no site.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from tests.support.indexsite import pip, serve_site, tiny_vllm_wheel
from tests.support.wheelsfactory import run_g4build

import g4build.index.site as site_module
from g4build.errors import UsageError, ValidationError
from g4build.index.pages import SUMMARY, SiteOptions
from g4build.index.site import build_index


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheels")
    tiny_vllm_wheel(tmp / "wheels", tmp / "work")
    return tmp / "wheels"


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def test_pip_downloads_and_installs_from_the_site_checking_hashes(wheels: Path, tmp_path: Path) -> None:
    (wheel,) = wheels.glob("*.whl")
    site = tmp_path / "site"
    result = build_index(wheels, site, SiteOptions(base_url="https://example.invalid/g4"))
    (entry,) = result.entries
    assert entry.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert entry.build is not None and entry.build.torch == "2.11.0" and entry.build.cuda == "13.0"
    with serve_site(site) as served:
        index = f"{served.url}/simple/"
        (tmp_path / "req.txt").write_text(f"vllm=={_version(wheel)} --hash=sha256:{entry.sha256}\n")
        done = pip("download", "--no-deps", "--index-url", index, "--require-hashes", "-r", "req.txt",
                   "-d", str(tmp_path / "dl"), cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (tmp_path / "dl" / wheel.name).read_bytes() == wheel.read_bytes()
        done = pip("install", "--no-deps", "--index-url", index, "--target", str(tmp_path / "t"),
                   f"vllm=={_version(wheel)}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        # pip read the PEP 658 metadata before it fetched the wheel
        assert served.hits[f"/files/{quote(wheel.name)}.metadata"] >= 1, served.hits
        assert served.hits[f"/files/{quote(wheel.name)}"] >= 1, served.hits
    installed = (tmp_path / "t" / "vllm" / "__init__.py").read_text()
    assert _version(wheel) in installed
    (dist,) = (tmp_path / "t").glob("vllm-*.dist-info")
    assert (dist / "build-manifest.json").is_file()


def test_pip_refuses_a_wheel_that_differs_from_the_index_hash(wheels: Path, tmp_path: Path) -> None:
    (wheel,) = wheels.glob("*.whl")
    site = tmp_path / "site"
    (entry,) = build_index(wheels, site, SiteOptions()).entries
    served_wheel = site / "files" / wheel.name
    with zipfile.ZipFile(served_wheel, "a") as zf:  # still a readable zip, one member more
        zf.writestr("vllm/planted.py", "print('not what the index published')\n")
    with serve_site(site) as served:
        done = pip("install", "--no-deps", "--index-url", f"{served.url}/simple/", "--target",
                   str(tmp_path / "t"), f"vllm=={_version(wheel)}", cwd=tmp_path)
    assert done.returncode != 0
    # the hash pip expected is the one the index's link published
    assert "DO NOT MATCH THE HASHES" in done.stderr and f"Expected sha256 {entry.sha256}" in done.stderr, done.stderr
    assert not (tmp_path / "t" / "vllm" / "planted.py").exists()


def test_pip_refuses_metadata_that_differs_from_its_published_hash(wheels: Path, tmp_path: Path) -> None:
    (wheel,) = wheels.glob("*.whl")
    site = tmp_path / "site"
    (entry,) = build_index(wheels, site, SiteOptions()).entries
    meta = site / "files" / f"{wheel.name}.metadata"
    meta.write_bytes(meta.read_bytes().replace(b"Requires-Dist: torch==2.11.0", b"Requires-Dist: torch==9.9"))
    with serve_site(site) as served:
        done = pip("install", "--no-deps", "--index-url", f"{served.url}/simple/", "--target",
                   str(tmp_path / "t"), f"vllm=={_version(wheel)}", cwd=tmp_path)
    assert done.returncode != 0
    # pip held the metadata file against the hash data-core-metadata published, before fetching the wheel
    assert f"Expected sha256 {entry.metadata_sha256}" in done.stderr, done.stderr
    assert not (tmp_path / "t").exists()


def test_same_wheels_give_the_same_bytes(wheels: Path, tmp_path: Path) -> None:
    options = SiteOptions(base_url="https://example.invalid/g4", repo="owner/repo")
    build_index(wheels, tmp_path / "a", options)
    build_index(wheels, tmp_path / "b", options)
    first = _tree(tmp_path / "a")
    assert first == _tree(tmp_path / "b")
    build_index(wheels, tmp_path / "a", options)  # a rebuild over the earlier site
    assert _tree(tmp_path / "a") == first
    page = json.loads(first["simple/vllm/index.json"])
    (f,) = page["files"]
    assert f["hashes"]["sha256"] == hashlib.sha256(first[f"files/{f['filename']}"]).hexdigest()
    assert f["core-metadata"]["sha256"] == hashlib.sha256(first[f"files/{f['filename']}.metadata"]).hexdigest()


def test_a_wheel_that_fails_validation_leaves_the_earlier_site_whole(wheels: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    before = _tree(site)
    bad = tmp_path / "bad"
    bad.mkdir()
    (wheel,) = wheels.glob("*.whl")
    broken = bad / wheel.name
    broken.write_bytes(wheel.read_bytes())
    with zipfile.ZipFile(broken, "a") as zf:  # a member RECORD does not list
        zf.writestr("vllm/unrecorded.py", "X = 1\n")
    with pytest.raises(ValidationError, match=r"1 of 1 wheel\(s\) failed validation, so no index was written"):
        build_index(bad, site, SiteOptions())
    assert _tree(site) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".g4build-")] == []


def test_the_site_replaces_only_an_earlier_site(wheels: Path, tmp_path: Path) -> None:
    keep = tmp_path / "home"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine\n")
    with pytest.raises(UsageError, match="no g4build index site"):
        build_index(wheels, keep, SiteOptions())
    assert (keep / "notes.txt").read_text() == "mine\n"
    with pytest.raises(UsageError, match="folder the wheels are read from"):
        build_index(wheels, wheels, SiteOptions())
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (wheel,) = wheels.glob("*.whl")
    (hostile / "a&b<i>-1.0-cp38-abi3-manylinux_2_24_x86_64.whl").write_bytes(wheel.read_bytes())
    with pytest.raises(ValidationError, match="letters, digits"):
        build_index(hostile, tmp_path / "out", SiteOptions())
    assert not (tmp_path / "out").exists()


def test_cli_json(wheels: Path, tmp_path: Path) -> None:
    done = run_g4build("index", "build", str(wheels), "--out", str(tmp_path / "site"), "--repo", "owner/repo",
                       "--torch-index", "https://torch.invalid/whl/{cu}", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    (w,) = out["wheels"]
    assert out["projects"] == ["vllm"] and w["build"]["pin"] == "vllm-0.21.0"
    assert (tmp_path / "site" / SUMMARY).is_file()
    page = (tmp_path / "site" / "wheels" / f"{w['filename']}.html").read_text()
    assert f"gh attestation verify {w['filename']} --repo owner/repo" in page
    assert "--extra-index-url https://torch.invalid/whl/cu130" in page
    bad = run_g4build("index", "build", str(tmp_path / "nothing"), "--out", str(tmp_path / "s2"), "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["exit_code"] == 2


def test_wheels_served_apart_from_the_pages(wheels: Path, tmp_path: Path) -> None:
    """The nightly's layout: pages on one host (GitHub Pages), wheels and .metadata as release assets."""
    (wheel,) = wheels.glob("*.whl")
    root = tmp_path / "root"
    root.mkdir()
    with serve_site(root) as served:
        site = root / "pages"
        (entry,) = build_index(wheels, site, SiteOptions(files_url=f"{served.url}/assets/")).entries
        (site / "files").rename(root / "assets")  # what the workflow uploads to the release
        (tmp_path / "req.txt").write_text(f"vllm=={entry.version} --hash=sha256:{entry.sha256}\n")
        done = pip("download", "--no-deps", "--index-url", f"{served.url}/pages/simple/", "--require-hashes",
                   "-r", "req.txt", "-d", str(tmp_path / "dl"), cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        done = pip("install", "--no-deps", "--index-url", f"{served.url}/pages/simple/", "--target",
                   str(tmp_path / "t"), f"vllm=={entry.version}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert served.hits[f"/assets/{quote(wheel.name)}.metadata"] >= 1, served.hits
    assert (tmp_path / "dl" / wheel.name).read_bytes() == wheel.read_bytes()
    assert not any(path.startswith("/pages/files/") for path in served.hits)


def test_an_interrupt_while_writing_the_pages_leaves_the_earlier_site(
    wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = tmp_path / "site"
    build_index(wheels, site, SiteOptions())
    before = _tree(site)
    real = site_module.render_site

    def interrupted(*args: object, **kwargs: object) -> Iterator[tuple[str, bytes]]:
        pages = real(*args, **kwargs)  # type: ignore[arg-type]

        class Half(dict[str, bytes]):
            def items(self) -> Iterator[tuple[str, bytes]]:  # type: ignore[override]
                for i, item in enumerate(dict.items(pages)):
                    if i == 3:
                        raise KeyboardInterrupt
                    yield item

        return Half(pages)  # type: ignore[return-value]

    monkeypatch.setattr(site_module, "render_site", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_index(wheels, site, SiteOptions(base_url="https://example.invalid/other"))
    assert _tree(site) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".g4build-")] == []


def test_a_wheel_with_an_invalid_requires_python_is_refused(tmp_path: Path) -> None:
    tiny_vllm_wheel(tmp_path / "w", tmp_path / "pack", requires_python=">=3.8<script>")
    with pytest.raises(ValidationError, match=re.escape("Requires-Python '>=3.8<script>' is no version specifier")):
        build_index(tmp_path / "w", tmp_path / "out", SiteOptions())
    assert not (tmp_path / "out").exists()
