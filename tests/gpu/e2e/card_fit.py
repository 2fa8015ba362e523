"""Does a shipped recipe's launch script start in a card's memory? Run as written on a bigger GPU with vLLM's memory
share scaled down to the card's, and step down until it does.

  python card_fit.py run --recipe NAME --card-gib 24|32|96 --models DIR --json OUT [--work DIR]
                         [--g4build "python3 -m g4build"] [--mtp-folder mtp|mtp-standin] [--set KEY=VALUE ...]
                         [--extra-gib 0] [--weights-stand-in] [--min-context 4096] [--limit 540] [--port 8012]
                         [--wheel WHL]
                         [--util U]
  python card_fit.py fold RUN.json [RUN.json ...] [--superseded RUN.json ...] --json OUT

run: `g4build recipe render NAME --shell bash` with the model paths set to real_size.py's folders (DIR), load_format
dummy, the target's hf_overrides from DIR/meta.json, a port, and gpu-memory-utilization scaled so that vLLM's budget
(utilization x the device's total memory, vllm/v1/worker/utils.py request_memory) is what the recipe's own
utilization gives on the card: util = recipe util x card GiB / device total GiB, the total read from torch at run
time. --extra-gib adds that much to the budget; --weights-stand-in adds what the bf16 dummy weights (counted from
DIR's configs by size_model.py) exceed the recipe's footprint weights_gib by, so activations and KV cache get the
card's room (real_size.py's folders carry no 4-bit quantization: bf16 at 26B is ~48 GiB). The script
runs as written (bash, a `vllm` on PATH); an attempt ends when /health answers or the script exits. What vLLM
logged is kept (vllm_log.py): weights, available KV cache, KV cache tokens, concurrency at the context, CUDA graph
memory, the error. If the shipped context and max-num-seqs do not start: context halves (straight to the halving at
or below vLLM's own "estimated maximum model length" when it names one) down to --min-context, then max-num-seqs
halves; the first that starts ends the run, as do --limit (seconds, all attempts together) and weights that alone
exceed the budget.
--util models a card run at another gpu-memory-utilization than the recipe's; it and every --set args.* are
recorded as `changed` and name the run's row.
fold: one row per recipe x card: started at the shipped settings, the largest that started, vLLM's figures there;
runs of settings a recipe no longer ships under `superseded`.
No torch here: the device's total is read by a child python (unless --total-bytes gives it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import size_model as sm  # noqa: E402
import vllm_log  # noqa: E402
from jsonio import write  # noqa: E402
from serve_route import http, launch_env  # noqa: E402

GIB = 1 << 30
CARDS = {24: "RTX 5090 Laptop", 32: "RTX 5090", 96: "RTX PRO 6000"}
DRAFTERS = {"dflash": "dflash", "mtp": "mtp"}  # speculative.method -> real_size.py folder


def scaled_util(recipe_util: float, card_gib: float, total_bytes: int, extra_gib: float = 0.0) -> float:
    """The utilization that gives vLLM recipe_util x card_gib (+ extra_gib) GiB of this device's total_bytes,
    rounded down at the 4th decimal so the budget never exceeds the card's."""
    if not 0 < recipe_util <= 1:
        raise ValueError(f"the recipe's gpu-memory-utilization must be in (0, 1], found {recipe_util}")
    want = (recipe_util * card_gib + extra_gib) * GIB
    util = int(want / total_bytes * 10_000) / 10_000
    if not 0 < util <= 1:
        raise ValueError(f"{want / GIB:.1f} GiB is not a share of this device's {total_bytes / GIB:.1f} GiB")
    return util


def bf16_weights_gib(models: Path, drafter_folder: str) -> float:
    """What the dummy-weight run loads, counted from the folders' configs (size_model.py): the target with its
    vision tower and the V slots vLLM keeps on k_eq_v layers, and the drafter, at 2 bytes a parameter."""
    cfg = json.loads((models / "target" / "config.json").read_text())
    params = sum(c.total for c in sm.target_params(cfg).values()) + sm.vllm_extra_params(cfg["text_config"])
    dcfg = json.loads((models / drafter_folder / "config.json").read_text())
    params += (sm.mtp_params(dcfg) if dcfg.get("text_config") else sm.dflash_params(dcfg)).total
    return params * 2 / GIB


