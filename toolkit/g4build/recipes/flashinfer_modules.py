"""Which FlashInfer JIT modules a rendered launch makes vLLM load, from ``recipes/vllm-args/flashinfer-modules.yaml``.

The table there (read from the pinned vLLM and FlashInfer sdists; its header says where) maps launch settings to
FlashInfer's JIT module names (``sampling``, ``fp4_gemm_cutlass_sm120``) and their generators, per pin. This module
renders a recipe for a pin as ``recipe render`` does (``--set pin=``, the recipe's env re-spelt for the pin, the
launch plan's env and argv) and applies the pin's triggers to that launch: the derived list follows the recipes,
so a recipe that turns the sampler off (``--set env.VLLM_USE_FLASHINFER_SAMPLER=0``) drops ``sampling``. A launch
that reaches FlashInfer by a path the table does not know (a flashinfer attention or MoE backend, a
``VLLM_USE_FLASHINFER_MOE_*`` switch) is refused rather than built without its kernels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.data import load_yaml_mapping, recipes_dir
from g4build.errors import ConfigError, RecipeError
from g4build.pins.model import SHA256_RE, Pin
from g4build.recipes.flashinfer import OPT_IN, fixed_paths
from g4build.recipes.model import Recipe

TABLE_FILE = "vllm-args/flashinfer-modules.yaml"  # beside renamed-env.yaml: read from the pinned sources
NONZERO = "nonzero"  # vLLM reads the switch as bool(int(value))


@dataclass(frozen=True, kw_only=True)
class ModuleDef:
    name: str  # FlashInfer's JIT module name: the folder and .so name in its jit-cache
    generator: str  # flashinfer.jit.MODULE:FUNCTION, returning the JitSpec of that name
    majors: tuple[int, ...] = ()  # compute-capability majors its generator emits code for (empty: any)

    def builds_for(self, major: int) -> bool:
        return not self.majors or major in self.majors


@dataclass(frozen=True, kw_only=True)
class Trigger:
    env: str | None
    option: str | None
    values: tuple[str, ...]
    unset: str | None  # vLLM's value when the launch does not set it
    checkpoint: tuple[tuple[str, str], ...]
    modules: tuple[str, ...]
    why: str

    @property
    def label(self) -> str:
        return f"--{self.option}" if self.option else str(self.env)


@dataclass(frozen=True, kw_only=True)
class Source:
    file: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class ModuleTable:
    modules: dict[str, ModuleDef]
    sources: dict[str, Source]  # by FlashInfer version
    pins: dict[str, tuple[Trigger, ...]]


@dataclass(frozen=True, kw_only=True)
class Derived:
    module: ModuleDef
    reasons: tuple[str, ...]  # "recipe: setting (why)"


def _strs(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
        raise ConfigError(f"{where}: expected a list of names, found {raw!r:.80}")
    return tuple(raw)


def _trigger(raw: Any, where: str, modules: Mapping[str, ModuleDef]) -> Trigger:
    if not isinstance(raw, dict) or (raw.get("env") is None) == (raw.get("option") is None):
        raise ConfigError(f"{where}: expected a mapping with exactly one of env / option, found {raw!r:.80}")
    names = _strs(raw.get("modules"), f"{where}.modules")
    unknown = [n for n in names if n not in modules]
    if unknown:
        raise ConfigError(f"{where}.modules: {', '.join(unknown)} not among the table's modules "
                          f"({', '.join(modules)})", hint="add it under modules: with its generator")
    checkpoint = raw.get("checkpoint") or {}
    if not isinstance(checkpoint, dict):
        raise ConfigError(f"{where}.checkpoint: expected a mapping of checkpoint fields, found {checkpoint!r:.80}")
    unset = raw.get("unset")
    return Trigger(env=raw.get("env"), option=raw.get("option"), values=_strs(raw.get("values"), f"{where}.values"),
                   unset=None if unset is None else str(unset),
                   checkpoint=tuple((str(k), str(v)) for k, v in checkpoint.items()), modules=names,
                   why=str(raw.get("why") or "").strip())


def load_table(root: Path | None = None) -> ModuleTable:
    path = (root if root is not None else recipes_dir()) / TABLE_FILE
    data = load_yaml_mapping(path)
    where = str(path)
    modules = {}
    for name, raw in (data.get("modules") or {}).items():
        if not isinstance(raw, dict) or not isinstance(raw.get("generator"), str):
            raise ConfigError(f"{where}.modules.{name}: expected a mapping with generator: flashinfer.jit.MOD:FUNC")
        modules[str(name)] = ModuleDef(name=str(name), generator=raw["generator"],
                                       majors=tuple(int(m) for m in raw.get("majors") or ()))
    sources = {}
    for version, raw in (data.get("sources") or {}).items():
        if not isinstance(raw, dict) or not SHA256_RE.match(str(raw.get("sha256", ""))):
            raise ConfigError(f"{where}.sources.{version}: expected file and a 64-hex sha256, found {raw!r:.80}")
        sources[str(version)] = Source(file=str(raw["file"]), sha256=str(raw["sha256"]))
    tables = {str(name): tuple(_trigger(t, f"{where}.tables.{name}[{i}]", modules) for i, t in enumerate(rows))
              for name, rows in (data.get("tables") or {}).items()}
    pins = {}
    for pin, table in (data.get("pins") or {}).items():
        if table not in tables:
            raise ConfigError(f"{where}.pins.{pin}: expected one of the tables ({', '.join(tables)}), found {table!r}")
        pins[str(pin)] = tables[table]
    return ModuleTable(modules=modules, sources=sources, pins=pins)


def option_values(argv: Sequence[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` pairs of a serve argv (flags without a value map to '')."""
    out: dict[str, str] = {}
    for i, item in enumerate(argv):
        if not item.startswith("--"):
            continue
        name, eq, value = item[2:].partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name] = argv[i + 1]
        else:
            out[name] = ""
    return out


