"""FlashInfer's own lookup finds the modules of a jit-cache wheel g4build packed, without a GPU: the pins'
flashinfer-python sdists (0.6.8.post1: ``_get_aot_dir``; 0.7.2.post1: ``_get_aot_providers`` and
``get_aot_artifacts``) imported from their source with the wheel installed beside, the arch list set as on the GPU
check (9.0 -> sm90a). ``JitSpec.is_aot`` true is what makes ``build_and_load`` load instead of compile."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import container, elf, entry

from g4build.builder.flashinfer_aot import JitCacheInfo, pack_wheel
from g4build.builder.flashinfer_aot_build import source_commit, source_tree
from g4build.recipes.flashinfer_modules import load_table
from g4build.validate.fatbin import FLAG_ARCH_SPECIFIC

pytestmark = pytest.mark.network

# FlashInfer's JIT layer imports torch and tvm_ffi; the package itself is imported from the sdist's tree without
# running its __init__ (as the AOT driver does)
PROBE = """
import json, os, sys, types
tree = sys.argv[1]
package = types.ModuleType("flashinfer"); package.__path__ = [tree + "/flashinfer"]; sys.modules["flashinfer"] = package
from flashinfer.jit import env
from flashinfer.jit.sampling import gen_sampling_module
spec = gen_sampling_module()
providers = [sorted(p.modules) for p in getattr(env, "FLASHINFER_AOT_PROVIDERS", ())]
print(json.dumps({"is_aot": spec.is_aot, "aot_path": str(spec.aot_path), "providers": providers}))
"""


@pytest.mark.parametrize("version", ["0.6.8.post1", "0.7.2.post1"])
def test_flashinfer_finds_the_sampling_module_in_the_wheel(tmp_path: Path, version: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tvm_ffi")
    source = load_table().sources[version]
    tree = source_tree(version, source.file, source.sha256, tmp_path / "work")
    commit = source_commit(tree)  # what the manifest records as the source commit
    assert commit is not None and len(commit) == 40
    built = tmp_path / "built" / "sampling"
    built.mkdir(parents=True)
    (built / "sampling.so").write_bytes(
        elf({".nv_fatbin": container(entry(2, 90, b"cubin", flags=0x11 | FLAG_ARCH_SPECIFIC))}))
    info = JitCacheInfo(flashinfer=version, source_file=source.file, source_sha256=source.sha256, arch_list="9.0",
                        modules=("sampling",))
    wheel = pack_wheel(tmp_path / "built", tmp_path / "out", info, "linux_x86_64")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    env = {"PYTHONPATH": str(site), "FLASHINFER_CUDA_ARCH_LIST": "9.0", "HOME": str(tmp_path),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(tree)], env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["is_aot"] is True
    assert found["aot_path"] == str(site / "flashinfer_jit_cache" / "jit_cache" / "sampling" / "sampling.so")
    if version.startswith("0.7"):
        assert found["providers"] == [["sampling"]]
    # another FlashInfer's wheel is not taken (FlashInfer's version check)
    other = JitCacheInfo(flashinfer="0.6.7", source_file=source.file, source_sha256=source.sha256, arch_list="9.0",
                         modules=("sampling",))
    stale = tmp_path / "stale"
    with zipfile.ZipFile(pack_wheel(tmp_path / "built", tmp_path / "out2", other, "linux_x86_64")) as zf:
        zf.extractall(stale)
    done = subprocess.run([sys.executable, "-c", PROBE, str(tree)], env={**env, "PYTHONPATH": str(stale)},
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0 or json.loads(done.stdout.strip().splitlines()[-1])["is_aot"] is False
