"""Render a launch plan as a PowerShell script that passes arguments exactly on 5.1 and 7.x.

Values are PowerShell verbatim (single-quoted) strings (``shellquote.ps_quote``): nothing inside is expanded.
PowerShell takes five single-quote characters (' and the typographic U+2018, U+2019, U+201A, U+201B) and a
doubled one stands for itself, so each of them is doubled.

Native arguments: PowerShell 7.3+ has ``$PSNativeCommandArgumentPassing``; the script sets it to
``'Standard'``, which hands every array element to ``vllm`` exactly. Windows PowerShell 5.1 and 7.0-7.2
(the "Legacy" passing) join arguments into a command line without escaping embedded double quotes and drop
empty ones, so ``{"method":"dflash"}`` would arrive as ``{method:dflash}``. For those hosts the script
carries a second array with each value already quoted for the Windows command line
(``shellquote.windows_word``): wrapped in ``"…"``, each ``"`` as ``\\"``, backslashes before a quote or the end
doubled. Legacy passing leaves such a word untouched (its whitespace is inside quotes) and the program's argument
parser (CommandLineToArgvW / the C runtime, or .NET on Unix) turns it back into the exact value.
"""

from __future__ import annotations

from g4build.recipes.folders import local_folders, missing_messages
from g4build.recipes.gpu_guard import powershell_guard
from g4build.recipes.script import (
    ALLOW_HINT,
    ALLOW_NOTE,
    UNCHECKED,
    LaunchPlan,
    header_lines,
    installed_program,
    option_value_index,
    probe_program,
    wheel_version,
)
from g4build.util.shellquote import ps_quote, windows_word

HOW_ARGUMENTS_PASS = [
    "How the arguments reach vllm exactly, in Windows PowerShell 5.1 and PowerShell 7.x:",
    "- $vllmArgs holds each value as a single-quoted string ('' stands for one quote; nothing is expanded).",
    "- Where $PSNativeCommandArgumentPassing exists (7.3+), the script sets it to 'Standard', which passes",
    "  each element exactly, embedded double quotes included, and runs vllm with $vllmArgs.",
    "- Elsewhere (5.1, 7.0-7.2: Legacy passing drops embedded double quotes and empty values) it runs vllm",
    '  with $vllmArgsLegacy: the same values pre-quoted for the Windows command line ("..." around, \\" for',
    "  a quote, backslashes before a quote doubled), which Legacy passing leaves as they are.",
    "This file is UTF-8 with a byte order mark so that 5.1 reads non-ASCII values correctly.",
]


def _path(beside_script: bool, path: str) -> str:
    """A PowerShell expression for a file: relative to the script's folder, or the absolute path as given."""
    return f"Join-Path -Path $PSScriptRoot -ChildPath {ps_quote(path)}" if beside_script else ps_quote(path)


def _array(name: str, words: list[str]) -> list[str]:
    return [f"${name} = @(", *(f"    {w}" for w in words), ")"]


def _python_lines(*, installs: bool) -> list[str]:
    """``$python``: the one interpreter the script installs into and asks about FlashInfer, the active virtual
    environment's own (``$env:VIRTUAL_ENV``, as the build script checks), never whatever ``python`` PATH finds
    first. A script that installs a wheel stops outside a venv (pip would write into the global Python)."""
    lines = [
        "# The interpreter this script installs into and probes: the active virtual environment's own.",
        "$python = $null",
        "if ($env:VIRTUAL_ENV) {",
        "    foreach ($candidate in @('Scripts\\python.exe', 'bin/python')) {",
        "        $exe = Join-Path -Path $env:VIRTUAL_ENV -ChildPath $candidate",
        "        if (-not $python -and (Test-Path -LiteralPath $exe -PathType Leaf)) { $python = $exe }",
        "    }",
        "}",
    ]
    if installs:
        lines += [
            "if (-not $python) {",
            "    [Console]::Error.WriteLine('error: no virtual environment is active, so pip would install the wheel"
            " into the global Python.')",
            "    [Console]::Error.WriteLine('hint: activate the venv vLLM runs from (e.g. C:\\g4b\\venv\\Scripts\\"
            "Activate.ps1), then run this script again.')",
            "    exit 1",
            "}",
        ]
    else:
        lines += [
            "if (-not $python) {",
            "    $found = Get-Command -Name 'python' -CommandType Application -ErrorAction SilentlyContinue |"
            " Select-Object -First 1",
            "    if ($found) { $python = $found.Source }",
            "}",
        ]
    return [*lines, ""]


def _folder_checks(plan: LaunchPlan) -> list[str]:
    """Stop before anything is installed when a local checkpoint folder is not there (see ``folders``)."""
    folders = local_folders(plan.model_folders, "powershell")
    if not folders:
        return []
    out = ["# The checkpoint folders vllm opens: stop now, not after pip has installed the wheel's dependencies."]
    for folder in folders:
        error, hint = missing_messages(folder, "powershell")
        out += [f"if (-not (Test-Path -LiteralPath {ps_quote(folder.path)} -PathType Container)) {{",
                f"    [Console]::Error.WriteLine({ps_quote(error)})",
                f"    [Console]::Error.WriteLine({ps_quote(hint)})",
                "    exit 1",
                "}"]
    return [*out, ""]