def _matches(trigger: Trigger, value: str | None) -> bool:
    value = trigger.unset if value is None else value
    if value is None:
        return False
    value = value.strip().lower()
    for want in trigger.values:
        if want == NONZERO:
            try:
                if int(value) != 0:
                    return True
            except ValueError:
                raise RecipeError(f"{trigger.label}={value!r}: expected an integer (vLLM reads it as bool(int(value)) "
                                  "and stops at start on anything else)", hint=f"set {trigger.label}=0 or 1") from None
        elif value == want.lower():
            return True
    return False


def triggered(triggers: Iterable[Trigger], env: Mapping[str, str], argv: Sequence[str],
              checkpoint: Mapping[str, Any]) -> list[tuple[Trigger, str]]:
    """The triggers a launch (env, serve argv, the recipe's checkpoint fields) fires, each with what fired it."""
    options = option_values(argv)
    fired = []
    for trigger in triggers:
        if any(str(checkpoint.get(k) or "").lower() != v.lower() for k, v in trigger.checkpoint):
            continue
        value = env.get(trigger.env) if trigger.env else options.get(str(trigger.option))
        if _matches(trigger, value):
            shown = "unset" if value is None else value
            fired.append((trigger, f"{trigger.label}={shown}"))
    return fired


def refuse_unknown_paths(recipe: Recipe, env: Mapping[str, str]) -> None:
    """FlashInfer paths the table has no modules for: building without them would JIT-compile (or fail) at start."""
    opted = [n for n in OPT_IN if env.get(n, "").strip().lower() in ("1", "true", "yes", "on")]
    places = [where for where, _value, _fix in fixed_paths(recipe)] + opted
    if places:
        raise RecipeError(f"recipe '{recipe.name}' reaches FlashInfer through {', '.join(places)}: expected only "
                          f"the paths recipes/{TABLE_FILE} knows (sampler, NVFP4 linear GEMM)",
                          hint=f"add that path's JIT modules to recipes/{TABLE_FILE} (read vLLM's source for it)")


def derive(recipe: Recipe, env: Mapping[str, str], argv: Sequence[str], pin: Pin,
           table: ModuleTable) -> list[Derived]:
    """The modules one rendered launch loads, in table order."""
    triggers = table.pins.get(pin.name)
    if triggers is None:
        raise ConfigError(f"recipes/{TABLE_FILE}: pin {pin.name} has no row (expected one per pin)",
                          hint=f"add pins.{pin.name} there, read from vLLM {pin.version}'s source")
    refuse_unknown_paths(recipe, env)
    reasons: dict[str, list[str]] = {}
    checkpoint = {"quant_method": recipe.checkpoint.quant_method, "quant_algo": recipe.checkpoint.quant_algo}
    for trigger, fired in triggered(triggers, env, argv, checkpoint):
        for name in trigger.modules:
            reasons.setdefault(name, []).append(f"{recipe.name}: {fired} ({trigger.why})")
    return [Derived(module=table.modules[n], reasons=tuple(reasons[n])) for n in table.modules if n in reasons]


def merge(lists: Iterable[list[Derived]]) -> list[Derived]:
    """The union of several recipes' modules, reasons joined, in the order they first appear."""
    out: dict[str, Derived] = {}
    for derived in lists:
        for d in derived:
            seen = out.get(d.module.name)
            out[d.module.name] = d if seen is None else Derived(module=d.module, reasons=seen.reasons + d.reasons)
    return list(out.values())


@dataclass(frozen=True, kw_only=True)
class Launch:
    recipe: Recipe
    pin: Pin
    env: dict[str, str]
    argv: tuple[str, ...]


def rendered_launch(name: str, pin_name: str, sets: Sequence[str] = ()) -> Launch:
    """A recipe as ``recipe render NAME --set pin=PIN`` would launch it (FlashInfer assumed present)."""
    from g4build.recipes import load_recipe
    from g4build.recipes.context import gather_context
    from g4build.recipes.env_names import fit_env_to_pin, user_env_names
    from g4build.recipes.prefix_cache import fit_retention_to_pin
    from g4build.recipes.script import plan_launch

    all_sets = [f"pin={pin_name}", *sets]
    recipe = load_recipe(name, all_sets)
    ctx = gather_context(recipe, ask_transformers=False)
    if ctx.pin is None:
        raise ConfigError(f"recipe {name}: pin {pin_name} is not in patches/pins.yaml")
    recipe, _ = fit_env_to_pin(recipe, ctx, user_env_names(all_sets))
    recipe = fit_retention_to_pin(recipe, ctx)
    plan = plan_launch(recipe, pin=ctx.pin)
    return Launch(recipe=recipe, pin=ctx.pin, env=dict(plan.env), argv=plan.argv)


def modules_for_pin(pin_name: str, recipes: Sequence[str], table: ModuleTable | None = None,
                    sets: Sequence[str] = ()) -> list[Derived]:
    """The modules the named recipes, each rendered for ``pin_name``, make vLLM load (their union)."""
    table = table if table is not None else load_table()
    out = []
    for name in recipes:
        launch = rendered_launch(name, pin_name, sets)
        out.append(derive(launch.recipe, launch.env, launch.argv, launch.pin, table))
    return merge(out)
