"""The recipe model: one YAML file under ``recipes/`` describes one way to launch ``vllm serve``.

A recipe is data only. ``argv.py`` turns it into the exact argument vector, the renderers turn that vector
into a script, and ``rules.py`` checks it. Every string a recipe holds is treated as an opaque value: it is
never interpreted by a shell, only quoted.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g4build.data import load_yaml_mapping, recipes_dir
from g4build.errors import ConfigError, UsageError
from g4build.util.yamlsafe import check_tree

# A scalar an option can take; lists give options that take several values; mappings become compact JSON.
Scalar = str | int | float | bool
ArgValue = Scalar | list[str | int | float] | dict[str, Any]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OPTION_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
ARCH_RE = re.compile(r"^sm_?([0-9]{2,3})[af]?$")

TOP_LEVEL_KEYS = (
    "name",
    "description",
    "family",
    "model",
    "served_model_names",
    "checkpoint",
    "hardware",
    "pin",
    "needs_series",
    "env",
    "args",
    "speculative",
    "sliding_attention_backend",
    "footprint",
    "downloads",
    "notes",
    "pin_notes",
    "cards",  # settings per card (cards.py): applied by load_recipe, which validates them
)
CHECKPOINT_KEYS = ("quant_method", "quant_algo")
HARDWARE_KEYS = ("vram_gb", "arch")
KV_KEYS = (
    "full_layers",
    "full_kv_heads",
    "full_head_dim",
    "sliding_layers",
    "sliding_kv_heads",
    "sliding_head_dim",
    "sliding_window",
)
FOOTPRINT_KEYS = ("weights_gib", "kv", "draft_kv")
MAX_COUNT = 1 << 31  # a layer, head or window count past this is a mistake, not a model
MAX_GB = 1 << 20  # a card's memory or a checkpoint's weights, in GB / GiB
# sliding_attention_backend: the backends a model's sliding-window layers can be given apart from its other layers
# (vLLM's attention_config.backend_per_kind), by the name vLLM's enum gives each. FlashAttention is the one the
# series make exact for multimodal-prefix models (Gemma 4) without FA4.
SLIDING_ATTENTION_BACKENDS = {"flash_attn": "FLASH_ATTN"}
# Options that have their own recipe field, so they cannot also appear under ``args``.
# downloads: where a local checkpoint folder comes from, by the field that names the folder
DOWNLOAD_KEYS = ("model", "speculative.model")
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
RESERVED_OPTIONS = {
    "model": "model",
    "served-model-name": "served_model_names",
    "speculative-config": "speculative",
}


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """What the recipe expects the checkpoint to be (``--model-dir`` reads the real one)."""

    quant_method: str | None = None
    quant_algo: str | None = None


@dataclass(frozen=True, kw_only=True)
class Hardware:
    vram_gb: float
    arch: str  # e.g. "sm120"

    @property
    def compute_capability(self) -> str:
        """What ``nvidia-smi --query-gpu=compute_cap`` prints for this arch: sm120 -> 12.0."""
        match = ARCH_RE.fullmatch(self.arch)
        assert match is not None  # checked when parsed
        digits = match.group(1)
        return f"{int(digits[:-1])}.{digits[-1]}"


@dataclass(frozen=True, kw_only=True)
class KvGeometry:
    """Attention layers that hold KV cache, split by kind (Gemma 4 mixes sliding and full layers)."""

    full_layers: int
    full_kv_heads: int
    full_head_dim: int
    sliding_layers: int = 0
    sliding_kv_heads: int = 0
    sliding_head_dim: int = 0
    sliding_window: int = 0


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """A rough memory estimate for the VRAM rule when no ``--model-dir`` is given."""

    weights_gib: float
    kv: KvGeometry | None = None
    draft_kv: KvGeometry | None = None  # the drafter's own KV-holding layers (none: it holds none, or unknown)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    description: str
    family: str
    model: str
    served_model_names: tuple[str, ...]
    checkpoint: Checkpoint
    hardware: Hardware
    pin: str | None
    needs_series: tuple[str, ...]
    env: dict[str, str]
    args: dict[str, ArgValue]
    speculative: dict[str, Any] | None
    footprint: Footprint | None
    notes: str
    # The sliding-window layers' own backend (a key of SLIDING_ATTENTION_BACKENDS), None: the model's choice.
    sliding_attention_backend: str | None = None
    # The Hugging Face repository each local checkpoint folder is downloaded from (keys of DOWNLOAD_KEYS): the
    # launch script names it when the folder is missing
    downloads: dict[str, str] = field(default_factory=dict)
    # Notes that hold for one pin only (pin name -> text): a script rendered for another pin leaves them out
    pin_notes: dict[str, str] = field(default_factory=dict)
    # The row of the cards table applied for hardware.vram_gb, described (cards.py); "" when none applied
    card: str = ""
    source: Path | None = field(default=None, compare=False)

    @property
    def method(self) -> str | None:
        """The speculative method (``dflash``, ``mtp``, ...) or None for no speculation."""
        if not self.speculative:
            return None
        method = self.speculative.get("method")
        return str(method).lower() if method is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "family": self.family,
            "model": self.model,
            "served_model_names": list(self.served_model_names),
            "checkpoint": {"quant_method": self.checkpoint.quant_method, "quant_algo": self.checkpoint.quant_algo},
            "hardware": {"vram_gb": self.hardware.vram_gb, "arch": self.hardware.arch},
            "pin": self.pin,
            "needs_series": list(self.needs_series),
            "env": dict(self.env),
            "args": dict(self.args),
            "speculative": self.speculative,
            "sliding_attention_backend": self.sliding_attention_backend,
            "footprint": None
            if self.footprint is None
            else {
                "weights_gib": self.footprint.weights_gib,
                "kv": None if self.footprint.kv is None else vars(self.footprint.kv).copy(),
                "draft_kv": None if self.footprint.draft_kv is None else vars(self.footprint.draft_kv).copy(),
            },
            "downloads": dict(self.downloads),
            "notes": self.notes,
            "pin_notes": dict(self.pin_notes),
            "card": self.card,
        }

    @property
    def notes_for_pin(self) -> str:
        """``notes`` with the note for this recipe's pin, if it has one, after them."""
        extra = self.pin_notes.get(self.pin or "", "")
        card = textwrap.fill(self.card, width=110, break_on_hyphens=False)  # one line in findings, wrapped here
        return "\n".join(part.rstrip("\n") for part in (self.notes, extra, card) if part.strip())


