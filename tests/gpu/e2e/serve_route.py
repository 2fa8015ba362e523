"""The recipe route, served: render a shipped recipe's bash launch script with `g4build recipe render`, run it as
written, and talk to the `vllm serve` it starts over HTTP, with the trained tiny models (train_models.py).

  python serve_route.py --recipe NAME --drafter dflash|mtp --models DIR --work DIR --json OUT \
      --g4build "python3 -m g4build" [--port 8011] [--limit 420]

What it does, in order:
  1. a served copy of the target (DIR/target: weights linked, not copied) whose tokenizer also knows the two tool-
     call tokens the recipe's `--tool-call-parser gemma4` looks up (two unused ids of the tiny vocabulary renamed;
     the language never emits them), and a chat template for image chat requests (the tiny tokenizer has none);
  2. `g4build recipe render NAME --shell bash --out WORK --set model=... --set speculative.model=DIR/<drafter>
     --set args.port=... ` plus the settings the tiny models need (max-model-len, memory share, the target's
     hf_overrides, the chat template): the command line is kept in the result;
  3. `bash WORK/NAME.sh`, with a `vllm` on PATH (WORK/bin/vllm: `python3 -m vllm.entrypoints.cli.main`), until
     /health answers;
  4. 24 text completions (token-id prompts of tiny_lang.eval_prompts, greedy, 8 at a time, return_token_ids) and
     2 image chat completions (a PNG as a data URL between two text parts), /metrics read before and after;
  5. SIGINT to the server's process group (SIGKILL after 30 s).
The result: the render command and the script's sha256, start time, each request's status, the text outputs
compared with the reference's greedy tokens (train_models.py reference.json), and the drafter's acceptance from
/metrics (vllm:spec_decode_num_drafts / _num_accepted_tokens counters).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import acceptance_runs  # noqa: E402
import engine_runs as er  # noqa: E402
import tiny_lang  # noqa: E402
from jsonio import write  # noqa: E402

TOOL_TOKENS = {1022: "<|tool_call>", 1023: "<tool_call|>"}  # gemma4_tool_parser.py's TOOL_CALL_START / _END
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %} <|image|> "
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def served_copy(models: Path, work: Path) -> Path:
    """WORK/served-target: the trained target with the tool-call tokens and nothing else changed."""
    src, dst = models / "target", work / "served-target"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        target = dst / f.name
        if target.exists() or target.is_symlink():
            target.unlink()
        if f.suffix == ".safetensors":
            target.symlink_to(f.resolve())
        elif f.name != "tokenizer.json":
            target.write_bytes(f.read_bytes())
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    for i, name in TOOL_TOKENS.items():
        if i < tiny_lang.DIALECT_TOKEN + tiny_lang.DIALECTS:
            raise SystemExit(f"id {i} is a word of the language: pick unused ids for the tool-call tokens")
        del vocab[by_id[i]]
        vocab[name] = i
        tok["added_tokens"].append({"id": i, "content": name, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": False})
    (dst / "tokenizer.json").write_text(json.dumps(tok))
    (work / "chat.jinja").write_text(CHAT_TEMPLATE)
    return dst


def render(args: argparse.Namespace, target: Path, meta: dict[str, Any]) -> tuple[list[str], Path]:
    sets = {
        "model": str(target), "speculative.model": str(args.models / args.drafter), "args.port": str(args.port),
        "args.max-model-len": "4096", "args.gpu-memory-utilization": "0.5",
        "args.chat-template": str(args.work / "chat.jinja"),
    }
    for item in args.set:  # the run's own additions (e.g. pin=..., args.attention-backend=...)
        key, _, value = item.partition("=")
        sets[key] = value
    if meta.get("target_hf_overrides"):
        sets["args.hf-overrides"] = json.dumps(meta["target_hf_overrides"], separators=(",", ":"))
    cmd = [*shlex.split(args.g4build), "recipe", "render", args.recipe, "--shell", "bash", "--out", str(args.work)]
    if args.wheel is not None:  # pin, torch and arguments from the wheel's manifest; the script finds it installed
        cmd += ["--wheel", str(args.wheel)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"recipe render exited {proc.returncode}: {proc.stderr[-2000:]}")
    scripts = sorted(args.work.glob("*.sh"))
    if len(scripts) != 1:
        raise RuntimeError(f"recipe render wrote {[s.name for s in scripts]}, expected one .sh")
    return cmd, scripts[0]


def vllm_shim(work: Path) -> Path:
    bindir = work / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "vllm"
    shim.write_text(f'#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} -m vllm.entrypoints.cli.main "$@"\n')
    shim.chmod(0o755)
    return bindir


def launch_env(environ: Mapping[str, str], shim: Path, *, prefix: str = sys.prefix,
               base_prefix: str = sys.base_prefix, executable: str = sys.executable) -> dict[str, str]:
    """The launch script's environment: the ``vllm`` shim first on PATH; and, when this Python is a venv's that
    nobody activated (a machine's image Python), that venv as an activation leaves it (VIRTUAL_ENV, its bin
    next on PATH), so a script rendered with ``--wheel`` passes its venv guard and finds the installed build.
    Through a plain Python the guard stops the script: run_e2e's G4E2E_SERVE_VENV=1 makes a venv for it."""
    env = dict(environ, G4BUILD_ALLOW_ENVIRONMENT="1")
    path = [str(shim)]
    if not environ.get("VIRTUAL_ENV") and prefix != base_prefix:
        env["VIRTUAL_ENV"] = prefix
        path.append(os.path.dirname(executable))
    env["PATH"] = os.pathsep.join([*path, environ.get("PATH", "")])
    return env


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        return 0, str(e)


