"""The MTP drafter's training/reference script (tests/gpu/e2e/train_mtp.py) and the serve route's CPU parts
(serve_route.py): checkpoint names against transformers' own gemma4_assistant model, what each draft may see, the
KV-sharing map, the served tokenizer copy, the /metrics reading, and the launch script the real `g4build recipe
render` writes for the route."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from .test_acceptance import _load

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mtp_mod() -> ModuleType:
    return _load("train_mtp")


@pytest.fixture(scope="module")
def serve() -> ModuleType:
    return _load("serve_route")


def test_kv_sharing_map_is_the_targets_last_layer_of_each_kind(mtp_mod: ModuleType) -> None:
    tt = sys.modules["tiny_torch"]
    kinds = mtp_mod.TS.layer_types
    assert mtp_mod.shared_layers() == {tt.SLIDING: 28, tt.FULL: 29}
    assert kinds[28] == tt.SLIDING and kinds[29] == tt.FULL


def test_checkpoint_names_are_transformers_gemma4_assistant(mtp_mod: ModuleType, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers import AutoConfig

    if "gemma4_assistant" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} does not know gemma4_assistant")
    from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

    (tmp_path / "meta.json").write_text("{}")
    mtp_mod.write_config(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path / "mtp")
    assert cfg.backbone_hidden_size == mtp_mod.TS.hidden
    theirs = {k: tuple(v.shape) for k, v in Gemma4AssistantForCausalLM(cfg).state_dict().items()}
    ours = {k: tuple(v.shape) for k, v in mtp_mod.Mtp(mtp_mod.MS).hf_state_dict().items()}
    theirs.pop("lm_head.weight")  # tied to model.embed_tokens (gemma4_mtp.py ties it at init as well)
    assert ours == theirs
    assert json.loads((tmp_path / "meta.json").read_text())["mtp"]["available"] is True


def test_drafts_see_the_context_up_to_their_anchor_only(mtp_mod: ModuleType) -> None:
    torch.manual_seed(0)
    target = mtp_mod.Target(mtp_mod.TS).eval()
    mtp = mtp_mod.Mtp(mtp_mod.MS).eval()
    seq = [2, *torch.randint(16, 80, (23,)).tolist()]
    dev = torch.device("cpu")
    full = mtp_mod.all_drafts(mtp, target, seq, 0, dev)
    assert set(full) == set(range(len(seq) - 1)) and all(len(d) == mtp_mod.MS.steps for d in full.values())
    cut = mtp_mod.all_drafts(mtp, target, seq[:13], 0, dev)
    for p in range(12):  # anchor p reads context 0..p and the token at p+1: later tokens change nothing
        assert cut[p] == full[p]
    changed = list(seq)
    changed[5] = 99 if seq[5] != 99 else 98
    other = mtp_mod.all_drafts(mtp, target, changed, 0, dev)
    assert other[3] == full[3]
    assert any(other[p] != full[p] for p in range(4, len(seq) - 1))  # ... and the drafts after it do see it


def test_masks_follow_the_target_windows(mtp_mod: ModuleType) -> None:
    tt = sys.modules["tiny_torch"]
    m = mtp_mod.masks_for(100, 120, torch.device("cpu"))
    assert m[tt.FULL].shape == (1, 1, 100, 120)
    assert bool(m[tt.FULL][0, 0, 99, 99]) and not bool(m[tt.FULL][0, 0, 50, 51])
    w = mtp_mod.TS.window
    assert bool(m[tt.SLIDING][0, 0, 99, 99 - w + 1]) and not bool(m[tt.SLIDING][0, 0, 99, 99 - w])


# --- the serve route ----------------------------------------------------------------------------------------------
@pytest.fixture()
def models(tmp_path: Path) -> Path:
    tiny_models = _load("tiny_models")
    out = tmp_path / "trained"
    tiny_models.write_all(out)
    (out / "target" / "model.safetensors").write_bytes(b"weights")
    return out


def test_served_copy_adds_the_tool_call_tokens_only(serve: ModuleType, models: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    dst = serve.served_copy(models, work)
    tok = json.loads((dst / "tokenizer.json").read_text())
    orig = json.loads((models / "target" / "tokenizer.json").read_text())
    assert tok["model"]["vocab"]["<|tool_call>"] == 1022 and tok["model"]["vocab"]["<tool_call|>"] == 1023
    changed = {t for t, i in orig["model"]["vocab"].items() if tok["model"]["vocab"].get(t) != i}
    assert changed == {"w1022", "w1023"}  # two ids the language never emits, nothing else
    assert (dst / "model.safetensors").is_symlink() and (work / "chat.jinja").is_file()
    assert (dst / "config.json").read_text() == (models / "target" / "config.json").read_text()


def test_served_copy_refuses_a_word_of_the_language(serve: ModuleType, models: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "TOOL_TOKENS", {40: "<|tool_call>"})
    with pytest.raises(SystemExit, match="word of the language"):
        serve.served_copy(models, tmp_path)


@pytest.fixture()
def metrics_server() -> Iterator[str]:
    body = (b"# HELP vllm:spec_decode_num_drafts_total x\n"
            b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
            b'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0\n'
            b'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0\n'
            b"vllm:num_requests_running 1.0\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_metrics_reads_the_spec_counters(serve: ModuleType, metrics_server: str) -> None:
    got = serve.metrics(metrics_server)
    assert got == {"vllm:spec_decode_num_drafts": 12.0, "vllm:spec_decode_num_accepted_tokens": 30.0}


def test_render_writes_the_recipes_script_with_the_routes_settings(serve: ModuleType, models: Path,
                                                                   tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    target = serve.served_copy(models, work)
    args = argparse.Namespace(g4build=f"{sys.executable} -m g4build", recipe="gemma4-26b-a4b-nvfp4-mtp",
                              work=work, models=models, drafter="mtp", port=8123, set=["pin=vllm-0.21.0"], wheel=None)
    meta = {"target_hf_overrides": {"text_config": {"global_head_dim": 512}}}
    cmd, script = serve.render(args, target, meta)
    text = script.read_text()
    assert script.name == "gemma4-26b-a4b-nvfp4-mtp.sh" and "pin=vllm-0.21.0" in cmd
    assert "'8123'" in text and f"'{target}'" in text and '"model":"' + str(models / "mtp") + '"' in text
    assert "'--hf-overrides'" in text and '{"text_config":{"global_head_dim":512}}' in text
    assert "'--chat-template'" in text and text.rstrip().endswith('exec vllm "${vllm_args[@]}"')


def _guard(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The venv guard a script rendered with --wheel starts with, run by bash in ``env``."""
    from g4build.recipes.render_bash import venv_guard
    script = tmp_path / "guard.sh"
    script.write_text("\n".join(["set -euo pipefail", *venv_guard(), "echo guard-passed"]) + "\n")
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)


