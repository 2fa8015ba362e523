"""The checkpoint folders a launch script needs, checked before it installs anything.

``vllm serve`` opens a local target or drafter folder only after pip has installed the wheel and its ~200
dependencies and the engine has started; a folder never downloaded would fail there, minutes in. The script
checks each local folder first and names the download (``recipe.downloads``) that fills it.

Only paths written as local ones are checked (``./x``, ``../x``, ``/x``; in PowerShell also ``.\\x``, ``D:\\x``,
``\\\\host\\x``): ``google/gemma-4-31B-it`` is a Hugging Face id vLLM downloads itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from g4build.recipes.model import Recipe
from g4build.util.shellquote import bash_quote, ps_quote

Shell = Literal["bash", "powershell"]
_POSIX_PREFIXES = ("/", "./", "../")
_WINDOWS_PREFIXES = (*_POSIX_PREFIXES, ".\\", "..\\", "\\\\")


@dataclass(frozen=True, kw_only=True)
class ModelFolder:
    role: str  # "target" or "drafter", for the message
    key: str  # the --set key that moves it
    path: str  # as vllm receives it
    repo: str | None  # the Hugging Face repository it is downloaded from (recipe.downloads), None: not known


def model_folders(recipe: Recipe) -> tuple[ModelFolder, ...]:
    """The target's and the drafter's folder as the recipe (after --set) names them, local or not."""
    found = [ModelFolder(role="target", key="model", path=recipe.model, repo=recipe.downloads.get("model"))]
    drafter = (recipe.speculative or {}).get("model")
    if isinstance(drafter, str) and drafter:
        found.append(ModelFolder(role="drafter", key="speculative.model", path=drafter,
                                 repo=recipe.downloads.get("speculative.model")))
    return tuple(found)


def is_local(path: str, shell: Shell) -> bool:
    """Whether ``path`` is written as a local folder in ``shell`` (so the script can test it)."""
    if shell == "bash":
        return path.startswith(_POSIX_PREFIXES)
    drive = len(path) > 2 and path[0].isascii() and path[0].isalpha() and path[1] == ":" and path[2] in "/\\"
    return drive or path.startswith(_WINDOWS_PREFIXES)


def local_folders(folders: tuple[ModelFolder, ...], shell: Shell) -> list[ModelFolder]:
    return [f for f in folders if is_local(f.path, shell)]


def missing_messages(folder: ModelFolder, shell: Shell) -> tuple[str, str]:
    """The error and hint lines a script prints when ``folder`` is not there."""
    where = " (relative to the folder the script is started from)" if folder.path.startswith(".") else ""
    error = f"error: the {folder.role} checkpoint folder {folder.path} was not found{where}."
    shown = _shown(folder.path, shell)
    if folder.repo is not None:
        hint = (f"hint: download it with `hf download {folder.repo} --local-dir {shown}` (python -m pip install -U "
                f"huggingface_hub brings hf), or render again with --set {folder.key}=PATH naming your copy.")
    else:
        hint = f"hint: put the checkpoint there, or render again with --set {folder.key}=PATH naming your copy."
    return error, hint


def _shown(path: str, shell: Shell) -> str:
    """``path`` as one word a user can paste into ``shell``."""
    if all(c.isalnum() or c in "/\\:._-~+" for c in path):
        return path
    return bash_quote(path) if shell == "bash" else ps_quote(path)
