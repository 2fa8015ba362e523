"""Render a launch plan as a bash script.

Every value is one single-quoted word (``shellquote.bash_quote``); a ``'`` inside becomes ``'\\''`` (close,
escaped quote, reopen).
Inside single quotes bash expands nothing: ``$``, backticks, ``;``, ``"``, newlines and non-ASCII text reach
``vllm`` exactly as written, and no value can run a command.
"""

from __future__ import annotations

from g4build.recipes.folders import local_folders, missing_messages
from g4build.recipes.gpu_guard import bash_guard
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
from g4build.util.shellquote import bash_quote

NO_VENV = "error: no virtual environment is active, so pip would install the wheel into the system Python."
NO_VENV_HINT = ("hint: activate the venv vLLM runs from (e.g. . ~/g4b-venv/bin/activate), then run this script "
                "again.")
OTHER_PYTHON = "error: python3 on PATH is not the active virtual environment's: "


def folder_checks(plan: LaunchPlan) -> list[str]:
    """Stop before anything is installed when a local checkpoint folder is not there (see ``folders``)."""
    folders = local_folders(plan.model_folders, "bash")
    if not folders:
        return []
    out = ["# The checkpoint folders vllm opens: stop now, not after pip has installed the wheel's dependencies."]
    for folder in folders:
        error, hint = missing_messages(folder, "bash")
        out += [f"if [[ ! -d {bash_quote(folder.path)} ]]; then", f"  echo {bash_quote(error)} >&2",
                f"  echo {bash_quote(hint)} >&2", "  exit 1", "fi"]
    return [*out, ""]


def venv_guard() -> list[str]:
    """pip installs into the active venv only: none active, or a python3 on PATH from elsewhere, stops the script
    (as the PowerShell script does) before pip writes into the system Python."""
    return [
        "# The wheel goes into the active virtual environment, never into the system Python.",
        'if [[ -z "${VIRTUAL_ENV:-}" ]]; then',
        f"  echo {bash_quote(NO_VENV)} >&2",
        f"  echo {bash_quote(NO_VENV_HINT)} >&2",
        "  exit 1",
        "fi",
        'python3_path="$(command -v python3 || true)"',
        'case "${python3_path}" in',
        '  "${VIRTUAL_ENV%/}"/*) ;;',
        f"  *) echo {bash_quote(OTHER_PYTHON)}" + '"${python3_path:-none} (VIRTUAL_ENV is ${VIRTUAL_ENV})" >&2',
        f"     echo {bash_quote(NO_VENV_HINT)} >&2",
        "     exit 1 ;;",
        "esac",
    ]


