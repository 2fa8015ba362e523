"""What the recipe rules return and what they are given (``rules.py`` and the rule modules beside it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from g4build.pins.model import Pin
from g4build.recipes.checkpoint import CheckpointInfo
from g4build.recipes.env_policy import EnvPolicy
from g4build.recipes.flashinfer import FlashInferInfo
from g4build.recipes.model import Recipe
from g4build.recipes.renamed_env import Renamed
from g4build.series.model import Series

Severity = Literal["error", "warning", "info"]
FA2_MAX_HEAD_DIM = 256  # FlashAttention 2 (all SM120 has) serves head dims up to this


@dataclass(frozen=True, kw_only=True)
class Finding:
    rule: str
    severity: Severity
    message: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "message": self.message, "hint": self.hint}


@dataclass(frozen=True, kw_only=True)
class WheelInfo:
    """What a g4build wheel's build-manifest.json says it carries."""

    file: str
    pin: str | None
    series: dict[str, int] = field(default_factory=dict)  # name -> version
    flashinfer: FlashInferInfo | None = None  # whether installing the wheel brings FlashInfer
    route: str | None = None  # the manifest's route: build or overlay (None: no manifest)
    arch: str | None = None  # the arch a g4build build was for (its manifest's target.arch)
    kernel_arch_list: str | None = None  # what that build compiled for, as recorded (unchecked: gpu_guard)


@dataclass(frozen=True, kw_only=True)
class CheckContext:
    pin: Pin | None = None  # the recipe's pin (or the wheel's), resolved from patches/pins.yaml
    known_pins: tuple[str, ...] = ()
    series: tuple[Series, ...] = ()
    target: CheckpointInfo | None = None
    drafter: CheckpointInfo | None = None
    wheel: WheelInfo | None = None
    transformers_model_types: frozenset[str] | None = None  # None: no transformers to ask here
    transformers_asked: bool = False  # False: the caller did not look (rendering), so say nothing firm
    vllm_envs: frozenset[str] | None = None  # the pin's envs.py names; None: its sdist is not here
    vllm_options: frozenset[str] | None = None  # the pin's serve options (its argument table); None: not here
    renamed_env: Mapping[str, Renamed] = field(default_factory=dict)  # recipes/vllm-args/renamed-env.yaml
    env_policy: EnvPolicy | None = None  # recipes/vllm-args/launch-env.yaml; None: not read (no env rule)
    allowed_env: frozenset[str] = frozenset()  # --allow-env names (upper case)


Rule = Callable[[Recipe, CheckContext], list[Finding]]


def is_gemma4(recipe: Recipe, ctx: CheckContext) -> bool:
    """A Gemma 4 target: by its checkpoint where one was read, else by the recipe's family or model name."""
    if ctx.target is not None:
        return ctx.target.is_gemma4
    model = recipe.model.lower()
    return recipe.family == "gemma4" or "gemma-4" in model or "gemma4" in model


def serving_pin(recipe: Recipe, ctx: CheckContext) -> str | None:
    """The pin the rules judge by: the one resolved into the context (the recipe's, or the wheel's), else the
    recipe's own name for it."""
    return ctx.pin.name if ctx.pin is not None else recipe.pin
