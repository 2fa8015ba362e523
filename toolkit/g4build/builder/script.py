"""A plan as a script a user runs by hand: PowerShell for Windows, bash for WSL/Linux.

Both keep the executor's resume rule: a step whose inputs digest has a marker in ``<root>/.g4build-done``
is skipped; ``G4BUILD_CLEAN=1`` forces every step.
"""

from __future__ import annotations

import re
from pathlib import Path

from g4build.builder.plan import BuildPlan, Step
from g4build.fsutil import umasked, write_atomic
from g4build.util.shellquote import bash_word, ps_quote

_SAFE_GLOB = re.compile(r"^[A-Za-z0-9._*?+-]+$")


def _ps_arg(a: str, sep: str) -> str:
    head, _, tail = a.rpartition(sep)
    if "*" in tail and head and _SAFE_GLOB.match(tail):
        return f"(Get-ChildItem -Path {ps_quote(a)}).FullName"
    return ps_quote(a)


def _sh_arg(a: str) -> str:
    head, _, tail = a.rpartition("/")
    if "*" in tail and head and _SAFE_GLOB.match(tail):
        return f"{bash_word(head)}/{tail}"
    return bash_word(a)


def _header(plan: BuildPlan, comment: str) -> list[str]:
    t = plan.target
    return [
        f"{comment} g4build plan: {plan.pin} -> vLLM {plan.version} for {t.arch.name} on {t.os} "
        f"(CUDA {t.cuda}, Python {t.python})",
        f"{comment} Re-run to resume: finished steps are skipped. Set G4BUILD_CLEAN=1 to run every step again.",
        *(f"{comment} note: {n}" for n in plan.notes),
    ]


def render_bash(plan: BuildPlan) -> str:
    lay = plan.layout
    lines = ["#!/usr/bin/env bash", *_header(plan, "#"), "set -euo pipefail", ""]
    lines += plan.setup
    for k, v in plan.env.items():
        if k == "MAX_JOBS":  # a user may know better than the machine it was planned on
            lines.append(f'export MAX_JOBS="${{MAX_JOBS:-{v}}}"')
        else:
            lines.append(f"export {k}={bash_word(v)}")
    lines += [
        f"DONE={bash_word(lay.join('.g4build-done'))}",
        'mkdir -p "$DONE"',
        'if [ "${G4BUILD_CLEAN:-0}" = 1 ]; then rm -f "$DONE"/*; fi',
        "",
        "step() {  # step NAME DIGEST CWD FRESH -- COMMAND...  (FRESH: a folder removed first, or '')",
        '  local name=$1 digest=$2 cwd=$3 fresh=$4; shift 5',
        '  if [ -n "$digest" ] && [ -f "$DONE/$name.$digest" ]; then echo "== $name: finished before, skipped"; '
        "return 0; fi",
        '  echo "== $name"',
        '  if [ -n "$fresh" ]; then rm -rf "$fresh"; fi',
        '  mkdir -p "$cwd"',
        '  local start=$SECONDS',
        '  (cd "$cwd" && "$@")',
        '  local took=$((SECONDS - start))',
        '  echo "== $name: done in ${took}s"',
        '  rm -f "$DONE/$name".*',
        '  if [ -n "$digest" ]; then touch "$DONE/$name.$digest"; fi',
        '  echo "$took" > "$DONE/$name.seconds"  # step timings for build-manifest.json',
        "}",
        "",
    ]
    for s in plan.steps:
        lines.append(_bash_step(plan, s))
    return "\n".join(lines) + "\n"


def _bash_step(plan: BuildPlan, s: Step) -> str:
    digest = s.digest(plan.env, plan.identity) if s.resumable else ""
    envs = " ".join(f"{k}={bash_word(v)}" for k, v in s.env.items())
    cmd = " ".join(_sh_arg(a) for a in s.command)
    prefix = f"env {envs} " if envs else ""
    return f"step {s.name} {bash_word(digest)} {bash_word(s.cwd)} {bash_word(s.fresh)} -- {prefix}{cmd}"


def _ps_max_jobs(nvcc_threads: int, gb_per_job: float) -> list[str]:
    """MAX_JOBS from the RAM and cores of the machine the script runs on, the rule of ``max_jobs``."""
    per_job = gb_per_job * 1e9 * max(1, nvcc_threads)
    return [
        "if (-not $env:MAX_JOBS) {",
        "  $ram = [double](Get-CimInstance -ClassName Win32_ComputerSystem).TotalPhysicalMemory",
        f"  $byRam = [Math]::Floor($ram / {per_job:.0f})",
        "  $env:MAX_JOBS = [string][Math]::Max(1, [Math]::Min([Environment]::ProcessorCount, $byRam))",
        f"  Write-Host (\"MAX_JOBS=$env:MAX_JOBS ({{0:N0}} GB RAM, ~{gb_per_job:.1f} GB per nvcc job)\" -f "
        "($ram / 1e9))",
        "}",
    ]


