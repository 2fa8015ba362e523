"""What a launch script does, independent of the shell: one plan, two renderers.

A script sets the recipe's env, checks that ``nvidia-smi`` is present and lists a GPU, optionally installs
a wheel (and the FlashInfer wheels its build recorded), checks the pin's serving environment (``pins.serving``:
a transformers outside the pin's range stops it with both versions named), closes the FlashInfer paths where
FlashInfer is missing (see ``flashinfer``: fixed in the env or argv for a wheel known to lack it, else by a
check at start), then starts ``vllm`` with ``serve_argv(recipe)`` exactly.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from g4build import __version__
from g4build.errors import RecipeError, UsageError
from g4build.fsutil import umasked, write_atomic
from g4build.pins.model import Pin
from g4build.pins.serving import check_program, expected
from g4build.recipes.argv import env_items, serve_argv
from g4build.recipes.flashinfer import FlashInferInfo, Presence, Switch, off_switches
from g4build.recipes.folders import ModelFolder, model_folders
from g4build.recipes.gpu_guard import KernelTarget, header_line
from g4build.recipes.model import Recipe

Shell = Literal["bash", "powershell"]
SHELLS: tuple[Shell, ...] = ("bash", "powershell")
SUFFIX: dict[Shell, str] = {"bash": ".sh", "powershell": ".ps1"}
# --shell takes these too, in any case (as --os takes Windows): pwsh is PowerShell 7's program name
SHELL_ALIASES: dict[str, Shell] = {"bash": "bash", "powershell": "powershell", "pwsh": "powershell",
                                   "ps1": "powershell"}


def shell_name(value: str) -> Shell:
    """``--shell``'s value as the shell it names (``pwsh``, ``PowerShell`` -> powershell); UsageError else."""
    found = SHELL_ALIASES.get(value.strip().lower())
    if found is None:
        raise UsageError(f"--shell {value}: expected one of {', '.join(SHELL_ALIASES)} (any case), found {value!r}",
                         hint="--shell powershell (or pwsh) for Windows, --shell bash for WSL and Linux")
    return found


# The environment check's way out, for checkpoints whose configs were adapted to another transformers (e.g. a
# Gemma 4 config with `per_layer_config: null` and global_head_dim put back through --hf-overrides)
ALLOW_HINT = ("hint: where the checkpoint's config was adapted to this transformers, G4BUILD_ALLOW_ENVIRONMENT=1 "
              "serves anyway")
ALLOW_NOTE = "note: G4BUILD_ALLOW_ENVIRONMENT=1: serving outside the environment this vLLM was checked with"
# The check itself failed (not its verdict, exit 3): the launch stops as for a mismatch (fails closed)
UNCHECKED = "error: the environment check did not run to its end (python exited "


@dataclass(frozen=True, kw_only=True)
class WheelRef:
    """The wheel a script installs: a file name beside the script, or a path used as given."""

    path: str
    beside_script: bool
    companions: tuple[str, ...] = ()  # file names in the wheel's folder installed with it (FlashInfer wheels)
    kernel_archs: tuple[KernelTarget, ...] = ()  # what a g4build build compiled for (empty: not recorded)

    def sibling(self, name: str) -> str:
        """``name`` in the wheel's folder, spelled as ``path`` is (relative to the script, or absolute)."""
        if self.beside_script:
            head = self.path.rsplit("/", 1)[0] if "/" in self.path else ""
            return f"{head}/{name}" if head else name
        return os.path.join(os.path.dirname(self.path), name)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    recipe: str
    description: str
    notes: str
    overrides: tuple[str, ...]  # the keys changed with --set (values can be long or hostile: not echoed)
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]  # after the program name ``vllm``
    wheel: WheelRef | None
    arch: str  # the recipe's SM arch, e.g. sm120
    compute_capability: str  # what nvidia-smi reports for it, e.g. 12.0 (a mismatch only warns)
    version: str = __version__
    flashinfer: Presence = "unknown"  # absent: ``env`` already has the switches off; else checked at start
    flashinfer_why: str = ""
    flashinfer_off: tuple[Switch, ...] = ()  # what closes the recipe's FlashInfer paths
    # The pin's serving environment: a program that stops the launch where transformers is outside the pin's
    # range (pins.serving), and what it checks, for the header; None: no pin to check against
    environment_check: str | None = None
    environment: tuple[str, ...] = ()
    # The target's and drafter's folders: the script checks the local ones before it installs anything
    model_folders: tuple[ModelFolder, ...] = ()

    @property
    def probe_flashinfer(self) -> bool:
        return bool(self.flashinfer_off) and self.flashinfer != "absent"