def render_powershell(plan: LaunchPlan) -> str:
    out = [f"# {line}".rstrip() for line in [*header_lines(plan, "powershell"), "", *HOW_ARGUMENTS_PASS]]
    out += [
        "",
        "$ErrorActionPreference = 'Stop'",
        "Set-StrictMode -Version 3.0",
        "",
    ]
    for name, value in plan.env:
        out.append(f"$env:{name} = {ps_quote(value)}")
    if plan.env:
        out.append("")
    out += [
        "if (-not (Get-Command -Name 'nvidia-smi' -CommandType Application -ErrorAction SilentlyContinue)) {",
        "    [Console]::Error.WriteLine('error: nvidia-smi was not found on PATH, so no NVIDIA GPU can be used"
        " here.')",
        "    [Console]::Error.WriteLine('hint: install the NVIDIA driver, then run this script again.')",
        "    exit 1",
        "}",
        "& nvidia-smi -L",
        "if ($LASTEXITCODE -ne 0) {",
        "    [Console]::Error.WriteLine('error: nvidia-smi did not list a GPU (see its message above).')",
        "    exit 1",
        "}",
        "# Other GPUs may work but are not what the recipe was measured on: warn, do not stop.",
        "$caps = @(& nvidia-smi '--query-gpu=compute_cap' '--format=csv,noheader' |"
        " ForEach-Object { ([string]$_).Trim() })",
        f"if ($LASTEXITCODE -eq 0 -and -not ($caps -contains '{plan.compute_capability}')) {{",
        f"    [Console]::Error.WriteLine('warning: this recipe is for {plan.arch} (compute capability "
        f"{plan.compute_capability}); nvidia-smi reports: ' + ($caps -join ' '))",
        "}",
        "",
    ]
    out += powershell_guard(plan.wheel.kernel_archs if plan.wheel is not None else ())
    out += _folder_checks(plan)
    if plan.wheel is not None or plan.probe_flashinfer or plan.environment_check is not None:
        out += _python_lines(installs=plan.wheel is not None)
    if plan.wheel is not None:
        out.append(f"$wheel = {_path(plan.wheel.beside_script, plan.wheel.path)}")
        install = "& $python -m pip install $wheel"
        if plan.wheel.companions:
            out += _array("flashinferWheels", [f"({_path(plan.wheel.beside_script, plan.wheel.sibling(name))})"
                                               for name in plan.wheel.companions])
            install += " @flashinferWheels"
        version = wheel_version(plan.wheel)
        if version is None:
            out += [install, "if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }", ""]
        else:
            note = ps_quote(f"note: vllm {version} is already installed here: not installing the wheel again")
            out += [
                "# Install the wheel unless this venv already has that very build (its version names the series).",
                f"& $python -c {ps_quote(installed_program(version))}",
                "if ($LASTEXITCODE -eq 3) {",
                f"    [Console]::Error.WriteLine({note})",
                "} else {",
                f"    {install}",
                "    if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }",
                "}",
                "",
            ]
    if plan.environment_check is not None:
        out += [
            "# The environment this vLLM works in (see the header): stop with a clear message, not a model-load",
            "# traceback minutes later.",
            "if ($python) {",
            f"    & $python -c {ps_quote(plan.environment_check)}",
            "    if ($LASTEXITCODE -ne 0) {",
            "        if ($LASTEXITCODE -ne 3) {",
            f"            [Console]::Error.WriteLine({ps_quote(UNCHECKED)} + $LASTEXITCODE + ')')",
            "        }",
            "        if ($env:G4BUILD_ALLOW_ENVIRONMENT -ne '1') {",
            f"            [Console]::Error.WriteLine({ps_quote(ALLOW_HINT)})",
            "            exit 1",
            "        }",
            f"        [Console]::Error.WriteLine({ps_quote(ALLOW_NOTE)})",
            "    }",
            "}",
            "",
        ]
    if plan.probe_flashinfer:
        note = ps_quote("note: FlashInfer is not installed: serving without it ("
                     + ", ".join(s.label for s in plan.flashinfer_off) + ")")
        options = [sw for sw in plan.flashinfer_off if sw.option]
        out += [
            "# FlashInfer: where it is not installed, close the paths that would import it (see the header).",
            *(["$flashinferMissing = $false"] if options else []),
            "if ($python) {",
            f"    & $python -c {ps_quote(probe_program())}",
            "    if ($LASTEXITCODE -eq 3) {",
            f"        [Console]::Error.WriteLine({note})",
            *(["        $flashinferMissing = $true"] if options else []),
            *(f"        $env:{sw.name} = {ps_quote(sw.value)}" for sw in plan.flashinfer_off if not sw.option),
            "    }",
            "}",
            "",
        ]
    out += _array("vllmArgs", [ps_quote(w) for w in plan.argv])
    out += _array("vllmArgsLegacy", [ps_quote(windows_word(w)) for w in plan.argv])
    options = [sw for sw in plan.flashinfer_off if sw.option] if plan.probe_flashinfer else []
    if options:  # a serve option the probe above found pointing at a missing FlashInfer
        out.append("if ($flashinferMissing) {")
        for sw in options:
            at = option_value_index(plan.argv, sw.name)
            out += [f"    $vllmArgs[{at}] = {ps_quote(sw.value)}",
                    f"    $vllmArgsLegacy[{at}] = {ps_quote(windows_word(sw.value))}"]
        out.append("}")
    out += [
        "if (Get-Variable -Name 'PSNativeCommandArgumentPassing' -ErrorAction SilentlyContinue) {",
        "    $PSNativeCommandArgumentPassing = 'Standard'",
        "    $argv = $vllmArgs",
        "} else {",
        "    $argv = $vllmArgsLegacy",
        "}",
        "& vllm @argv",
        "exit $LASTEXITCODE",
        "",
    ]
    return "\n".join(out)