def render_powershell(plan: BuildPlan) -> str:
    lay = plan.layout
    lines = [*_header(plan, "#"), "$ErrorActionPreference = 'Stop'", "Set-StrictMode -Version Latest", ""]
    lines += plan.setup
    for k, v in plan.env.items():
        if k == "MAX_JOBS" and plan.jobs_from_machine:
            lines += _ps_max_jobs(int(plan.env.get("NVCC_THREADS", "1")), plan.gb_per_job)
        elif k == "MAX_JOBS":
            lines.append(f"if (-not $env:MAX_JOBS) {{ $env:MAX_JOBS = {ps_quote(v)} }}")
        else:
            lines.append(f"$env:{k} = {ps_quote(v)}")
    lines += [
        f"$Done = {ps_quote(lay.join('.g4build-done'))}",
        "New-Item -ItemType Directory -Force -Path $Done | Out-Null",
        "if ($env:G4BUILD_CLEAN -eq '1') { Remove-Item -Path (Join-Path $Done '*') -Force -ErrorAction "
        "SilentlyContinue }",
        "",
        "function Invoke-Step([string]$Name, [string]$Digest, [string]$Cwd, [string]$Fresh, [scriptblock]$Body) {",
        "  $marker = Join-Path $Done \"$Name.$Digest\"",
        "  if ($Digest -and (Test-Path $marker)) { Write-Host \"== ${Name}: finished before, skipped\"; return }",
        "  Write-Host \"== $Name\"",
        "  if ($Fresh -and (Test-Path $Fresh)) { Remove-Item -Recurse -Force -Path $Fresh }",
        "  New-Item -ItemType Directory -Force -Path $Cwd | Out-Null",
        "  $clock = [Diagnostics.Stopwatch]::StartNew()",
        "  Push-Location $Cwd",
        "  try {",
        "    & $Body",
        "    if ($LASTEXITCODE) { throw \"step $Name failed with exit code $LASTEXITCODE\" }",
        "  } finally { Pop-Location }",
        "  Write-Host (\"== ${Name}: done in {0:N0}s\" -f $clock.Elapsed.TotalSeconds)",
        "  Remove-Item -Path (Join-Path $Done \"$Name.*\") -Force -ErrorAction SilentlyContinue",
        "  if ($Digest) { New-Item -ItemType File -Force -Path $marker | Out-Null }",
        "  # step timings for build-manifest.json",
        "  Set-Content -Path (Join-Path $Done \"$Name.seconds\") -Value ([int]$clock.Elapsed.TotalSeconds)",
        "}",
        "",
    ]
    for s in plan.steps:
        digest = s.digest(plan.env, plan.identity) if s.resumable else ""
        body = [f"$env:{k} = {ps_quote(v)}" for k, v in s.env.items()]
        exe, *args = s.command
        body.append("& " + " ".join([ps_quote(exe), *(_ps_arg(a, lay.sep) for a in args)]))
        words = " ".join(ps_quote(w) for w in (s.name, digest, s.cwd, s.fresh))
        lines.append(f"Invoke-Step {words} {{ {'; '.join(body)} }}")
    return "\r\n".join(lines) + "\r\n"


def render(plan: BuildPlan) -> str:
    return render_powershell(plan) if plan.target.os == "windows" else render_bash(plan)


def script_mode(powershell: bool) -> int:
    """The permission bits of a written script: 0755 for bash, 0644 for PowerShell, as the umask allows."""
    return umasked(0o644 if powershell else 0o755)


def write_script(plan: BuildPlan, path: Path) -> str:
    """Write ``plan`` as its script at ``path`` (bytes exactly as rendered; a bash one executable where that
    means something); returns the shell's name."""
    windows = plan.target.os == "windows"
    # Windows PowerShell 5.1 reads a script without a byte order mark in the ANSI code page, which changes
    # every non-ASCII path or value (a user folder named Müller): PowerShell scripts get one, as the
    # launch scripts do. Written beside the target and renamed in, so a killed run leaves no half script.
    data = render(plan).encode("utf-8-sig" if windows else "utf-8")
    # a script is a file like any other, read by whoever may read the folder: 0755 for bash (run as
    # ./build.sh), 0644 for PowerShell (run by pwsh -File), less the umask; a link at ``path`` is replaced
    write_atomic(path, data, mode=script_mode(windows))
    return "PowerShell" if windows else "bash"