def metrics(base: str) -> dict[str, float]:
    status, text = http("GET", base + "/metrics", timeout=30)
    out: dict[str, float] = {}
    if status != 200:
        return out
    for line in text.splitlines():
        m = re.match(r"^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if m and m.group(1) in SPEC_COUNTERS:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def png_data_url(req: dict[str, Any]) -> str:
    """The request's image (engine_runs.request_image: the offline runs' own) as a PNG data URL."""
    buf = io.BytesIO()
    er.request_image(req).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def talk(base: str, name: str, reference: dict[str, Any]) -> dict[str, Any]:
    prompts = tiny_lang.eval_prompts()[:24]

    def complete(p: dict[str, Any]) -> dict[str, Any]:
        body = {"model": name, "prompt": list(p["token_ids"]), "max_tokens": int(p["max_tokens"]),
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        status, text = http("POST", base + "/v1/completions", body, timeout=300)
        row: dict[str, Any] = {"id": p["id"], "status": status}
        if status == 200:
            choice = json.loads(text)["choices"][0]
            ids = choice.get("token_ids")
            row["tokens"] = len(ids) if ids is not None else None
            want = (reference.get("requests") or {}).get(str(p["id"]), {}).get("output")
            row["equal_to_reference"] = (ids == want) if ids is not None and want is not None else None
        else:
            row["error"] = text[:400]
        return row

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        text_rows = list(pool.map(complete, prompts))
    text_s = round(time.perf_counter() - t0, 2)
    image_rows = []
    for req in acceptance_runs.image_prompts()[:2]:  # the offline runs' image requests, the image between words
        before, after = req["text"].split(" <|image|> ")
        content = [{"type": "text", "text": before}, {"type": "image_url", "image_url": {"url": png_data_url(req)}},
                   {"type": "text", "text": " " + after}]
        body = {"model": name, "messages": [{"role": "user", "content": content}],
                "max_tokens": int(req["max_tokens"]), "temperature": 0.0, "ignore_eos": True}
        status, text = http("POST", base + "/v1/chat/completions", body, timeout=300)
        row = {"id": req["id"], "status": status}
        if status == 200:
            d = json.loads(text)
            row["completion_tokens"] = d["usage"]["completion_tokens"]
            row["prompt_tokens"] = d["usage"]["prompt_tokens"]
            row["text_head"] = d["choices"][0]["message"]["content"][:80]
        else:
            row["error"] = text[:400]
        image_rows.append(row)
    return {"text": text_rows, "text_s": text_s, "image": image_rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.work.mkdir(parents=True, exist_ok=True)
    meta = json.loads((args.models / "meta.json").read_text())
    ref_file = args.models / ("reference-mtp.json" if args.drafter == "mtp" else "reference.json")
    reference = json.loads(ref_file.read_text()) if ref_file.is_file() else {}
    res: dict[str, Any] = {"recipe": args.recipe, "drafter": args.drafter, "ok": False, "stage": "render"}
    target = served_copy(args.models, args.work)
    cmd, script = render(args, target, meta)
    # the command line as kept: the machine's folders named WORK and MODELS
    res["render"] = [c.replace(str(args.work), "WORK").replace(str(args.models), "MODELS")
                     for c in cmd[len(shlex.split(args.g4build)):]]
    res["script"] = {"name": script.name, "sha256": hashlib.sha256(script.read_bytes()).hexdigest()}
    res["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}  # set before the script
    # The tiny configs are adapted to the machine's transformers (per_layer_config: null, global_head_dim back
    # through hf_overrides), which the launch scripts' environment check cannot know: it would stop the launch
    env = launch_env(os.environ, vllm_shim(args.work))
    log = open(args.json.with_suffix(".log"), "w")  # noqa: SIM115 - the server writes into it until shut down
    res["stage"] = "start"
    write(args.json, res)
    t0 = time.perf_counter()
    proc = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    try:
        while time.perf_counter() - t0 < args.limit:
            if proc.poll() is not None:
                raise RuntimeError(f"the launch script exited {proc.returncode} before the server answered")
            if http("GET", base + "/health", timeout=5)[0] == 200:
                break
            time.sleep(2)
        else:
            raise RuntimeError(f"no answer on /health after {args.limit} s")
        res["start_s"] = round(time.perf_counter() - t0, 1)
        res["stage"] = "requests"
        status, models_text = http("GET", base + "/v1/models")
        name = json.loads(models_text)["data"][0]["id"] if status == 200 else "gemma-4-26b-a4b"
        res["served_model"] = name
        before = metrics(base)
        res["requests"] = talk(base, name, reference)
        after = metrics(base)
        spec = {k.split(":")[1]: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
        drafts = spec.get("spec_decode_num_drafts", 0.0)
        spec["acceptance_length"] = (round(1 + spec.get("spec_decode_num_accepted_tokens", 0.0) / drafts, 4)
                                     if drafts else None)
        res["metrics_spec"] = spec
        reqs = res["requests"]
        eq = [r.get("equal_to_reference") for r in reqs["text"]]
        res["summary"] = {
            "text_ok": sum(r["status"] == 200 for r in reqs["text"]), "text_requests": len(reqs["text"]),
            "image_ok": sum(r["status"] == 200 for r in reqs["image"]), "image_requests": len(reqs["image"]),
            "text_equal_to_reference": sum(e is True for e in eq), "compared": sum(e is not None for e in eq),
            "acceptance_length": spec["acceptance_length"],
        }
        res["ok"] = (res["summary"]["text_ok"] == len(reqs["text"]) and res["summary"]["image_ok"] == len(reqs["image"])
                     and bool(drafts))
        res["stage"] = "done"
    except Exception as exc:  # recorded, with the server's log tail
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        res["exit_code"] = proc.returncode
        log.close()
        text = args.json.with_suffix(".log").read_text(errors="replace")
        if not res["ok"]:
            res["log_tail"] = text[-3000:]
        res["launch_script_notes"] = [ln for ln in text.splitlines() if ln.startswith(("note:", "warning:"))][:5]
        write(args.json, res)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--drafter", choices=("dflash", "mtp"), required=True)
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--g4build", required=True, help="the command that runs g4build (shell words)")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one more recipe --set")
    ap.add_argument("--limit", type=int, default=420, help="seconds to wait for /health")
    ap.add_argument("--wheel", type=Path, help="render with --wheel (a wheel `g4build wheel` built)")
    args = ap.parse_args(argv)
    return 0 if run(args)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
