"""tests/device/results/wheel-sm90-e2e.json from what one hold of tests/device/wheel_runs_session.sh brought back:
the sm_90 wheel `g4build wheel` built (file name, sha256, manifest digest, build options, validate), its acceptance
runs and served launch scripts judged by tests/gpu/e2e/acceptance_report.py, the build figures of both builds, and
the sm_120 wheel's load check.

    python tests/device/wheel_e2e_result.py --acc ACC_DIR --runs RUNS_DIR --builds RESULTS_DIR \
        [--loads sm120-wheel-loads.json] --command "..." --out tests/device/results/wheel-sm90-e2e.json

ACC_DIR: the stage's acc/ (acc.tgz): train/reference JSON and the runs, named as run_e2e.sh names them
(`target-float16-bi-eager.json`: strict numerics; `dflash.json`: vLLM's defaults; `serve-dflash.json`).
RUNS_DIR: runs/ (built.json, validate.json). RESULTS_DIR: the session's results/ (per arch: g4build-state.json,
validate.json, cubins.txt, ninja_log, build-<arch>.rc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPORT = HERE.parent / "gpu" / "e2e" / "acceptance_report.py"
STRICT = "-float16-bi-eager"


def load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def ninja_summary(log: Path, cores: int | None) -> dict[str, Any] | None:
    """Units, CPU-seconds, span and the packing bound from a .ninja_log (v5: start end mtime output hash, ms)."""
    if not log.is_file():
        return None
    rows = [ln.split("\t") for ln in log.read_text().splitlines() if ln and not ln.startswith("#")]
    spans = {r[3]: (int(r[0]), int(r[1])) for r in rows if len(r) >= 5}
    units = {k: v for k, v in spans.items() if k.endswith(".o")}
    if not units:
        return None
    cpu = sum(e - s for s, e in units.values()) / 1000
    start, end = min(s for s, _ in spans.values()), max(e for _, e in spans.values())
    longest = sorted(((e - s) / 1000, k) for k, (s, e) in units.items())[-5:][::-1]
    fa2 = [s - start for k, (s, _) in units.items() if "flash_fwd_" in k]  # when the longest family started
    return {"units": len(units), "cpu_seconds": round(cpu), "span_s": round((end - start) / 1000),
            "fa2_units_started_s": [round(min(fa2) / 1000), round(max(fa2) / 1000)] if fa2 else None,
            "packing_bound_s": round(max(cpu / cores, longest[0][0])) if cores else None,
            "longest": [{"unit": k.rsplit("/", 1)[-1], "seconds": round(s)} for s, k in longest]}


def validate_checks(validate: dict[str, Any]) -> dict[str, Any]:
    """Each check's verdict from `g4build validate --json` ({"ok", "wheels": [{"checks": [...]}]})."""
    return {c["name"]: c.get("ok") for w in validate.get("wheels", []) if isinstance(w, dict)
            for c in w.get("checks", []) if isinstance(c, dict) and "name" in c}


def build_summary(results: Path, arch: str, cores: int | None) -> dict[str, Any]:
    d = results / arch
    state = load(d / "g4build-state.json") or {}
    validate = load(d / "validate.json") or {}
    # collect writes build-<arch>.rc; an older hold wrote build.rc
    rc_file = next((f for f in (d / f"build-{arch}.rc", d / "build.rc") if f.is_file()), None)
    rc = rc_file.read_text().strip() if rc_file else None
    steps = {k: v.get("seconds") for k, v in (state.get("done") or {}).items() if isinstance(v, dict)}
    return {"rc": int(rc) if rc and rc.isdigit() else rc, "step_seconds": steps,
            "validate_ok": validate.get("ok"), "validate_checks": validate_checks(validate),
            "cubins": (d / "cubins.txt").read_text().strip().splitlines() if (d / "cubins.txt").is_file() else None,
            "ninja": ninja_summary(d / "ninja_log", cores)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--acc", type=Path, required=True, help="acc/ (without runs in it: training and references only)")
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--builds", type=Path, required=True)
    ap.add_argument("--loads", type=Path)
    ap.add_argument("--cores", type=int, help="the build machine's cores (for the packing bound)")
    ap.add_argument("--machine", default="")
    ap.add_argument("--command", action="append", default=[], help="a device call, in order (repeatable)")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    acc = args.acc
    report = [sys.executable, str(REPORT), "--train", str(acc / "train.json"), "--reference",
              str(acc / "reference.json")]
    if (acc / "train-mtp.json").is_file():
        report += ["--train-mtp", str(acc / "train-mtp.json"), "--reference-mtp", str(acc / "reference-mtp.json")]
    labels = {f"target{STRICT}": "target-strict", f"dflash{STRICT}": "dflash-strict", f"mtp{STRICT}": "mtp-strict",
              "target": "target", "dflash": "dflash", "mtp": "mtp"}
    for name, label in labels.items():
        if (acc / f"{name}.json").is_file():
            report += ["--run", f"{label}={acc / f'{name}.json'}"]
    for drafter in ("dflash", "mtp"):
        if (acc / f"serve-{drafter}.json").is_file():
            report += ["--serve", f"{drafter}={acc / f'serve-{drafter}.json'}"]
    if "--run" in report or "--serve" in report:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "acceptance.json"
            subprocess.run([*report, "--out", str(out)], check=True)
            judged = json.loads(out.read_text())
    else:  # the hold ended before any engine ran: what training and the references gave
        judged = {"runs": {}, "checks": {}, "reference": load(acc / "reference.json"),
                  "reference_mtp": load(acc / "reference-mtp.json"), "training": load(acc / "train.json"),
                  "training_mtp": load(acc / "train-mtp.json")}
    built = load(args.runs / "built.json")
    validate = load(args.runs / "validate.json") or {}
    result = {
        "what": "a wheel `g4build wheel --arch sm90 --os linux --no-flashinfer --kernels gemma4 --flash-attn 2` "
                "built, installed and served on the GPU (FlashAttention 2 alone, as on an SM120 card), beside the "
                "sm_120 wheel of the same route loaded on an H200 (sm120_loads: its own run, which may be an "
                "earlier hold's)",
        "machine": args.machine,
        "commands": args.command,
        "wheel": built,
        "validate": {"ok": validate.get("ok"), "summary": validate.get("summary")},
        "builds": {arch: build_summary(args.builds, arch, args.cores) for arch in ("sm90", "sm120")
                   if (args.builds / arch).is_dir()},
        "acceptance": judged,
        "sm120_loads": load(args.loads) if args.loads else None,
        "notes": args.note,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(judged.get("checks", {}), indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