def comment_lines(text: str) -> list[str]:
    """Text made safe for line comments: one list item per line, control characters shown as '?'."""
    lines = []
    for line in text.splitlines():
        cleaned = "".join("?" if unicodedata.category(c) == "Cc" and c != "\t" else c for c in line)
        lines.append(cleaned.rstrip())
    return lines


def _no_nul(values: Sequence[str], what: str) -> None:
    for value in values:
        if "\0" in value:
            raise RecipeError(f"{what} {value!r} contains a NUL character, which no program can receive")


def option_value_index(argv: Sequence[str], option: str) -> int:
    """Where the value of ``--option`` sits in ``argv`` (as ``serve_argv`` writes a one-word value)."""
    return list(argv).index(f"--{option}") + 1


def plan_launch(recipe: Recipe, *, wheel: WheelRef | None = None, overrides: Sequence[str] = (),
                flashinfer: FlashInferInfo | None = None, pin: Pin | None = None) -> LaunchPlan:
    argv = serve_argv(recipe)
    env = env_items(recipe)
    presence = flashinfer.presence if flashinfer is not None else "unknown"
    switches = off_switches(recipe.env, recipe.args)
    if presence == "absent" and switches:
        given = {k.partition("=")[0] for k in overrides}
        asked = sorted(s.name for s in switches if (f"args.{s.name}" if s.option else f"env.{s.name}") in given)
        if asked:
            where = next(s for s in switches if s.name == asked[0])
            raise RecipeError(
                f"--set {'args' if where.option else 'env'}.{asked[0]} opens a FlashInfer path, but the wheel does "
                f"not bring FlashInfer ({flashinfer.why if flashinfer else ''})",
                hint="leave it unset (the script turns it off), or use a wheel built with FlashInfer "
                     "(g4build wheel --flashinfer-wheel on Windows)")
        off = {s.name: s.value for s in switches if not s.option}
        env = [(name, off.pop(name, value)) for name, value in env] + list(off.items())
        for s in switches:
            if s.option:
                argv[option_value_index(argv, s.name)] = s.value
    _no_nul(argv, "argument")
    _no_nul([v for _, v in env], "environment value")
    if wheel is not None:
        _no_nul([wheel.path], "wheel path")
    return LaunchPlan(
        recipe=recipe.name,
        description=recipe.description,
        notes=recipe.notes_for_pin,
        overrides=tuple(dict.fromkeys(item.partition("=")[0] for item in overrides)),
        env=tuple(env),
        argv=tuple(argv),
        wheel=wheel,
        arch=recipe.hardware.arch,
        compute_capability=recipe.hardware.compute_capability,
        flashinfer=presence,
        flashinfer_why=flashinfer.why if flashinfer is not None else "",
        flashinfer_off=switches,
        environment_check=check_program(pin) if pin is not None else None,
        environment=tuple(f"{e.project}{e.spec}" + ("" if e.required else " (where installed)")
                          for e in (expected(pin) if pin is not None else ())),
        model_folders=model_folders(recipe),
    )