def next_step(context: int, seqs: int, parsed: dict[str, Any], min_context: int) -> tuple[int, int] | None:
    """The attempt after a failed (context, seqs): context halves first (skipping halvings above vLLM's estimate of
    the longest context that fits), then max-num-seqs halves at that context. None: nothing left to try. When no
    memory at all was left for the KV cache the context cannot help: straight to max-num-seqs."""
    if parsed.get("error_kind") != "no_kv_memory" and context // 2 >= min_context:
        new = context // 2
        estimate = parsed.get("estimated_max_model_len")
        while estimate and new > estimate and new // 2 >= min_context:
            new //= 2
        return new, seqs
    if seqs > 1:
        return context, seqs // 2
    return None


def search(context: int, seqs: int, attempt: Callable[[int, int], dict[str, Any]], *, min_context: int,
           time_left: Callable[[], bool]) -> list[dict[str, Any]]:
    """Attempts from the shipped (context, seqs) down until one starts, none is left, or time runs out."""
    tries: list[dict[str, Any]] = []
    step: tuple[int, int] | None = (context, seqs)
    while step is not None:
        row = attempt(*step)
        tries.append(row)
        if row["started"] or row.get("timed_out") or row.get("stop_search") or not time_left():
            break
        step = next_step(step[0], step[1], row["vllm"], min_context)
    return tries


def recipe_values(recipe: str, g4build: list[str], card_gib: float | None = None,
                  sets: list[str] | None = None) -> dict[str, Any]:
    """The recipe's own args and speculative method, as `g4build recipe show --json` gives them (for a card: with
    the row of its cards table that hardware.vram_gb picks, as a user's render for that card has them; ``sets``:
    the run's --set items other than args.*, such as the pin, which the render gets too)."""
    card = [w for item in sets or [] if not item.startswith("args.") for w in ("--set", item)]
    card += ["--set", f"hardware.vram_gb={card_gib:g}"] if card_gib is not None else []
    proc = subprocess.run([*g4build, "recipe", "show", recipe, *card, "--json"], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"recipe show exited {proc.returncode}: {proc.stderr[-1000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def device_total_bytes() -> int:
    """The total vLLM's request_memory multiplies (torch.cuda.mem_get_info), read in a process of its own: a CUDA
    context held here for the whole run would sit beside every attempt's."""
    code = "import torch; print(torch.cuda.mem_get_info()[1])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"torch could not read the device's memory (exit {proc.returncode}): {last[-300:]}; "
                         "run on the GPU machine's python, or give --total-bytes")
    return int(proc.stdout.split()[-1])


def render(args: argparse.Namespace, work: Path, sets: dict[str, str]) -> tuple[list[str], Path]:
    cmd = [*shlex.split(args.g4build), "recipe", "render", args.recipe, "--shell", "bash", "--out", str(work)]
    if args.wheel is not None:  # the wheel's pin and arguments, as serve_route.py renders them
        cmd += ["--wheel", str(args.wheel)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"recipe render exited {proc.returncode}: {proc.stderr[-2000:]}")
    scripts = sorted(work.glob("*.sh"))
    if len(scripts) != 1:
        raise RuntimeError(f"recipe render wrote {[s.name for s in scripts]}, expected one .sh")
    return cmd, scripts[0]


