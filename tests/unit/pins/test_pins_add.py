"""`g4build pins add`: a pin read from the package index and the release's real sdist, written into pins.yaml.

Most tests serve the index from loopback (tests/support/index_server.py) with the real release sdist (fetched
once into the user's g4build cache, hence `network`; offline afterwards); one reads the real index.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from tests.support.index_server import LocalIndex, serve_index

from g4build.errors import ConfigError, UsageError
from g4build.pins.add import wheel_key
from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import Pin, load_pins
from g4build.pins.pinsfile import write_pin

REPO = Path(__file__).resolve().parents[3]
PINS_TEXT = (REPO / "patches" / "pins.yaml").read_text(encoding="utf-8")
REAL = load_pins(REPO / "patches" / "pins.yaml")


def _without(text: str, name: str) -> str:
    """pins.yaml text with one pin's block (and the blank line before it) cut out."""
    lines = text.splitlines(keepends=True)
    start = lines.index(f"  {name}:\n")
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith("  ") and not
                lines[n].startswith("   ") and lines[n].strip() and not lines[n].lstrip().startswith("#")), len(lines))
    while end > start and not lines[end - 1].strip():
        end -= 1
    if start > 0 and not lines[start - 1].strip():
        start -= 1
    return "".join(lines[:start] + lines[end:])


def _project(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "pins.yaml").write_text(text, encoding="utf-8")
    shutil.copy(REPO / "patches" / "series.yaml", root / "patches" / "series.yaml")
    return root


def _g4build(tmp_path: Path, index: LocalIndex | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, G4BUILD_CACHE=str(tmp_path / "cache"), G4BUILD_PLAIN="1")
    if index is not None:
        env["PIP_INDEX_URL"] = index.url
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def _publish_wheels(index: LocalIndex, pin: Pin) -> None:
    # The index page lists each wheel with its sha256; `pins add` never downloads a wheel, so none is served.
    for ref in pin.wheels.values():
        index.add(ref.file, b"", publish_sha256=ref.sha256)


@pytest.fixture(scope="module")
def sdist33() -> Path:
    pin = REAL.get("vllm-0.33.0")
    return fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path


@pytest.fixture(scope="module")
def sdist21() -> Path:
    pin = REAL.get("vllm-0.21.0")
    return fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path


@pytest.fixture
def index() -> Iterator[LocalIndex]:
    with serve_index() as idx:
        yield idx


# --- writing pins.yaml (no index needed) -----------------------------------------------------------------


def test_reinserting_a_cut_pin_gives_back_the_file_byte_for_byte(tmp_path: Path) -> None:
    path = _project(tmp_path, _without(PINS_TEXT, "vllm-0.33.0")) / "patches" / "pins.yaml"
    cut = load_pins(path)
    assert "vllm-0.33.0" not in cut.pins
    write_pin(REAL.get("vllm-0.33.0"), cut)
    assert path.read_text(encoding="utf-8") == PINS_TEXT
    assert sorted(p.name for p in path.parent.iterdir()) == ["pins.yaml", "series.yaml"]  # no temp file left


def test_a_pin_added_meanwhile_is_kept_and_its_name_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    text = _without(PINS_TEXT, "vllm-0.21.0").replace("default: vllm-0.21.0", "default: vllm-0.33.0")
    path = _project(tmp_path, text) / "patches" / "pins.yaml"
    stale = load_pins(path)  # loaded before another run adds vllm-0.21.0
    p21 = replace(REAL.get("vllm-0.21.0"), bases={})  # `pins add` never writes bases
    write_pin(p21, stale)
    assert list(load_pins(path).pins) == list(REAL.pins)  # back in its place among the real pins
    before = path.read_bytes()
    with pytest.raises(UsageError, match=r"added to .* meanwhile"):
        write_pin(p21, stale)
    assert path.read_bytes() == before
    write_pin(replace(REAL.get("vllm-0.33.0"), name="vllm-0.33.0-again"), stale)
    assert list(load_pins(path).pins) == [*REAL.pins, "vllm-0.33.0-again"]  # nothing dropped
    assert not any(p.name.endswith(".lock") for p in path.parent.iterdir())  # the lock lives in the cache


def test_a_file_with_windows_line_ends_keeps_them(tmp_path: Path) -> None:
    crlf = PINS_TEXT.replace("\n", "\r\n")
    path = _project(tmp_path, "") / "patches" / "pins.yaml"
    path.write_bytes(_without(PINS_TEXT, "vllm-0.33.0").replace("\n", "\r\n").encode())
    write_pin(REAL.get("vllm-0.33.0"), load_pins(path))
    assert path.read_bytes() == crlf.encode()