def header_lines(plan: LaunchPlan, shell: Shell) -> list[str]:
    """The generated header shared by both shells (without the comment marker)."""
    lines = [
        f"Generated by g4build {plan.version} from recipe '{plan.recipe}'. Do not edit: re-render with",
        f"  g4build recipe render {plan.recipe} --shell {shell}",
    ]
    if plan.overrides:
        lines.append("Rendered with --set for: " + ", ".join(comment_lines(", ".join(plan.overrides)) or ["?"]))
    if plan.wheel is not None:
        where = ""
        if plan.wheel.beside_script:
            where = " (relative to this script's folder)" if "/" in plan.wheel.path else " (in this script's folder)"
        lines.append(f"Installs the wheel {' '.join(comment_lines(plan.wheel.path))}{where} before serving.")
    if plan.wheel is not None and plan.wheel.companions:
        lines.append("With it the FlashInfer wheels its build recorded: " + ", ".join(plan.wheel.companions) + ".")
    if plan.wheel is not None:
        lines += header_line(plan.wheel.kernel_archs)
    if plan.description:
        lines += ["", *comment_lines(plan.description)]
    if plan.notes:
        lines += ["", "Notes:", *comment_lines(plan.notes)]
    if plan.environment:
        lines += ["", f"Before serving, checks the environment vLLM works in (g4build pin data): "
                      f"{', '.join(plan.environment)}; a transformers outside its range stops here, unless "
                      "G4BUILD_ALLOW_ENVIRONMENT=1 (for checkpoints whose configs were adapted to it)."]
    if fi := flashinfer_lines(plan):
        lines += ["", *fi]
    # every line once more: no text from a wheel or its manifest may end a comment, whichever field it came by
    return [part for line in lines for part in (comment_lines(line) or [""])]


def flashinfer_lines(plan: LaunchPlan) -> list[str]:
    """What the header says about FlashInfer (nothing when the recipe opens no FlashInfer path)."""
    if not plan.flashinfer_off:
        return []
    changes = [f"  {s.label}: {s.why}" for s in plan.flashinfer_off]
    if plan.flashinfer == "absent":
        return ["FlashInfer: the wheel does not bring it, so every FlashInfer path of the recipe is off:",
                *changes, *comment_lines(f"(why absent: {plan.flashinfer_why})")]
    return ["FlashInfer: where `import flashinfer` finds nothing at start (a wheel built without FlashInfer,",
            "as on Windows), the script sets these instead of letting vLLM fail:", *changes]


def wheel_version(ref: WheelRef) -> str | None:
    """The version in the wheel's file name (``0.26.0+cu132.g4.<digest>``: the digest names the series it carries),
    None for a name that is not a wheel's."""
    name = ref.path.replace("\\", "/").rsplit("/", 1)[-1]
    parts = name.split("-")
    return parts[1] if name.endswith(".whl") and len(parts) >= 5 and parts[1] else None


def installed_program(version: str) -> str:
    """A Python program that exits 3 when this venv already has vllm ``version`` (the same build: a g4build
    version names its series digest), 0 when it has another or none."""
    return ("import importlib.metadata as m, sys; "
            f"sys.exit(3 if any(d.version == {version!r} for d in m.distributions(name='vllm')) else 0)")


def probe_program() -> str:
    """A Python program that exits 3 when ``flashinfer`` is not importable (any other failure is not 3)."""
    return "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('flashinfer') else 3)"


def wheel_ref(wheel: Path | None, out_dir: Path | None) -> WheelRef | None:
    """``--wheel`` as the script finds it from any working directory.

    A wheel in ``--out``'s folder, or (both typed relative) in a folder beside it (``--out launch --wheel
    wheelhouse/x.whl``, as CI lays them out) is referenced relative to the script's own folder, so the pair can be
    moved together; any other wheel by its absolute path, resolved now (a relative path would depend on where
    the script is started).
    """
    if wheel is None:
        return None
    where = Path(os.path.abspath(wheel))
    if out_dir is not None:
        folder = Path(os.path.abspath(out_dir))
        if where.parent == folder:
            return WheelRef(path=wheel.name, beside_script=True)
        if not wheel.is_absolute() and not out_dir.is_absolute() and where.is_relative_to(folder.parent):
            return WheelRef(path=Path(os.path.relpath(where, folder)).as_posix(), beside_script=True)
    return WheelRef(path=str(where), beside_script=False)