def _check_keys(raw: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = [k for k in raw if k not in allowed]
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}: expected some of {', '.join(allowed)}"
        )


def _mapping(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, found {type(raw).__name__} ({raw!r})")
    return raw


def _text(raw: Any, where: str, *, allow_none: bool = False) -> str | None:
    if raw is None and allow_none:
        return None
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: expected a string, found {type(raw).__name__} ({raw!r})")
    return raw


def _number(raw: Any, where: str, *, low: float, high: float, above_low: bool = False) -> float:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``above_low``): the rules compute with it."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(f"{where}: expected a number, found {type(raw).__name__} ({raw!r})")
    value = float(raw)
    if not (low < value if above_low else low <= value) or not value <= high:  # also refuses nan and inf
        span = f"above {low:g} and at most {high:.0f}" if above_low else f"from {low:g} to {high:.0f}"
        raise ConfigError(f"{where}: expected a finite number {span}, found {raw!r}",
                          hint="write the size as a plain number, e.g. 32")
    return value


def _count(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_COUNT:
        raise ConfigError(f"{where}: expected a whole number from 0 to {MAX_COUNT}, found {raw!r}")
    return raw


def _str_list(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(f"{where}: expected a string or a list of strings, found {raw!r}")
    return tuple(raw)


def _env(raw: Any, where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for key, value in _mapping(raw, where).items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise ConfigError(f"{where}: {key!r} is not an environment variable name (letters, digits, _)")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(
                f"{where}.{key}: expected a string, found {type(value).__name__} ({value!r})",
                hint=f"quote the value in YAML, e.g. {key}: \"{value}\"",
            )
        same = next((k for k in env if k.upper() == key.upper()), None)
        if same is not None:  # one variable on Windows, where the last would win unseen
            raise ConfigError(f"{where}: {same!r} and {key!r} name one environment variable (names compare "
                              "case-insensitively on Windows)", hint="keep one spelling, in upper case")
        env[key] = str(value)
    return env


def _arg_value(value: Any, where: str) -> ArgValue:
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise ConfigError(f"{where}: list items must be strings or numbers, found {item!r}")
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    raise ConfigError(f"{where}: expected a string, number, true/false, a list or a mapping, found {value!r}")


def _args(raw: Any, where: str) -> dict[str, ArgValue]:
    args: dict[str, ArgValue] = {}
    for key, value in _mapping(raw, where).items():
        if not isinstance(key, str) or not OPTION_RE.fullmatch(key):
            raise ConfigError(
                f"{where}: {key!r} is not an option name",
                hint="write vllm serve options without dashes in front, in kebab case, e.g. max-model-len",
            )
        if key in RESERVED_OPTIONS:
            raise ConfigError(f"{where}.{key}: set the recipe field '{RESERVED_OPTIONS[key]}' instead")
        if value is None:  # null removes an option (useful with --set)
            continue
        args[key] = _arg_value(value, f"{where}.{key}")
    return args


def _kv(raw: Any, where: str) -> KvGeometry | None:
    if raw is None:
        return None
    data = _mapping(raw, where)
    _check_keys(data, KV_KEYS, where)
    for key in ("full_layers", "full_kv_heads", "full_head_dim"):
        if key not in data:
            raise ConfigError(f"{where}: missing key '{key}'")
    return KvGeometry(**{k: _count(v, f"{where}.{k}") for k, v in data.items()})


def _downloads(raw: Any, where: str) -> dict[str, str]:
    found = _mapping(raw, where)
    _check_keys(found, DOWNLOAD_KEYS, where)
    result = {}
    for key, value in found.items():
        if not isinstance(value, str) or not REPO_ID_RE.fullmatch(value):
            raise ConfigError(f"{where}.{key}: expected a Hugging Face repository id (owner/name), found {value!r}")
        result[key] = value
    return result


def _pin_notes(raw: Any, where: str) -> dict[str, str]:
    result = {}
    for key, value in _mapping(raw, where).items():
        if not isinstance(key, str) or not NAME_RE.fullmatch(key):
            raise ConfigError(f"{where}: {key!r} is not a pin name (e.g. vllm-0.21.0)")
        result[key] = str(_text(value, f"{where}.{key}"))
    return result


def _sliding_backend(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    name = str(_text(raw, where)).lower()
    if name not in SLIDING_ATTENTION_BACKENDS:
        raise ConfigError(
            f"{where}: expected {' or '.join(SLIDING_ATTENTION_BACKENDS)} (sliding-window layers on that backend) or "
            f"null (the model's own choice), found {raw!r}"
        )
    return name


def parse_recipe(data: dict[str, Any], where: str, *, source: Path | None = None) -> Recipe:
    """Validate a recipe mapping (after overrides) into a ``Recipe``."""
    check_tree(data, where)  # NUL, control characters or a lone surrogate would break the rendered script
    _check_keys(data, TOP_LEVEL_KEYS, where)
    name = _text(data.get("name"), f"{where}.name")
    assert name is not None
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}.name: {name!r} must be lower case letters, digits, '.', '-' or '_'")
    model = _text(data.get("model"), f"{where}.model")
    assert model is not None
    if not model or model.startswith("-"):
        raise ConfigError(f"{where}.model: expected a path or a model id, found {model!r}",
                          hint="a model path cannot start with '-'; write ./-name for such a folder")
    served = _str_list(data.get("served_model_names"), f"{where}.served_model_names")
    for item in served:
        if not item or item.startswith("-"):
            raise ConfigError(f"{where}.served_model_names: {item!r} cannot be empty or start with '-'")
    checkpoint_raw = _mapping(data.get("checkpoint"), f"{where}.checkpoint")
    _check_keys(checkpoint_raw, CHECKPOINT_KEYS, f"{where}.checkpoint")
    hardware_raw = _mapping(data.get("hardware"), f"{where}.hardware")
    _check_keys(hardware_raw, HARDWARE_KEYS, f"{where}.hardware")
    for key in HARDWARE_KEYS:
        if key not in hardware_raw:
            raise ConfigError(f"{where}.hardware: missing key '{key}'")
    arch = str(_text(hardware_raw["arch"], f"{where}.hardware.arch")).lower()
    if not ARCH_RE.fullmatch(arch):
        raise ConfigError(f"{where}.hardware.arch: expected an SM arch such as sm120 or sm121, found {arch!r}")
    footprint_raw = data.get("footprint")
    footprint = None
    if footprint_raw is not None:
        fp = _mapping(footprint_raw, f"{where}.footprint")
        _check_keys(fp, FOOTPRINT_KEYS, f"{where}.footprint")
        footprint = Footprint(
            weights_gib=_number(fp.get("weights_gib"), f"{where}.footprint.weights_gib", low=0, high=MAX_GB),
            kv=_kv(fp.get("kv"), f"{where}.footprint.kv"),
            draft_kv=_kv(fp.get("draft_kv"), f"{where}.footprint.draft_kv"),
        )
    speculative = data.get("speculative")
    if speculative is not None:
        speculative = dict(_mapping(speculative, f"{where}.speculative"))
        if "method" not in speculative:
            raise ConfigError(f"{where}.speculative: missing key 'method' (e.g. dflash, mtp)")
    return Recipe(
        name=name,
        description=_text(data.get("description", ""), f"{where}.description") or "",
        family=(_text(data.get("family", ""), f"{where}.family") or "").lower(),
        model=model,
        served_model_names=served,
        checkpoint=Checkpoint(
            quant_method=_text(checkpoint_raw.get("quant_method"), f"{where}.checkpoint.quant_method", allow_none=True),
            quant_algo=_text(checkpoint_raw.get("quant_algo"), f"{where}.checkpoint.quant_algo", allow_none=True),
        ),
        hardware=Hardware(
            vram_gb=_number(hardware_raw["vram_gb"], f"{where}.hardware.vram_gb", low=0, high=MAX_GB,
                            above_low=True),
            arch=arch,
        ),
        pin=_text(data.get("pin"), f"{where}.pin", allow_none=True),
        needs_series=_str_list(data.get("needs_series"), f"{where}.needs_series"),
        env=_env(data.get("env"), f"{where}.env"),
        args=_args(data.get("args"), f"{where}.args"),
        speculative=speculative,
        footprint=footprint,
        notes=_text(data.get("notes", ""), f"{where}.notes") or "",
        sliding_attention_backend=_sliding_backend(data.get("sliding_attention_backend"),
                                                   f"{where}.sliding_attention_backend"),
        downloads=_downloads(data.get("downloads"), f"{where}.downloads"),
        pin_notes=_pin_notes(data.get("pin_notes"), f"{where}.pin_notes"),
        source=source,
    )


def recipe_path(name_or_path: str, root: Path | None = None) -> Path:
    """``NAME`` (a file ``recipes/NAME.yaml``) or a path to a recipe file."""
    folder = root or recipes_dir()
    candidate = folder / f"{name_or_path}.yaml"
    if NAME_RE.fullmatch(name_or_path) and candidate.is_file():
        return candidate
    as_path = Path(name_or_path)
    if as_path.suffix in (".yaml", ".yml") and as_path.is_file():
        return as_path
    known = ", ".join(recipe_names(folder)) or "none"
    raise UsageError(
        f"unknown recipe '{name_or_path}': expected one of {known} or a path to a recipe .yaml file",
        hint="run `g4build recipe list` to see the recipes",
    )


def recipe_names(root: Path | None = None) -> list[str]:
    folder = root or recipes_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_recipe_data(name_or_path: str, root: Path | None = None) -> tuple[dict[str, Any], Path]:
    path = recipe_path(name_or_path, root)
    data = load_yaml_mapping(path)
    if data.get("name") != path.stem:
        found = data.get("name")
        # a copied or renamed recipe file: say both ways out (the name is the script's file name too)
        named = isinstance(found, str) and NAME_RE.match(found)
        rename = f"rename the file to {found}{path.suffix}, or " if named else ""
        raise ConfigError(f"{path}.name: expected '{path.stem}' (the file's name), found {found!r}",
                          hint=f"{rename}set `name: {path.stem}` in {path.name}")
    return data, path


parse_args, parse_text = _args, _text  # for cards.py, whose rows are args and text as the recipe's are