def test_a_pin_goes_in_version_order_and_comments_stay_with_their_pin(tmp_path: Path) -> None:
    text = PINS_TEXT.replace("  vllm-0.33.0:\n", "  # the newest release\n  vllm-0.33.0:\n")
    path = _project(tmp_path, text) / "patches" / "pins.yaml"
    base = REAL.get("vllm-0.21.0")
    middle = Pin(name="vllm-0.25.0", version="0.25.0", upstream=base.upstream, sdist=base.sdist, torch="2.12.0",
                 cuda="13.0", flashinfer="0.7.0", wheels=base.wheels)
    write_pin(middle, load_pins(path))
    new = path.read_text(encoding="utf-8")
    real = list(REAL.pins)
    assert real[:2] == ["vllm-0.21.0", "vllm-0.26.0"]  # 0.25.0 belongs between them
    assert list(load_pins(path).pins) == [real[0], "vllm-0.25.0", *real[1:]]
    assert "    bases: {}\n\n  # the newest release\n  vllm-0.33.0:\n" in new
    # every line of the old file is still there, in its order
    old_lines, new_lines = text.splitlines(), iter(new.splitlines())
    assert all(any(line == n for n in new_lines) for line in old_lines)
    assert load_pins(path).get("vllm-0.25.0").to_dict() == middle.to_dict()


def test_a_flow_style_pins_mapping_is_refused_and_left_alone(tmp_path: Path) -> None:
    text = 'default: a\npins: {a: {version: "1.0", upstream: {remote: r, commit: 1234567abc},' \
           ' sdist: {file: a-1.0.tar.gz, sha256: ' + "a" * 64 + '}, torch: "2", cuda: "13.0", flashinfer: "1"}}\n'
    path = _project(tmp_path, text) / "patches" / "pins.yaml"
    with pytest.raises(ConfigError, match="block 'pins:'"):
        write_pin(REAL.get("vllm-0.33.0"), load_pins(path))
    assert path.read_text() == text
    assert sorted(p.name for p in path.parent.iterdir()) == ["pins.yaml", "series.yaml"]


def test_a_pin_written_as_one_flow_line_is_not_guessed_around(tmp_path: Path) -> None:
    # valid YAML, but the entry has no block of its own to place a new one against
    raw = yaml.safe_load(PINS_TEXT)["pins"]["vllm-0.33.0"]
    text = _without(PINS_TEXT, "vllm-0.33.0") + "\n  vllm-0.33.0: " + json.dumps(raw) + "\n"
    path = _project(tmp_path, text) / "patches" / "pins.yaml"
    pinset = load_pins(path)
    assert pinset.get("vllm-0.33.0").to_dict() == REAL.get("vllm-0.33.0").to_dict()
    base = REAL.get("vllm-0.21.0")
    with pytest.raises(ConfigError, match="key line"):
        write_pin(Pin(name="vllm-0.25.0", version="0.25.0", upstream=base.upstream, sdist=base.sdist, torch="2.12.0",
                      cuda="13.0", flashinfer="0.7.0"), pinset)
    assert path.read_text(encoding="utf-8") == text


def test_wheel_keys_follow_the_platform_tags() -> None:
    assert wheel_key("vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl") == "manylinux_x86_64"
    assert wheel_key("vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl") == "manylinux_x86_64"
    assert wheel_key("vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl") == "manylinux_aarch64"
    assert wheel_key("vllm-0.33.0-cp312-cp312-win_amd64.whl") == "win_amd64"
    assert wheel_key("vllm-0.33.0.tar.gz") is None


# --- refusals before any download ------------------------------------------------------------------------


def test_an_existing_name_is_refused_with_exit_2_before_the_index_is_read(tmp_path: Path, index: LocalIndex) -> None:
    root = _project(tmp_path, PINS_TEXT)
    proc = _g4build(tmp_path, index, "--root", str(root), "pins", "add", "--release", "0.33.0")
    assert proc.returncode == 2, proc.stderr
    assert "pin 'vllm-0.33.0' already exists" in proc.stderr and "--name" in proc.stderr
    assert sum(index.hits.values()) == 0
    assert (root / "patches" / "pins.yaml").read_text(encoding="utf-8") == PINS_TEXT


def test_a_release_the_index_lacks_is_a_download_error(tmp_path: Path, index: LocalIndex) -> None:
    root = _project(tmp_path, PINS_TEXT)
    _publish_wheels(index, REAL.get("vllm-0.33.0"))
    proc = _g4build(tmp_path, index, "--root", str(root), "pins", "add", "--release", "0.34.0")
    assert proc.returncode == 5, proc.stderr
    assert "has no sdist of vllm 0.34.0" in proc.stderr and "0.33.0" in proc.stderr
    assert (root / "patches" / "pins.yaml").read_text(encoding="utf-8") == PINS_TEXT


