"""doctor's serving-environment check: the transformers (and FlashInfer) the Python that serves has, against the
pin's recorded range (``pins.serving``), by the same program the launch scripts run before ``vllm serve``."""

from __future__ import annotations

import json
from typing import Any

from g4build.builder.probe import Probe
from g4build.doctor.checks import Finding, Status
from g4build.pins.model import Pin
from g4build.pins.serving import FLASHINFER, TRANSFORMERS, check_program

CHECKS = {TRANSFORMERS: "transformers", FLASHINFER: "flashinfer-version"}  # torch: check_python_and_torch's


def _rows(probe: Probe, python: str, pin: Pin) -> list[dict[str, Any]] | None:
    res = probe.run([python, "-c", check_program(pin), "--json"], timeout=120.0)
    if res is None or res.returncode != 0 or not res.stdout.strip():
        return None
    try:
        rows = json.loads(res.stdout.strip().splitlines()[-1])
    except json.JSONDecodeError:
        return None
    return rows if isinstance(rows, list) and all(isinstance(r, dict) for r in rows) else None


def check_serving(probe: Probe, python: str, pin: Pin) -> list[Finding]:
    """One finding per package the pin records a range for (transformers: fail outside it; FlashInfer: warn)."""
    rows = _rows(probe, python, pin)
    if rows is None:
        return [Finding(check="transformers", status="warn",
                        summary=f"could not ask {python} which transformers it has",
                        fix="pass the Python that serves: g4build doctor --python PATH")]
    out = []
    for row in rows:
        check = CHECKS.get(str(row.get("project")))
        if check is None:
            continue
        found, spec, ok = row.get("found"), str(row.get("spec")), row.get("ok")
        if isinstance(found, str) and not (found.isascii() and found.isprintable()):
            found = ascii(found)  # a package's metadata: no escape sequence reaches the terminal
        wanted = f"{row.get('project')}{spec}"
        detail = {"found": found, "expected": wanted, "pin": pin.name}
        status: Status
        if ok is None:
            status, summary = "warn", f"{row.get('project')} {found}: not compared (no packaging in {python})"
        elif ok:
            status = "ok"
            summary = (f"{row.get('project')} {found} (vLLM {pin.version} wants {spec})" if found
                       else f"{row.get('project')} not installed (optional)")
        else:
            # installed outside the range fails (vLLM would not load the model); absent only warns (a machine
            # that builds need not serve)
            status = "fail" if row.get("fatal") and found is not None else "warn"
            have = "not installed" if found is None else f"{found} installed"
            summary = f"{row.get('project')} {have}; vLLM {pin.version} ({pin.name}) wants {spec}: {row.get('why')}"
        fix = (f"python -m pip install '{wanted}' in the environment that serves (its venv active)"
               if status != "ok" else "")
        out.append(Finding(check=check, status=status, summary=summary, fix=fix, detail=detail))
    return out