def vllm_shim(work: Path, command: str) -> Path:
    bindir = work / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shim = bindir / "vllm"
    shim.write_text(f'#!/usr/bin/env bash\nexec {command} "$@"\n')
    shim.chmod(0o755)
    return bindir


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the script's process group, SIGKILL after 30 s: the GPU memory is free when this returns."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the engine core outlives the script's own process by a moment; memory it frees while the next attempt
    # profiles fails that one (vLLM's "Error in memory profiling"), so wait until the whole group is gone
    for i in range(60):
        if not group_alive(proc.pid):
            return
        if i == 30:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(1)


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies left to a container's non-reaping init do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def one_attempt(args: argparse.Namespace, base_sets: dict[str, str], n: int, context: int, seqs: int,
                deadline: float, budget_gib: float) -> dict[str, Any]:
    work = args.work / f"attempt-{n}"
    work.mkdir(parents=True, exist_ok=True)
    sets = dict(base_sets, **{"args.max-model-len": str(context), "args.max-num-seqs": str(seqs)})
    try:
        cmd, script = render(args, work, sets)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:  # recorded: the attempts before it stay
        return {"context": context, "max_num_seqs": seqs, "started": False, "stop_search": True,
                "vllm": dict(vllm_log.parse(""), error_kind="render", error=str(exc)[:600])}
    env = launch_env(os.environ, vllm_shim(work, args.vllm_command))
    env["VLLM_LOGGING_LEVEL"] = "DEBUG"  # vLLM logs its memory profile's parts (activations, non-torch) at DEBUG
    batched = re.search(r"'--max-num-batched-tokens'\s+'([0-9]+)'", script.read_text(encoding="utf-8"))
    log_path = work / "server.log"
    row: dict[str, Any] = {"context": context, "max_num_seqs": seqs, "started": False, "timed_out": False,
                           "max_num_batched_tokens": int(batched.group(1)) if batched else None,
                           "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
                           "render": [c.replace(str(args.work), "WORK").replace(str(args.models), "MODELS")
                                      for c in cmd[len(shlex.split(args.g4build)):]]}
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            while True:
                if proc.poll() is not None:
                    break
                if http("GET", f"http://127.0.0.1:{args.port}/health", timeout=5)[0] == 200:
                    row["started"] = True
                    break
                if time.perf_counter() > deadline:
                    row["timed_out"] = True
                    break
                time.sleep(2)
            row["seconds"] = round(time.perf_counter() - t0, 1)
        finally:
            stop(proc)
    row["exit_code"] = proc.returncode
    text = log_path.read_text(errors="replace")
    row["vllm"] = vllm_log.parse(text)
    weights = row["vllm"]["weights_gib"]
    # weights alone over the budget: no smaller context or batch can start, the search ends here
    row["weights_exceed_budget"] = row["stop_search"] = weights is not None and weights >= budget_gib
    if not row["started"]:
        row["log_tail"] = text[-2500:]
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    g4 = shlex.split(args.g4build)
    recipe = recipe_values(args.recipe, g4, args.card_gib, args.set)
    rargs, spec = recipe.get("args") or {}, recipe.get("speculative") or {}
    method = spec.get("method")
    folder = args.mtp_folder if method == "mtp" else DRAFTERS.get(str(method))
    if folder is None:
        raise SystemExit(f"recipe {args.recipe}: speculative.method {method!r}, expected dflash or mtp")
    meta = json.loads((args.models / "meta.json").read_text())
    total = args.total_bytes or device_total_bytes()
    stand_in: dict[str, Any] | None = None
    if args.weights_stand_in:
        # the bf16 dummy weights stand in for the recipe's 4-bit ones: the budget grows by the difference, so what
        # is left for activations and KV cache is the card's
        card_w = float((recipe.get("footprint") or {}).get("weights_gib") or 0)
        if card_w <= 0:
            raise SystemExit(f"--weights-stand-in: recipe {args.recipe} has no footprint.weights_gib, expected one "
                             "(the 4-bit weights the bf16 ones stand in for)")
        here_w = bf16_weights_gib(args.models, folder)
        stand_in = {"bf16_weights_gib_counted": round(here_w, 2), "recipe_weights_gib": card_w}
        args.extra_gib += here_w - card_w
    # --util: the card's gpu-memory-utilization where it is not the recipe's (a card that needs more of its memory)
    recipe_util = float(rargs.get("gpu-memory-utilization", 0.9))
    card_util = args.util if args.util is not None else recipe_util
    util = scaled_util(card_util, args.card_gib, total, args.extra_gib)
    sets = {"model": str(args.models / "target"), "speculative.model": str(args.models / folder),
            "args.load-format": "dummy", "args.port": str(args.port), "args.gpu-memory-utilization": str(util),
            "hardware.vram_gb": f"{args.card_gib:g}"}  # the card's row of the recipe's cards table, if it has one
    if meta.get("target_hf_overrides"):
        sets["args.hf-overrides"] = json.dumps(meta["target_hf_overrides"], separators=(",", ":"))
    # what the run changes of the recipe names its row: a --util equal to the recipe's changes nothing
    changed: dict[str, Any] = {} if args.util in (None, recipe_util) else {"gpu-memory-utilization": args.util}
    for item in args.set:
        key, _, value = item.partition("=")
        if key == "args.gpu-memory-utilization":
            raise SystemExit("--set args.gpu-memory-utilization: the run scales it to the card's share; give the "
                             "card's utilization with --util")
        sets[key] = value
        if key.startswith("args."):
            changed[key[len("args."):]] = value
    res: dict[str, Any] = {
        "recipe": recipe.get("name") or args.recipe, "card_gib": args.card_gib,
        "card": CARDS.get(int(args.card_gib)),
        "device_total_gib": round(total / GIB, 2), "recipe_util": rargs.get("gpu-memory-utilization"),
        "extra_gib": round(args.extra_gib, 3), "stand_in": stand_in, "util": util, "changed": changed,
        "card_util": card_util, "card_row": recipe.get("card") or None,
        "budget_gib": round(util * total / GIB, 2),
        "shipped": {"context": int(rargs["max-model-len"]), "max_num_seqs": int(rargs["max-num-seqs"])},
        "drafter_folder": folder, "sets": sorted(k for k in sets if not k.startswith(("model", "speculative"))),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")},
    }
    deadline = t0 + args.limit
    counter = iter(range(1, 100))
    start = args.context or res["shipped"]["context"]
    if start != res["shipped"]["context"]:
        changed["max-model-len"] = start
    res["attempts"] = search(
        start, res["shipped"]["max_num_seqs"],
        lambda c, s: one_attempt(args, sets, next(counter), c, s, deadline, res["budget_gib"]),
        min_context=args.min_context, time_left=lambda: time.perf_counter() < deadline)
    res["summary"] = summarize(res)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    write(args.json, res)
    return res


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """One row: did the shipped settings start, the largest that did, and vLLM's figures there."""
    tries = res["attempts"]
    first, ok = tries[0], [t for t in tries if t["started"]]
    best = ok[0] if ok else None
    failed = [t for t in tries if not t["started"]]
    row: dict[str, Any] = {
        "recipe": res["recipe"], "card_gib": res["card_gib"], "budget_gib": res["budget_gib"],
        "extra_gib": res.get("extra_gib", 0.0), "stand_in": res.get("stand_in"), "shipped": res["shipped"],
        "changed": res.get("changed") or {},
        # the card's gpu-memory-utilization the budget was scaled from (runs before it was recorded: --util, else
        # the recipe's), and the cards-table row the render applied
        "card_util": res.get("card_util", (res.get("changed") or {}).get("gpu-memory-utilization",
                                                                          res.get("recipe_util"))),
        "card_row": res.get("card_row"),
        "started_at_shipped": first["started"],
        "fits": {"context": best["context"], "max_num_seqs": best["max_num_seqs"]} if best else None,
        # a started server may still log an error (vLLM logs one at start for a tokenizer without a chat template):
        # the shipped settings' error is the one that stopped them
        "shipped_error_kind": None if first["started"] else first["vllm"]["error_kind"],
        "shipped_error": None if first["started"] else first["vllm"]["error"],
        "vllm_estimated_max_model_len": next((t["vllm"]["estimated_max_model_len"] for t in failed
                                              if t["vllm"]["estimated_max_model_len"]), None),
        "searched_to_end": bool(best) or not any(t.get("timed_out") for t in tries),
        "attempts": len(tries),
    }
    src = best or first
    v = src["vllm"]
    row["at"] = {"context": src["context"], "max_num_seqs": src["max_num_seqs"], **{
        k: v[k] for k in ("weights_gib", "available_kv_gib", "kv_tokens", "max_concurrency", "graph_estimate_gib",
                          "graph_pool_gib", "non_kv_gib", "torch_peak_increase_gib", "non_torch_increase_gib")
        if k in v}}
    row["at"]["max_num_batched_tokens"] = src.get("max_num_batched_tokens")
    if v["weights_gib"] is not None and v["available_kv_gib"] is not None:
        # what rule_vram calls runtime overhead: the budget less weights and KV cache (activations, CUDA graphs,
        # non-torch memory as vLLM profiled them)
        row["at"]["overhead_gib"] = round(res["budget_gib"] - v["weights_gib"] - v["available_kv_gib"], 2)
    if res.get("stand_in") and v["weights_gib"] is not None:
        # how far the counted bf16 weights missed what vLLM loaded: the card's KV room is off by this much
        row["at"]["stand_in_residual_gib"] = round(v["weights_gib"] - res["stand_in"]["bf16_weights_gib_counted"], 2)
    if v["available_kv_gib"] is not None and v["max_concurrency"]:
        # vLLM's KV cache per sequence of the context it started at, the drafter's layers included: a second
        # figure for recipe check's kv_need.py (held so far to vLLM's refusal message, test_kv_need.py)
        row["at"]["kv_gib_per_sequence"] = round(v["available_kv_gib"] / v["max_concurrency"], 3)
    if best and v["max_concurrency"] is not None:
        row["full_context_sequences_fit"] = v["max_concurrency"] >= best["max_num_seqs"]
    return row