def test_several_builds_of_one_wheel_are_not_guessed(tmp_path: Path, index: LocalIndex) -> None:
    root = _project(tmp_path, _without(PINS_TEXT, "vllm-0.21.0").replace("default: vllm-0.21.0",
                                                                          "default: vllm-0.33.0"))
    pin = REAL.get("vllm-0.21.0")
    index.add(pin.sdist.file, b"", publish_sha256=pin.sdist.sha256)
    _publish_wheels(index, pin)
    rebuilt = pin.wheels["manylinux_x86_64"].file.replace("-0.21.0-", "-0.21.0-1-")
    index.add(rebuilt, b"", publish_sha256="1" * 64)
    proc = _g4build(tmp_path, index, "--root", str(root), "pins", "add", "--release", "0.21.0")
    assert proc.returncode == 2, proc.stderr
    assert "2 wheels for manylinux_x86_64" in proc.stderr and rebuilt in proc.stderr and "--wheel" in proc.stderr
    assert index.hits[f"/files/{pin.sdist.file}"] == 0


# --- with the real sdist from the loopback index (network: the sdist, once) -------------------------------


@pytest.mark.network
def test_add_writes_the_pin_the_maintainers_wrote_by_hand(tmp_path: Path, index: LocalIndex, sdist33: Path) -> None:
    root = _project(tmp_path, _without(PINS_TEXT, "vllm-0.33.0"))
    index.add(sdist33)
    _publish_wheels(index, REAL.get("vllm-0.33.0"))
    proc = _g4build(tmp_path, index, "--root", str(root), "pins", "add", "--release", "0.33.0")
    assert proc.returncode == 0, proc.stderr
    assert (root / "patches" / "pins.yaml").read_text(encoding="utf-8") == PINS_TEXT
    assert "not read commit (full sha)" in proc.stdout and "short id 4ba787ec9" in proc.stdout
    # and its vLLM argument names, recorded as data beside the recipes: the same table the project ships
    recorded = root / "recipes" / "vllm-args" / "vllm-0.33.0.json"
    assert recorded.read_bytes() == (REPO / "recipes" / "vllm-args" / "vllm-0.33.0.json").read_bytes()
    assert f"recorded its vLLM argument names (recipe --set checks) in {recorded}" in proc.stdout
    # and the environment variables its envs.py reads, beside it (render and check are right offline)
    envs = root / "recipes" / "vllm-args" / "vllm-0.33.0.envs.json"
    assert envs.read_bytes() == (REPO / "recipes" / "vllm-args" / "vllm-0.33.0.envs.json").read_bytes()
    assert f"recorded the environment variables it reads (recipe render/check) in {envs}" in proc.stdout.replace(
        "\n", "")
    assert (tmp_path / "cache" / "sdists" / sdist33.name).is_file()  # verified copy in the test's own cache
    again = _g4build(tmp_path, index, "--root", str(root), "pins", "add", "--release", "0.33.0", "--name", "other",
                     "--dry-run", "--json")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["written"] is False and out["pin"] == REAL.get("vllm-0.33.0").to_dict() | {"name": "other"}
    assert index.hits[f"/files/{sdist33.name}"] == 1  # the second run used the verified cache
    assert (root / "patches" / "pins.yaml").read_text(encoding="utf-8") == PINS_TEXT


def _small_sdist(real: Path, dest: Path, keep: tuple[str, ...], edit: dict[str, bytes] | None = None) -> Path:
    """A tar.gz of some of the real sdist's own members, under the real top folder (``edit`` replaces some)."""
    top = real.name[: -len(".tar.gz")]
    with tarfile.open(real) as src, tarfile.open(dest, "w:gz") as out:
        for rel in keep:
            member = src.getmember(f"{top}/{rel}")
            data = (edit or {}).get(rel)
            if data is None:
                fh = src.extractfile(member)
                assert fh is not None
                data = fh.read()
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    return dest


