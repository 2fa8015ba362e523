"""FlashInfer in a launch: is it installed with the wheel, and which of vLLM's switches reach it.

Read from the pinned sdists (vllm/envs.py, vllm/v1/sample/ops/topk_topp_sampler.py,
vllm/model_executor/kernels/linear/__init__.py, the NVFP4 MoE oracle), for a Gemma 4 (NVFP4 or bf16) run with a
DFlash or MTP drafter on one SM120 GPU:

- ``VLLM_USE_FLASHINFER_SAMPLER`` is on by default (0.21.0 and 0.33.0): the top-k/top-p sampler then imports
  vLLM's FlashInfer attention backend, which imports ``flashinfer``: without FlashInfer the engine fails at start.
  ``0`` selects the PyTorch-native sampler.
- ``VLLM_NVFP4_GEMM_BACKEND`` (0.21.0): a ``flashinfer-*`` value forces that kernel, and a forced kernel that is
  not supported raises at model load. ``cutlass`` is vLLM's own NVFP4 GEMM (in ``_C``, built for sm_120 with
  ``12.0f``); unset, the automatic choice skips FlashInfer when it is missing.
- ``VLLM_USE_FLASHINFER_MOE_*`` and ``VLLM_ALLREDUCE_USE_FLASHINFER`` are off by default; set to 1 they choose
  FlashInfer kernels (the MoE ones reject Gemma 4's GELU_TANH anyway).
- An attention backend or MoE backend named ``flashinfer*`` cannot be switched off by the environment: a recipe
  that asks for one needs FlashInfer.

Attention needs no switch: Gemma 4's target runs Triton attention, a DFlash drafter FlashAttention, and on SM120
vLLM's automatic order starts with FlashAttention (FlashInfer comes first only on compute capability 10.x).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from g4build.errors import RecipeError
from g4build.recipes.model import Recipe
from g4build.util.safetext import file_name_problem

PROJECT = "flashinfer-python"  # the package that provides ``import flashinfer``
SAMPLER = "VLLM_USE_FLASHINFER_SAMPLER"
NVFP4_GEMM = "VLLM_NVFP4_GEMM_BACKEND"
LINEAR_BACKEND = "linear-backend"  # the serve option later pins read instead of NVFP4_GEMM (renamed-env.yaml)
OPT_IN = ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_USE_FLASHINFER_MOE_FP16",
          "VLLM_USE_FLASHINFER_MOE_INT4", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
          "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
          "VLLM_ALLREDUCE_USE_FLASHINFER")
_TRUE = ("1", "true", "yes", "on")

Presence = Literal["present", "absent", "unknown"]


@dataclass(frozen=True, kw_only=True)
class Switch:
    name: str
    value: str  # what turns the FlashInfer path off
    was: str | None  # the recipe's value (None: unset, vLLM's default applies)
    why: str
    option: bool = False  # a serve option (``--name value`` in the argv), not an environment variable

    @property
    def label(self) -> str:
        return f"--{self.name} {self.value}" if self.option else f"{self.name}={self.value}"


def off_switches(env: Mapping[str, str], args: Mapping[str, Any] | None = None) -> tuple[Switch, ...]:
    """The environment (and serve option) changes that close every FlashInfer path ``env`` and ``args`` leave open
    but can close, in a stable order."""
    out = []
    sampler = env.get(SAMPLER)
    if sampler is None or sampler.strip().lower() in _TRUE:
        out.append(Switch(name=SAMPLER, value="0", was=sampler,
                          why="vLLM's default sampler is FlashInfer's, imported at engine start"))
    gemm = env.get(NVFP4_GEMM)
    if gemm is not None and gemm.strip().lower().startswith("flashinfer"):
        out.append(Switch(name=NVFP4_GEMM, value="cutlass", was=gemm,
                          why=f"vLLM's own CUTLASS NVFP4 GEMM instead of the recipe's {gemm} (FlashInfer's)"))
    linear = (args or {}).get(LINEAR_BACKEND)
    if isinstance(linear, str) and linear.strip().lower().startswith("flashinfer"):
        out.append(Switch(name=LINEAR_BACKEND, value="cutlass", was=linear, option=True,
                          why=f"vLLM's own CUTLASS linear GEMMs instead of the recipe's {linear} (FlashInfer's)"))
    out += [Switch(name=name, value="0", was=env[name], why="1 chooses FlashInfer kernels")
            for name in OPT_IN if env.get(name, "").strip().lower() in _TRUE]
    return tuple(out)


def fixed_paths(recipe: Recipe) -> list[tuple[str, str, str]]:
    """(where, value, the --set that removes it) for FlashInfer choices no environment variable can undo."""
    places = [("--attention-backend", recipe.args.get("attention-backend"), "--set args.attention-backend=null"),
              ("--moe-backend", recipe.args.get("moe-backend"), "--set args.moe-backend=null")]
    if recipe.speculative:
        places += [("speculative attention_backend", recipe.speculative.get("attention_backend"),
                    "--set speculative.attention_backend=flash_attn"),
                   ("speculative moe_backend", recipe.speculative.get("moe_backend"),
                    "--set speculative.moe_backend=null")]
    return [(where, str(value), fix) for where, value, fix in places
            if isinstance(value, str) and value.lower().startswith("flashinfer")]


@dataclass(frozen=True, kw_only=True)
class FlashInferInfo:
    """Whether installing a wheel brings FlashInfer, and why g4build thinks so."""

    presence: Presence
    why: str
    wheels: tuple[str, ...] = field(default=())  # FlashInfer wheel files a build recorded, to install beside it

    def to_dict(self) -> dict[str, Any]:
        return {"presence": self.presence, "why": self.why, "wheels": list(self.wheels)}


_MANIFEST_HINT = ("the wheel's build manifest is not one g4build wrote (or it was edited): rebuild the wheel, or "
                  "render without --wheel")


def _tag_environment(filename: str) -> dict[str, str]:
    """Marker values of the platform and Python a wheel is for, from its file name's tags."""
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    parts = filename.removesuffix(".whl").split("-")
    python, platform = (parts[-3], parts[-1]) if len(parts) >= 5 else ("", "any")
    if platform.startswith("win"):
        env.update(sys_platform="win32", platform_system="Windows", os_name="nt",
                   platform_machine="AMD64" if platform.endswith("amd64") else "ARM64")
    elif "linux" in platform:
        env.update(sys_platform="linux", platform_system="Linux", os_name="posix",
                   platform_machine="aarch64" if platform.endswith("aarch64") else "x86_64")
    if python.startswith("cp3") and python[3:].isdigit():
        env.update(python_version=f"3.{python[3:]}", python_full_version=f"3.{python[3:]}.0")
    return env