def row_key(row: dict[str, Any]) -> str:
    """The card, whether the recipe's cards table gave its settings, and how the run's budget or settings differ
    from those the recipe ships for that card."""
    key = f"{row['card_gib']:g}"
    if row.get("stand_in"):
        key += " stand-in"
    elif row.get("extra_gib"):
        key += f" +{row['extra_gib']:g} GiB"
    if row.get("card_row"):
        key += " card row"
    if row.get("changed"):
        key += " (" + ", ".join(f"{k} {v}" for k, v in sorted(row["changed"].items())) + ")"
    return key


def _table(paths: list[Path]) -> dict[str, dict[str, Any]]:
    rows = [summarize(json.loads(p.read_text())) for p in paths]
    table: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["recipe"], r["card_gib"])):
        key = row_key(row)
        if key in table.get(row["recipe"], {}):
            raise SystemExit(f"two runs of {row['recipe']} at {key}: fold one of them")
        table.setdefault(row["recipe"], {})[key] = row
    return table


def fold(paths: list[Path], superseded: list[Path] | None = None) -> dict[str, Any]:
    """The table of the recipes as they ship; runs of settings a recipe no longer ships go under superseded."""
    out: dict[str, Any] = {"runs": [p.name for p in paths], "table": _table(paths)}
    if superseded:
        out["superseded"] = {"runs": [p.name for p in superseded], "table": _table(superseded)}
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one recipe on one card's share: the shipped settings, then steps down")
    r.add_argument("--recipe", required=True)
    r.add_argument("--card-gib", type=float, required=True, help="the card's memory (24, 32, 96)")
    r.add_argument("--models", type=Path, required=True, help="what real_size.py wrote")
    r.add_argument("--json", type=Path, required=True)
    r.add_argument("--work", type=Path, help="scripts and server logs (default: beside --json)")
    r.add_argument("--g4build", default=f"{shlex.quote(sys.executable)} -m g4build")
    r.add_argument("--vllm-command", default=f"{shlex.quote(sys.executable)} -m vllm.entrypoints.cli.main",
                   help="what the `vllm` on the script's PATH runs")
    r.add_argument("--mtp-folder", default="mtp", choices=("mtp", "mtp-standin"))
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one more recipe --set")
    r.add_argument("--extra-gib", type=float, default=0.0, help="added to the card's budget (recorded)")
    r.add_argument("--util", type=float, help="the card's gpu-memory-utilization (default: the recipe's)")
    r.add_argument("--context", type=int, help="the first attempt's max-model-len (default: the recipe's; recorded "
                                               "in `changed`), e.g. the context a way out names")
    r.add_argument("--weights-stand-in", action="store_true",
                   help="add (bf16 weights counted from DIR - the recipe's footprint weights_gib) to the budget")
    r.add_argument("--min-context", type=int, default=4096)
    r.add_argument("--limit", type=float, default=540, help="seconds for all attempts together")
    r.add_argument("--port", type=int, default=8012)
    r.add_argument("--wheel", type=Path, help="render with --wheel (a wheel `g4build wheel` built)")
    r.add_argument("--total-bytes", type=int, help="the device's total memory (default: torch's mem_get_info)")
    f = sub.add_parser("fold", help="fold run JSONs into a recipe x card table")
    f.add_argument("runs", type=Path, nargs="+")
    f.add_argument("--superseded", type=Path, nargs="*", default=[],
                   help="runs of settings the recipes no longer ship (kept beside the table)")
    f.add_argument("--json", type=Path, required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "fold":
        write(args.json, fold(args.runs, args.superseded))
        return 0
    if args.card_gib <= 0 or args.min_context < 1:
        raise SystemExit("--card-gib must be above 0 and --min-context at least 1")
    args.work = args.work or args.json.with_name(args.json.stem + "-work")
    res = run(args)
    return 0 if res["summary"]["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