@pytest.mark.network
def test_what_the_release_does_not_record_is_asked_for(tmp_path: Path, index: LocalIndex, sdist21: Path) -> None:
    root = _project(tmp_path, _without(PINS_TEXT, "vllm-0.21.0").replace("default: vllm-0.21.0",
                                                                          "default: vllm-0.33.0"))
    pin = REAL.get("vllm-0.21.0")
    # the release's own version file and requirements, but no docker/ folder: no CUDA_VERSION anywhere
    (tmp_path / "src").mkdir()
    keep = ("PKG-INFO", "vllm/_version.py", "requirements/cuda.txt", "requirements/common.txt")
    small = _small_sdist(sdist21, tmp_path / "src" / sdist21.name, keep)
    index.add(small)
    _publish_wheels(index, pin)
    args = ("--root", str(root), "pins", "add", "--release", "0.21.0", "--json")
    proc = _g4build(tmp_path, index, *args)
    assert proc.returncode == 2, proc.stderr
    assert "cannot read cuda" in proc.stderr and "--cuda" in proc.stderr
    assert (root / "patches" / "pins.yaml").read_text(encoding="utf-8") != PINS_TEXT  # cut, and still cut
    wrong = _g4build(tmp_path, index, *args, "--cuda", "13.0", "--commit", "0" * 40)
    assert wrong.returncode == 2 and "records commit 9da56fd18" in wrong.stderr
    ok = _g4build(tmp_path, index, *args, "--cuda", "13.0", "--commit", pin.upstream.commit)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["unread"]["cuda"].startswith("neither docker/versions.json")
    assert out["sources"]["cuda"] == "given (--cuda)"
    # the release's own transformers range, which pins.yaml narrows by hand for Gemma 4 (it says why)
    own = ">=4.56.0,!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0"
    assert out["sources"]["transformers"] == f"sdist requirements/common.txt (transformers {own})"
    assert out["pin"] == pin.to_dict() | {"bases": {}, "sha256": hashlib.sha256(small.read_bytes()).hexdigest(),
                                          "transformers": own}
    # the torch the release pins is not overridden by a different option
    clash = _g4build(tmp_path, index, *args, "--name", "x", "--cuda", "13.0", "--torch", "2.12.0", "--dry-run")
    assert clash.returncode == 2 and "records torch 2.11.0" in clash.stderr


@pytest.mark.network
def test_a_tampered_sdist_is_refused_and_nothing_is_written(tmp_path: Path, index: LocalIndex, sdist21: Path) -> None:
    text = _without(PINS_TEXT, "vllm-0.21.0").replace("default: vllm-0.21.0", "default: vllm-0.33.0")
    root = _project(tmp_path, text)
    pin = REAL.get("vllm-0.21.0")
    (tmp_path / "src").mkdir()
    edited = _small_sdist(sdist21, tmp_path / "src" / sdist21.name, ("vllm/_version.py", "requirements/cuda.txt"),
                          {"requirements/cuda.txt": b"torch==2.11.0\nflashinfer-python==6.6.6\n"})
    index.add(edited, publish_sha256=pin.sdist.sha256)  # the page says the real release, the bytes are others
    _publish_wheels(index, pin)
    proc = _g4build(tmp_path, index, "--root", str(root), "pins", "add", "--release", "0.21.0", "--cuda", "13.0")
    assert proc.returncode == 4, proc.stderr
    assert "sha256 mismatch" in proc.stderr
    assert (root / "patches" / "pins.yaml").read_text(encoding="utf-8") == text
    assert not (tmp_path / "cache" / "sdists" / sdist21.name).exists()


# --- the real index ----------------------------------------------------------------------------------------


@pytest.mark.network
def test_real_release_0_21_0_matches_the_hand_written_pin(tmp_path: Path, sdist21: Path) -> None:
    # the verified sdist is copied into the test's cache: only the index page is read from the network
    (tmp_path / "cache" / "sdists").mkdir(parents=True)
    shutil.copy(sdist21, tmp_path / "cache" / "sdists" / sdist21.name)
    env_index = None  # the user's pip configuration names the index
    pin = REAL.get("vllm-0.21.0")
    proc = _g4build(tmp_path, env_index, "--root", str(_project(tmp_path, PINS_TEXT)), "pins", "add",
                    "--release", "0.21.0", "--name", "check", "--dry-run", "--json",
                    "--wheel", pin.wheels["manylinux_x86_64"].file)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    read, hand = out["pin"], pin.to_dict()
    for key in ("version", "remote", "sdist", "sha256", "torch", "cuda", "flashinfer", "wheels"):
        assert read[key] == hand[key], key
    # fields the release does not record in full are reported, never made up
    assert hand["commit"].startswith(read["commit"]) and read["commit"] == "9da56fd18"
    assert set(out["unread"]) == {"commit (full sha)", "bases"} and hand["bases"] and read["bases"] == {}
    assert out["sources"]["cuda"] == "sdist docker/versions.json CUDA_VERSION (13.0.2)"