def render_bash(plan: LaunchPlan) -> str:
    out = ["#!/usr/bin/env bash"]
    out += [f"# {line}".rstrip() for line in header_lines(plan, "bash")]
    out += [
        "#",
        "# Quoting: each value below is one single-quoted word ('\\'' stands for a quote), so bash expands",
        "# nothing inside it and vllm receives it exactly as the recipe wrote it. That is why shellcheck's",
        "# notes on literal $/backticks (SC2016), on '\\'' (SC1003) and on typographic quotes (SC1112) are off.",
        "# shellcheck disable=SC1003,SC1112,SC2016",
        "set -euo pipefail",
        "",
    ]
    for name, value in plan.env:
        out.append(f"export {name}={bash_quote(value)}")
    if plan.env:
        out.append("")
    out += [
        "if ! command -v nvidia-smi >/dev/null 2>&1; then",
        "  echo 'error: nvidia-smi was not found on PATH, so no NVIDIA GPU can be used here.' >&2",
        "  echo 'hint: install the NVIDIA driver (in WSL the Windows driver provides nvidia-smi), then run this"
        " script again.' >&2",
        "  exit 1",
        "fi",
        "if ! nvidia-smi -L; then",
        "  echo 'error: nvidia-smi did not list a GPU (see its message above).' >&2",
        "  exit 1",
        "fi",
        "# Other GPUs may work but are not what the recipe was measured on: warn, do not stop.",
        "if caps=\"$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader)\"; then",
        "  case \"${caps}\" in",
        f"    *{plan.compute_capability}*) ;;",
        f"    *) echo \"warning: this recipe is for {plan.arch} (compute capability {plan.compute_capability}); "
        "nvidia-smi reports: ${caps//$'\\n'/ }\" >&2 ;;",
        "  esac",
        "fi",
        "",
    ]
    out += bash_guard(plan.wheel.kernel_archs if plan.wheel is not None else ())
    out += folder_checks(plan)
    if plan.wheel is not None:
        out += venv_guard()
        paths = [plan.wheel.path, *(plan.wheel.sibling(name) for name in plan.wheel.companions)]
        if plan.wheel.beside_script:
            out.append('script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"')
            install = "python3 -m pip install " + " ".join(f'"${{script_dir}}"/{bash_quote(p)}' for p in paths)
        else:
            install = "python3 -m pip install " + " ".join(bash_quote(p) for p in paths)
        version = wheel_version(plan.wheel)
        if version is None:
            out.append(install)
        else:
            note = f"note: vllm {version} is already installed here: not installing the wheel again"
            out += [
                "# Install the wheel unless this Python already has that very build (its version names the series).",
                "installed_rc=0",
                f"python3 -c {bash_quote(installed_program(version))} || installed_rc=$?",
                'if [[ "${installed_rc}" -eq 3 ]]; then',
                f"  echo {bash_quote(note)} >&2",
                "else",
                f"  {install}",
                "fi",
            ]
        out.append("")
    if plan.environment_check is not None:
        out += [
            "# The environment this vLLM works in (see the header): stop with a clear message, not a model-load",
            "# traceback minutes later.",
            "if command -v python3 >/dev/null 2>&1; then",
            "  environment_rc=0",
            f"  python3 -c {bash_quote(plan.environment_check)} || environment_rc=$?",
            '  if [[ "${environment_rc}" -ne 0 ]]; then',
            '    if [[ "${environment_rc}" -ne 3 ]]; then',
            f"      echo {bash_quote(UNCHECKED)}" + '"${environment_rc})" >&2',
            "    fi",
            '    if [[ "${G4BUILD_ALLOW_ENVIRONMENT:-}" != 1 ]]; then',
            f"      echo {bash_quote(ALLOW_HINT)} >&2",
            "      exit 1",
            "    fi",
            f"    echo {bash_quote(ALLOW_NOTE)} >&2",
            "  fi",
            "fi",
            "",
        ]
    if plan.probe_flashinfer:
        changes = ", ".join(s.label for s in plan.flashinfer_off)
        out += [
            "# FlashInfer: where it is not installed, close the paths that would import it (see the header).",
            "if command -v python3 >/dev/null 2>&1; then",
            "  flashinfer_rc=0",
            f"  python3 -c {bash_quote(probe_program())} || flashinfer_rc=$?",
            '  if [[ "${flashinfer_rc}" -eq 3 ]]; then',
            f"    echo {bash_quote('note: FlashInfer is not installed: serving without it (' + changes + ')')} >&2",
            *(f"    export {sw.name}={bash_quote(sw.value)}" for sw in plan.flashinfer_off if not sw.option),
            "  fi",
            "fi",
            "",
        ]
    out.append("vllm_args=(")
    out += [f"  {bash_quote(word)}" for word in plan.argv]
    out.append(")")
    options = [sw for sw in plan.flashinfer_off if sw.option] if plan.probe_flashinfer else []
    if options:  # a serve option the probe above found pointing at a missing FlashInfer
        out += ['if [[ "${flashinfer_rc:-0}" -eq 3 ]]; then',
                *(f"  vllm_args[{option_value_index(plan.argv, sw.name)}]={bash_quote(sw.value)}" for sw in options),
                "fi"]
    out += ['exec vllm "${vllm_args[@]}"', ""]
    return "\n".join(out)