# --set keys whose values are local paths vLLM opens: a relative one is resolved at render time
PATH_KEYS = ("model", "speculative.model")


def absolute_path_sets(sets: Sequence[str]) -> list[str]:
    """``--set model=./x`` as ``--set model=/abs/x``: the script then serves the same folder wherever it is
    started. Only values written as a relative path (``./``, ``../``) or naming an existing local path change;
    anything else (a Hugging Face id such as ``google/gemma-4``) stays as typed."""
    result = []
    for item in sets:
        key, sep, value = item.partition("=")
        explicit = value.startswith(("./", "../", ".\\", "..\\")) or value in (".", "..")
        if sep and key in PATH_KEYS and value and not os.path.isabs(value) and (explicit or os.path.exists(value)):
            item = f"{key}={os.path.abspath(value)}"
        result.append(item)
    return result


def _local_absolute(value: str) -> bool:
    """A local absolute path on either OS (``/x``, ``D:/x``, ``D:\\x``, ``\\\\host\\x``), not a Hugging Face id."""
    return value.startswith(("/", "\\\\")) or (len(value) > 2 and value[0].isalpha() and value[1] == ":"
                                                  and value[2] in "/\\")


def drafter_follows_model(recipe: Recipe, sets: Sequence[str]) -> tuple[list[str], str | None]:
    """``sets`` plus ``speculative.model=`` beside ``--set model=``'s folder, and a note saying so, when the recipe
    keeps both checkpoints in one relative folder (``./models/``) and only the target was moved.

    Without it the drafter would stay ``./models/...``, relative to wherever the script is started, while the
    target is an absolute path: the two must be found the same way. ``--set speculative.model=`` wins.
    """
    given = {item.partition("=")[0]: item.partition("=")[2] for item in sets if "=" in item}
    model, drafter = given.get("model"), (recipe.speculative or {}).get("model")
    if (model is None or "speculative.model" in given or not _local_absolute(model) or not isinstance(drafter, str)
            or not drafter.startswith(("./", "../")) or not recipe.model.startswith(("./", "../"))):
        return list(sets), None
    head, name = drafter.rsplit("/", 1)
    if recipe.model.rsplit("/", 1)[0] != head:
        return list(sets), None
    cut = max(model.rstrip("/\\").rfind("/"), model.rstrip("/\\").rfind("\\"))
    sep = model[cut] if cut >= 0 else "/"
    moved = f"{model[:cut]}{sep}{name}" if cut > 0 else f"{sep}{name}"
    note = (f"speculative.model follows --set model= to {moved} (the recipe keeps both in {head}/); "
            "--set speculative.model=PATH names another")
    return [*sets, f"speculative.model={moved}"], note


def script_filename(recipe_name: str, shell: str) -> str:
    if shell not in SUFFIX:
        raise UsageError(f"unknown shell '{shell}': expected one of {', '.join(SHELLS)}")
    return recipe_name + SUFFIX[shell]


def write_script(text: str, path: Path, shell: str) -> Path:
    """Write bytes exactly (no newline translation: values may hold newlines), whole or not at all: written
    beside ``path`` and renamed over it (``fsutil.write_atomic``), so a link planted at ``path`` is replaced,
    never written through, and no other file's mode changes. 0755 for bash, 0644 for PowerShell, less the umask.

    PowerShell scripts get a UTF-8 byte order mark: Windows PowerShell 5.1 reads a file without one in the
    ANSI code page, which would change every non-ASCII value.
    """
    data = text.encode("utf-8-sig" if shell == "powershell" else "utf-8")
    write_atomic(path, data, mode=umasked(0o755 if shell == "bash" else 0o644))
    return path
