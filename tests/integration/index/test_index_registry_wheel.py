"""The index from the registry's vLLM 0.21.0 wheel overlaid by the real CLI (`g4build overlay --pin`), served on
the loopback: pip downloads it with --require-hashes and installs it (no deps) into a folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.indexsite import pip, serve_site
from tests.support.wheelsfactory import run_g4build

from g4build.index.pages import SiteOptions
from g4build.index.site import build_index

pytestmark = [pytest.mark.heavy, pytest.mark.network]

PIN = "vllm-0.21.0"


def test_pip_installs_the_overlaid_registry_wheel_from_the_index(tmp_path: Path) -> None:
    done = run_g4build("overlay", "--pin", PIN, "--out", str(tmp_path / "wheels"), "--json")
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "wheels").glob("vllm-*.whl")
    (entry,) = build_index(tmp_path / "wheels", tmp_path / "site", SiteOptions(), pin=PIN).entries
    assert entry.build is not None and entry.build.pin == PIN and entry.build.torch == "2.11.0"
    with serve_site(tmp_path / "site") as served:
        index = f"{served.url}/simple/"
        (tmp_path / "req.txt").write_text(f"vllm=={entry.version} --hash=sha256:{entry.sha256}\n")
        done = pip("download", "--no-deps", "--index-url", index, "--require-hashes", "-r", "req.txt",
                   "-d", str(tmp_path / "dl"), cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        done = pip("install", "--no-deps", "--index-url", index, "--target", str(tmp_path / "t"),
                   f"vllm=={entry.version}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "dl" / wheel.name).stat().st_size == wheel.stat().st_size
    (dist,) = (tmp_path / "t").glob("vllm-*.dist-info")
    assert dist.name == f"vllm-{entry.version}.dist-info" and (dist / "build-manifest.json").is_file()
