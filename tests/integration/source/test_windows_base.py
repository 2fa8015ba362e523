"""The Windows base: a fork's own changes forward-ported onto the pin's real sdist.

The fork here is a real git repository of our own making: its ``onto`` commit holds real vLLM 0.20.0 files (from
the registry's 0.20.0 sdist), its head commit Windows-style edits of ours. The pin is the real 0.21.0 sdist,
patched by the real fixups in patches/windows-base/ and then by every real series.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import git
import pytest
import yaml
from tests.support.yamltext import yaml_text

from g4build.data import project_root
from g4build.errors import BaseConflictError, ConfigError, SourceError
from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.source.fetch import fetch_source, verify_tree
from g4build.source.forkport import merge_file

ROOT = project_root()
PIN = "vllm-0.21.0"
ONTO_SDIST = ("vllm-0.20.0.tar.gz", "a6d50152936ee292455af3ffbe359f7a284ac43bf3b68caccf29f368e196cc72")
KEEP = ["requirements/common.txt", "requirements/cuda.txt", "vllm/v1/worker/gpu_worker.py",
        "vllm/model_executor/layers/fused_moe/routed_experts_capturer.py"]
FILES = [*KEEP, "setup.py", "vllm/collect_env.py", "vllm/envs.py", "requirements/cpu.txt"]
WIN_REQS = b"winloop\ntriton-windows\n"
XGRAMMAR = b'xgrammar >= 0.1.32, < 1.0.0; platform_machine == "x86_64" or'


def _sdist_members(filename: str, sha256: str, paths: list[str]) -> dict[str, bytes]:
    archive = fetch_verified("vllm", filename, sha256, cache_dir=cache_root() / "sdists").path
    with tarfile.open(archive) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        out = {}
        for path in paths:
            member = tar.extractfile(f"{top}/{path}")
            assert member is not None, path
            out[path] = member.read()
    return out


def _edit(text: bytes, old: bytes, new: bytes) -> bytes:
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.fixture(scope="module")
def fork(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A fork repository: onto = vLLM 0.20.0's files, head = our Windows-style changes over them."""
    where = tmp_path_factory.mktemp("fork") / "vllm-windows"
    repo = git.Repo.init(where)
    files = _sdist_members(*ONTO_SDIST, FILES)
    pin21 = _sdist_members(load_pins().get(PIN).sdist.file, load_pins().get(PIN).sdist.sha256, ["vllm/envs.py"])

    def commit(content: dict[str, bytes | None], message: str) -> str:
        for path, data in content.items():
            target = where / path
            if data is None:
                repo.index.remove([path], working_tree=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            repo.index.add([path])
        return repo.index.commit(message).hexsha

    onto = commit(dict(files), "upstream at the fork's base")
    head = commit({
        # both changed: 0.21.0 edits setup.py near its end, the fork at its top -> merged
        "setup.py": _edit(files["setup.py"], b"import ctypes\n", b"import ctypes\nimport platform  # fork\n"),
        # 0.21.0 left collect_env.py as 0.20.0 had it -> the fork's version is taken
        "vllm/collect_env.py": files["vllm/collect_env.py"] + b"# fork: Windows collect_env\n",
        # the fork carries what 0.21.0 already has -> already there
        "vllm/envs.py": pin21["vllm/envs.py"],
        "requirements/windows.txt": WIN_REQS,  # added
        "requirements/cpu.txt": None,  # deleted (0.21.0 left it unchanged)
        # conflicts with 0.21.0 (it bumped xgrammar / changed the contextlib import): keep_pin + our fixups
        "requirements/common.txt": _edit(files["requirements/common.txt"], XGRAMMAR,
                                         XGRAMMAR + b' platform_machine == "AMD64" or'),
        "vllm/v1/worker/gpu_worker.py": _edit(files["vllm/v1/worker/gpu_worker.py"], b"import os\n",
                                              b"import os\nimport platform\n"),
        "requirements/cuda.txt": files["requirements/cuda.txt"] + b"# fork\n",
        KEEP[3]: files[KEEP[3]] + b"# fork\n",
    }, "Windows changes")
    repo.create_tag("fork-head", ref=head)
    return {"remote": str(where), "onto": onto, "commit": head}


def _home(tmp_path: Path, fork: dict[str, str], **base: object) -> Path:
    home = tmp_path / "home"
    shutil.copytree(ROOT / "patches", home / "patches")
    pins_file = home / "patches" / "pins.yaml"
    data = yaml.safe_load(pins_file.read_text())
    data["pins"][PIN]["bases"] = {"windows": {**fork, "keep_pin": KEEP, **base}}
    pins_file.write_text(yaml_text(data, sort_keys=False))
    return home


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache holding only the (verified) 0.21.0 sdist, so the fork is fetched for real."""
    cache = tmp_path / "cache"
    (cache / "sdists").mkdir(parents=True)
    pin = load_pins().get(PIN)
    got = fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists").path
    shutil.copy(got, cache / "sdists" / pin.sdist.file)
    monkeypatch.setenv("G4BUILD_CACHE", str(cache))
    return cache


@pytest.mark.network
def test_forward_port_onto_the_real_sdist(tmp_path: Path, fork: dict[str, str], env: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_HOME", str(_home(tmp_path, fork)))
    pin = load_pins().get(PIN)
    dest = tmp_path / "src"
    result = fetch_source(pin, os_name="windows", dest=dest)
    port = result.port
    assert port is not None and not result.cached
    assert port["taken"] == ["vllm/collect_env.py"]
    assert port["merged"] == ["setup.py"]
    assert port["already"] == ["vllm/envs.py"]
    assert port["added"] == ["requirements/windows.txt"] and port["deleted"] == ["requirements/cpu.txt"]
    assert sorted(port["kept_pin"]) == sorted(KEEP)
    assert port["fixups"] == ["0001-requirements-that-install-on-windows.patch",
                              "0002-gloo-where-torch-has-no-nccl.patch"]

    setup = (dest / "setup.py").read_text()
    assert "import platform  # fork" in setup and "nvidia-cutlass-dsl[cu13]" in setup  # fork's + 0.21.0's
    assert (dest / "vllm/collect_env.py").read_text().endswith("# fork: Windows collect_env\n")
    assert (dest / "requirements/windows.txt").read_bytes() == WIN_REQS
    assert not (dest / "requirements/cpu.txt").exists()
    common = (dest / "requirements/common.txt").read_text()
    assert "xgrammar >= 0.2.0" in common  # 0.21.0's bump kept ...
    assert 'platform_machine == "x86_64" or platform_machine == "AMD64"' in common  # ... with our fixup
    worker = (dest / "vllm/v1/worker/gpu_worker.py").read_text()
    assert "import platform" not in worker and 'backend = "gloo"' in worker
    assert "# fork" not in (dest / KEEP[3]).read_text()

    repo = git.Repo(dest)
    [only] = list(repo.iter_commits())
    assert only.message.startswith(f"upstream vllm 0.21.0 + windows fork {fork['commit']}")
    assert not repo.is_dirty(untracked_files=True)
    for path in ("setup.py", "vllm/v1/worker/gpu_worker.py", "vllm/collect_env.py"):
        compile((dest / path).read_text(), path, "exec")

    # the upstream tree is not silently taken for the Windows base, nor the other way round
    with pytest.raises(SourceError, match=r"holds vllm-0\.21\.0 as another OS base"):
        fetch_source(pin, dest=dest)
    assert verify_tree(pin, dest).startswith(f"sha256:{pin.sdist.sha256} + windows base ")

    # every series applies on the Windows base with zero fuzz
    check = subprocess.run([sys.executable, "-m", "g4build", "patches", "check", "--pin", PIN, "--tree", str(dest),
                            "--json"], capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "toolkit")})
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["ok"] is True

    # offline: the fork's commits come from the cache, even with the fork gone and sockets blocked
    shutil.move(fork["remote"], str(tmp_path / "fork-moved"))
    try:
        with monkeypatch.context() as m:
            m.setattr(socket.socket, "connect", lambda *a, **k: (_ for _ in ()).throw(OSError("blocked")))
            assert fetch_source(pin, os_name="windows", dest=dest).cached
            again = fetch_source(pin, os_name="windows", dest=tmp_path / "src2")
            assert not again.cached and again.port == port
    finally:
        shutil.move(str(tmp_path / "fork-moved"), fork["remote"])


@pytest.mark.network
def test_undeclared_conflicts_stop_with_nothing_written(tmp_path: Path, fork: dict[str, str], env: Path) -> None:
    home = _home(tmp_path, fork, keep_pin=KEEP[2:])  # common.txt / cuda.txt no longer kept
    dest = tmp_path / "src"
    proc = subprocess.run([sys.executable, "-m", "g4build", "source", "fetch", "--pin", PIN, "--os", "windows",
                           "--dest", str(dest)], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "toolkit"), "G4BUILD_HOME": str(home),
                               "COLUMNS": "300"})
    assert proc.returncode == BaseConflictError.exit_code == 15, proc.stderr
    assert "requirements/common.txt (1 conflicting hunk(s))" in proc.stderr
    assert "keep_pin" in proc.stderr
    assert not dest.exists() and [p.name for p in tmp_path.glob("src*")] == ["src.lock"]  # no half tree


@pytest.mark.network
def test_missing_fork_commit_is_a_source_error(tmp_path: Path, fork: dict[str, str], env: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_HOME", str(_home(tmp_path, fork, commit="1" * 40)))
    with pytest.raises(SourceError, match="did not give commit"):
        fetch_source(load_pins().get(PIN), os_name="windows", dest=tmp_path / "src")
    assert not (tmp_path / "src").exists()


@pytest.mark.network
def test_forward_port_needs_the_sdist_route(tmp_path: Path, fork: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                            ) -> None:
    monkeypatch.setenv("G4BUILD_HOME", str(_home(tmp_path, fork)))
    from g4build.errors import UsageError

    with pytest.raises(UsageError, match="forward-ported onto the pin's sdist"):
        fetch_source(load_pins().get(PIN), "git", os_name="windows", dest=tmp_path / "src")


@pytest.mark.parametrize(("base", "text"), [
    ({"onto": "abc1234"}, "onto: expected the fork's upstream commit as 40 hex digits"),
    ({"onto": "a" * 40, "commit": "abcdef1"}, "needs the full 40-digit fork commit"),
    ({"keep_pin": ["setup.py"]}, "keep_pin needs onto"),
    ({"onto": "a" * 40, "commit": "b" * 40, "keep_pin": ["../etc/passwd"]}, "paths inside the tree"),
])
def test_bad_base_entries_are_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            base: dict[str, object], text: str) -> None:
    home = tmp_path / "home"
    shutil.copytree(ROOT / "patches", home / "patches")
    pins_file = home / "patches" / "pins.yaml"
    data = yaml.safe_load(pins_file.read_text())
    data["pins"][PIN]["bases"] = {"windows": {"remote": "https://example.invalid/f.git", "commit": "c" * 40, **base}}
    pins_file.write_text(yaml_text(data, sort_keys=False))
    monkeypatch.setenv("G4BUILD_HOME", str(home))
    with pytest.raises(ConfigError, match=text):
        load_pins()


@pytest.mark.parametrize(("ours", "base", "theirs", "result", "why"), [
    (b"a\nb\n", b"a\nb\n", b"a\nB\n", b"a\nB\n", None),  # only the fork changed it
    (b"A\nb\n", b"a\nb\n", b"a\nb\n", b"A\nb\n", None),  # only the pin changed it
    (b"A\nb\nc\nd\ne\n", b"a\nb\nc\nd\ne\n", b"a\nb\nc\nd\nE\n", b"A\nb\nc\nd\nE\n", None),  # both, apart
    (b"x\n", b"a\n", b"y\n", b"x\n", "1 conflicting hunk(s)"),
    (b"\0x", b"\0a", b"\0y", b"\0x", "binary file changed on both sides"),
])
def test_merge_file(ours: bytes, base: bytes, theirs: bytes, result: bytes, why: str | None) -> None:
    assert merge_file(ours, base, theirs) == (result, why)
