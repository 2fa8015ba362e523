"""Fixtures for the series_a behaviour tests: the pinned vLLM trees (pristine and patched) and the facts their
own code produces, gathered once per tree by running series_a_tree_probe.py inside it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.support.tree_probe import BOOT_SITECUSTOMIZE
from tests.support.trees import patched_tree, sdist_tree, unpacked_wheel

HERE = Path(__file__).parent
PINS = ["vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0"]

# A multimodal-prefix target with Gemma4's head dims (256 sliding / 512 global) and a text-only DFlash drafter:
# configs only, no weights (nothing is loaded).
_TARGET = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "global_head_dim": 512,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "is_mm_prefix_lm": True,
    "torch_dtype": "bfloat16",
}
_DRAFT = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "block_size": 16,
    "torch_dtype": "bfloat16",
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 1]},
}
# The shape of Gemma 4 DFlash drafters: sliding and full layers in one drafter (several KV-cache kinds).
_MIXED_DRAFT = {
    **_DRAFT,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "use_sliding_window": True,
    "sliding_window": 64,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 1], "swa_window_size": 64},
}


@pytest.fixture(scope="session")
def mm_prefix_module():  # type: ignore[no-untyped-def]
    """mm_prefix_module(pin): the patched tree's own vllm/v1/attention/backends/mm_prefix_fa.py (torch only)."""

    def load(pin: str) -> ModuleType:
        path = patched_tree(pin) / "vllm" / "v1" / "attention" / "backends" / "mm_prefix_fa.py"
        return load_module(path, "series_a_mm_prefix_fa_" + pin.replace(".", "_").replace("-", "_"))

    return load


@pytest.fixture(scope="session")
def attn_ref() -> ModuleType:
    return load_module(HERE / "attention_reference.py", "series_a_attention_reference")


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def probe_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    root = tmp_path_factory.mktemp("series_a_probe")
    (root / "boot").mkdir()
    (root / "boot" / "sitecustomize.py").write_text(BOOT_SITECUSTOMIZE)
    for name, config in (("target", _TARGET), ("draft", _DRAFT), ("draft_mixed", _MIXED_DRAFT)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root / "boot", root / "target", root / "draft", root / "draft_mixed"


_FACTS: dict[tuple[str, str], dict[str, Any]] = {}
_PER_KIND: dict[tuple[str, str], dict[str, Any]] = {}


@pytest.fixture(scope="session")
def tree_facts(probe_inputs: tuple[Path, Path, Path, Path]):  # type: ignore[no-untyped-def]
    """facts(pin, "pristine" | "patched"): what series_a_tree_probe.py reports inside that tree."""

    def facts(pin: str, kind: str) -> dict[str, Any]:
        if (pin, kind) not in _FACTS:
            boot, target, draft, draft_mixed = probe_inputs
            _FACTS[(pin, kind)] = run_probe(
                pin, kind, boot, "series_a_tree_probe.py", [str(target), str(draft), str(draft_mixed)],
                "SERIES_A_FACTS ", target.parent,
            )
        return _FACTS[(pin, kind)]

    return facts


@pytest.fixture(scope="session")
def per_kind_facts(probe_inputs: tuple[Path, Path, Path, Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """facts(pin, "pristine" | "patched"): the backend of every layer of a tiny Gemma 4 and a tiny Gemma 3 as
    the tree's own model code builds them, per attention config (per_kind_probe.py)."""

    def facts(pin: str, kind: str) -> dict[str, Any]:
        if (pin, kind) not in _PER_KIND:
            work = tmp_path_factory.mktemp(f"per_kind_{pin}_{kind}")
            # What the sliding-FA recipe hands vllm serve for its attention: parsed there by the tree's own parser.
            (work / "cli_args.json").write_text(json.dumps(recipe_attention_words()))
            _PER_KIND[(pin, kind)] = run_probe(
                pin, kind, probe_inputs[0], "per_kind_probe.py", [str(work)], "PER_KIND_FACTS ", work
            )
        return _PER_KIND[(pin, kind)]

    return facts


def recipe_attention_words() -> list[str]:
    from g4build.recipes import load_recipe
    from g4build.recipes.argv import serve_argv

    argv = serve_argv(load_recipe("gemma4-26b-a4b-nvfp4-sliding-fa"))
    at = argv.index("--attention-config")
    return argv[at : at + 2]


# Wheels a pin's probes import before the test venv's, where the venv's are newer than the release can read:
# 0.26.0 reads Gemma 4's per-layer head_dim as one global attribute, which the venv's transformers (5.20) refuses
# (0.29.0 and later read heterogeneous configs per layer). transformers 5.5.4 meets 0.26.0's own requirement
# (transformers >= 5.5.3) and knows Gemma 4; it wants tokenizers <= 0.23.0 and huggingface-hub 1.x.
WHEELS_FOR_PIN = {"vllm-0.26.0": (("transformers", "transformers-5.5.4-py3-none-any.whl"),
                                  ("huggingface-hub", "huggingface_hub-1.33.0-py3-none-any.whl"),
                                  ("tokenizers", "tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64."
                                                 "manylinux2014_x86_64.whl"))}


def run_probe(
    pin: str, kind: str, boot: Path, script: str, args: list[str], marker: str, cwd: Path
) -> dict[str, Any]:
    """Run a probe script inside the pin's pristine or patched tree; its last ``marker`` line is the JSON."""
    tree = sdist_tree(pin) if kind == "pristine" else patched_tree(pin)
    env = dict(os.environ)
    extra = [str(unpacked_wheel(project, name)) for project, name in WHEELS_FOR_PIN.get(pin, ())]
    env["PYTHONPATH"] = os.pathsep.join([str(boot), *extra, str(tree)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the pristine tree is shared read-only
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)]
    assert proc.returncode == 0 and lines, (
        f"{script} failed in {tree} (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    result: dict[str, Any] = json.loads(lines[-1].removeprefix(marker))
    return result