def requires_flashinfer(metadata: str, filename: str) -> str | None:
    """The Requires-Dist line that makes pip install FlashInfer with this wheel on its own platform, if any."""
    env = {**_tag_environment(filename), "extra": ""}
    for line in metadata.splitlines():
        if not line.lower().startswith("requires-dist:"):
            if not line.strip():
                break  # the headers end at the first blank line
            continue
        text = line.split(":", 1)[1].strip()
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == PROJECT and (req.marker is None or req.marker.evaluate(env)):
            return text
    return None


def _wheel_files(raw: Any) -> tuple[str, ...]:
    """The FlashInfer wheel file names a build manifest records, each a FlashInfer wheel's plain file name (they
    are joined to the wheel's folder and written into launch scripts): anything else is a RecipeError."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RecipeError(f"the wheel's build-manifest.json: flashinfer.wheels is {type(raw).__name__}, expected a "
                          "list", hint=_MANIFEST_HINT)
    files = []
    for entry in raw:
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise RecipeError(f"the wheel's build-manifest.json: a flashinfer.wheels entry has no file name "
                              f"({entry!r:.80})", hint=_MANIFEST_HINT)
        why = file_name_problem(name)
        try:
            project = canonicalize_name(parse_wheel_filename(name)[0]) if not why else ""
        except (InvalidWheelFilename, InvalidVersion):
            why = "no wheel file name"
        if not why and not project.startswith(PROJECT.split("-")[0]):
            why = f"the wheel of {project}, not of FlashInfer"
        if why:
            raise RecipeError(f"the wheel's build-manifest.json names the FlashInfer wheel {name!r}: it has {why}",
                              hint=_MANIFEST_HINT)
        files.append(name)
    return tuple(files)


def wheel_flashinfer(filename: str, metadata: str, manifest: Mapping[str, Any] | None) -> FlashInferInfo:
    """What a wheel says: its build manifest's ``flashinfer`` record first, then its Requires-Dist."""
    record = manifest.get("flashinfer") if manifest else None
    if isinstance(record, dict) and record.get("source") in ("wheels", "aot"):  # aot: the jit-cache wheel
        files = _wheel_files(record.get("wheels"))
        return FlashInferInfo(presence="present", wheels=files,
                              why=f"built with the FlashInfer wheels {', '.join(files)} (sha256-checked), "
                                  "installed beside it")
    if not metadata.strip() and not isinstance(record, dict):
        return FlashInferInfo(presence="unknown", why="the wheel has no METADATA to read")
    required = requires_flashinfer(metadata, filename)
    if required:
        return FlashInferInfo(presence="present", why=f"it requires {required}: pip installs FlashInfer with it")
    built = " and its build recorded no FlashInfer wheels" if isinstance(record, dict) else ""
    return FlashInferInfo(presence="absent", why=f"its METADATA requires no {PROJECT} for its platform{built}")