def test_launch_env_passes_the_guard_from_an_unactivated_venv(serve: ModuleType, tmp_path: Path) -> None:
    """The GPU machine's python3 is a venv's nobody activated: the launch script's venv guard must see that venv
    (its first serve through a --wheel script stopped at the guard otherwise)."""
    venv = tmp_path / "image-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    shim = serve.vllm_shim(tmp_path)
    plain = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    env = serve.launch_env(plain, shim, prefix=str(venv), base_prefix="/usr",
                           executable=str(venv / "bin" / "python3"))
    assert env["VIRTUAL_ENV"] == str(venv) and env["PATH"].split(os.pathsep)[:2] == [str(shim), str(venv / "bin")]
    assert env["G4BUILD_ALLOW_ENVIRONMENT"] == "1"
    done = _guard(env, tmp_path)
    assert done.returncode == 0 and "guard-passed" in done.stdout, done.stderr
    # without the venv named, the same guard stops the script before pip (what the first serve hit)
    unnamed = dict(plain, PATH=f"{venv / 'bin'}{os.pathsep}{plain['PATH']}")
    stopped = _guard(unnamed, tmp_path)
    assert stopped.returncode == 1 and "no virtual environment is active" in stopped.stderr


def test_launch_env_keeps_an_active_venv_and_leaves_a_plain_python_alone(serve: ModuleType, tmp_path: Path) -> None:
    shim = tmp_path / "bin"
    active = serve.launch_env({"PATH": "/bin", "VIRTUAL_ENV": "/v"}, shim, prefix="/other", base_prefix="/usr",
                              executable="/other/bin/python3")
    assert active["VIRTUAL_ENV"] == "/v" and active["PATH"] == f"{shim}{os.pathsep}/bin"
    plain = serve.launch_env({"PATH": "/bin"}, shim, prefix="/usr", base_prefix="/usr", executable="/usr/bin/python3")
    assert "VIRTUAL_ENV" not in plain and plain["PATH"] == f"{shim}{os.pathsep}/bin"
