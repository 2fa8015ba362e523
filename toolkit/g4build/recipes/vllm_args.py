"""``--set args.*`` and ``--set speculative.*`` checked against the pinned vLLM's own arguments.

The names come from the pin's sdist (the cached, sha256-checked archive; never imported, parsed with ``ast``):

- ``args.NAME``: the fields of ``EngineArgs`` / ``AsyncEngineArgs`` (``vllm/engine/arg_utils.py``) and of the
  server's ``BaseFrontendArgs`` / ``FrontendArgs`` (``vllm/entrypoints/{openai,launchers,common}/cli_args.py``,
  as the release has it), in kebab case,
  plus the literal ``--flags`` those files add by hand; ``no-NAME`` for a boolean ``NAME``.
- ``speculative.NAME``: the fields of ``SpeculativeConfig`` (``vllm/config/speculative.py``).

Values are checked modestly: an option vLLM declares as a closed set of strings (a ``Literal``, see
``vllm_choices``) must be one of them (``--set args.moe-backend=marlinx`` is refused, naming the choices); for
integer fields (annotation ``int`` or ``int | None``): the value must be an
integer, within the ``Field(gt=/ge=/lt=/le=)`` bounds vLLM declares (on the field itself or on the config field
its default refers to, e.g. ``ModelConfig.max_model_len``); with no declared bound, a field whose name ends in
``len``, ``size``, ``tokens`` or ``seqs`` must be at least 1 (or at least its default when that is lower: 0 is
``ubatch_size``'s "off"). Each pin's table is recorded in the project as data (``recipes/vllm-args/<pin>.json``,
stamped with the sdist's sha256; ``pins add`` writes it, a test keeps it equal to what the sdist gives), so the
check works offline for every pin, always. A pin without one falls back to the cache (keyed by the sdist's
sha256) or the cached sdist; with neither nothing is downloaded and the result says "not checked".
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.data import recipes_dir
from g4build.errors import ConfigError, G4BuildError, UsageError
from g4build.fsutil import write_atomic
from g4build.pins.index import cache_root, sha256_file
from g4build.pins.model import Pin, load_pins
from g4build.recipes.counts import human_int
from g4build.recipes.overrides import parse_override
from g4build.recipes.vllm_choices import annotation_choices, literal_aliases, normalized, retyped_fields
from g4build.util.safeload import read_json

# Bump when the table's layout or the rules that build it change: older cache entries are then ignored.
_TABLE_VERSION = 2  # 2: "choices" (and "convert") for options typed as a Literal
_ENGINE_FILE = "vllm/engine/arg_utils.py"
# the server's options moved: openai/ up to 0.26.0, launchers/ in 0.29.0, common/ from 0.33.0
_FRONTEND_FILES = ("vllm/entrypoints/openai/cli_args.py", "vllm/entrypoints/launchers/cli_args.py",
                   "vllm/entrypoints/common/cli_args.py")
_SPEC_FILE = "vllm/config/speculative.py"
_ENGINE_CLASSES = ("EngineArgs", "AsyncEngineArgs")
_FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")
_COUNT_NAME = re.compile(r"(^|_)(len|size|tokens|seqs)$")
_INT_ANNOTATIONS = {"int", "int | None", "None | int", "Optional[int]"}


@dataclass(frozen=True, kw_only=True)
class SetsCheck:
    """What happened to the ``--set`` items: ``checked`` against ``version``, or not, and why (``note``)."""

    checked: bool
    version: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "vllm": self.version, "note": self.note}


# --- reading the source ------------------------------------------------------------------------------------


def _sources(archive: Path) -> dict[str, str]:
    """The files the table is built from, by path inside the package (``vllm/...``), read without extracting."""
    wanted = (_ENGINE_FILE, *_FRONTEND_FILES, _SPEC_FILE)
    found: dict[str, str] = {}
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            # sdist members are "vllm-X.Y.Z/vllm/...": drop the top folder
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if not member.isfile() or not (rel in wanted or (rel.startswith("vllm/config/") and rel.endswith(".py"))):
                continue
            handle = tar.extractfile(member)
            if handle is not None:
                found[rel] = handle.read().decode("utf-8")
    return found


def _classes(text: str) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}


def _fields(cls: ast.ClassDef) -> Iterator[tuple[str, ast.expr, ast.expr | None]]:
    """(name, annotation, default) of each annotated class attribute (a dataclass field)."""
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            # private fields (_api_process_count) and class variables are no command-line options
            if node.target.id.startswith("_") or ast.unparse(node.annotation).startswith("ClassVar"):
                continue
            yield node.target.id, node.annotation, node.value


def _bounds(call: ast.expr | None) -> dict[str, float]:
    """``Field(..., gt=0)`` -> {"gt": 0}: the numeric bounds a pydantic field declares."""
    if not isinstance(call, ast.Call) or ast.unparse(call.func).split(".")[-1] != "Field":
        return {}
    found: dict[str, float] = {}
    for kw in call.keywords:
        if kw.arg in ("gt", "ge", "lt", "le"):
            try:
                value = ast.literal_eval(kw.value)
            except ValueError:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[kw.arg] = value
    return found


def _literal_default(node: ast.expr | None) -> Any:
    if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Field":
        node = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def _config_fields(sources: dict[str, str]) -> dict[tuple[str, str], ast.expr | None]:
    """(ConfigClass, field) -> default expression, for every class under vllm/config/."""
    table: dict[tuple[str, str], ast.expr | None] = {}
    for rel, text in sources.items():
        if rel.startswith("vllm/config/"):
            for name, cls in _classes(text).items():
                for field, _annotation, default in _fields(cls):
                    table[(name, field)] = default
    return table


def _referenced(default: ast.expr | None, configs: dict[tuple[str, str], ast.expr | None]) -> ast.expr | None:
    """EngineArgs defaults point at config fields (``ModelConfig.max_model_len``,
    ``get_field(CacheConfig, "x")``): the config field's own default carries the bounds."""
    if isinstance(default, ast.Attribute) and isinstance(default.value, ast.Name):
        return configs.get((default.value.id, default.attr))
    if (isinstance(default, ast.Call) and ast.unparse(default.func) == "get_field" and len(default.args) == 2
            and isinstance(default.args[0], ast.Name) and isinstance(default.args[1], ast.Constant)):
        return configs.get((default.args[0].id, str(default.args[1].value)))
    return None


def _field_rule(name: str, annotation: ast.expr, default: ast.expr | None,
                configs: dict[tuple[str, str], ast.expr | None]) -> dict[str, Any]:
    text = ast.unparse(annotation)
    rule: dict[str, Any] = {"bool": text in ("bool", "bool | None")}
    if text not in _INT_ANNOTATIONS:
        return rule
    rule["int"] = True
    target = _referenced(default, configs)
    bounds = _bounds(default) or _bounds(target)
    if not bounds and _COUNT_NAME.search(name):
        start = _literal_default(target if target is not None else default)
        lowest = start if isinstance(start, int) and not isinstance(start, bool) and start < 1 else 1
        bounds = {"ge": lowest}
    rule.update(bounds)
    return rule


def _flags(text: str) -> set[str]:
    """Options a file adds by hand: ``parser.add_argument("--headless", ...)``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    found.add(arg.value[2:])
    return found


def _human_readable(text: str) -> dict[str, str]:
    """Fields whose command-line type is one of vLLM's human-readable integer parsers ('128k'), from the
    ``if name == "max_model_len": kwargs[name]["type"] = human_readable_int_or_auto`` branches."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "name"):
            continue
        parsers = {n.id for stmt in node.body if isinstance(stmt, ast.Assign)
                   for n in [stmt.value] if isinstance(n, ast.Name) and n.id.startswith("human_readable_int")}
        if len(parsers) != 1:
            continue
        target = node.test.comparators[0]
        names = [target] if isinstance(target, ast.Constant) else getattr(target, "elts", [])
        (parser,) = parsers
        for item in names:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                found[item.value] = parser
    return found


def build_table(sources: dict[str, str]) -> dict[str, Any]:
    """{"args": {kebab-name: rule}, "speculative": {name: rule}} from the pinned source files."""
    frontend = next((f for f in _FRONTEND_FILES if f in sources), _FRONTEND_FILES[0])
    missing = [f for f in (_ENGINE_FILE, frontend, _SPEC_FILE) if f not in sources]
    if missing:
        raise ValueError(f"the sdist lacks {', '.join(missing)}")
    configs = _config_fields(sources)
    aliases = literal_aliases(sources)
    retyped = {**retyped_fields(sources[frontend]), **retyped_fields(sources[_ENGINE_FILE])}
    args: dict[str, Any] = {}
    for rel, names in ((_ENGINE_FILE, _ENGINE_CLASSES), (frontend, _FRONTEND_CLASSES)):
        classes = _classes(sources[rel])
        for cls_name in names:
            if cls_name not in classes:
                raise ValueError(f"{rel} has no class {cls_name}")
            for name, annotation, default in _fields(classes[cls_name]):
                rule = _field_rule(name, annotation, default, configs)
                choices = None if rule["bool"] or rule.get("int") else annotation_choices(annotation, aliases)
                if choices and (name not in retyped or retyped[name] is not None):
                    rule["choices"] = choices
                    if retyped.get(name):
                        rule["convert"] = retyped[name]
                args[name.replace("_", "-")] = rule
        for flag in _flags(sources[rel]):
            args.setdefault(flag, {"bool": False})
    for name, parser in _human_readable(sources[_ENGINE_FILE]).items():
        found = args.get(name.replace("_", "-"))
        if found is not None and found.get("int"):
            found["human"] = parser
    spec_classes = _classes(sources[_SPEC_FILE])
    if "SpeculativeConfig" not in spec_classes:
        raise ValueError(f"{_SPEC_FILE} has no class SpeculativeConfig")
    speculative = {name: _field_rule(name, annotation, default, configs)
                   for name, annotation, default in _fields(spec_classes["SpeculativeConfig"])}
    return {"table_version": _TABLE_VERSION, "args": args, "speculative": speculative}


# --- the cache ---------------------------------------------------------------------------------------------


def _cache_file(pin: Pin) -> Path:
    return cache_root() / "vllm-args" / f"{pin.name}-{pin.sdist.sha256[:16]}.json"


TABLE_MAX_BYTES = 4 << 20  # a table is ~20 KB
TABLES_DIR = "vllm-args"  # recipes/vllm-args/<pin>.json: the tables recorded with the project's pins


def recorded_table_path(pin: Pin, root: Path | None = None) -> Path:
    return (root / "recipes" if root is not None else recipes_dir()) / TABLES_DIR / f"{pin.name}.json"


def recorded_table(pin: Pin) -> dict[str, Any] | None:
    """The table recorded in the project for ``pin`` (written by `pins add`, kept current by a test), when it was
    built from this pin's sdist with the current rules; else None."""
    try:
        data = read_json(recorded_table_path(pin), TABLE_MAX_BYTES, "a recorded argument table")
    except ConfigError:  # absent, or not a regular, bounded JSON file: built from the sdist instead
        return None
    if (isinstance(data, dict) and data.get("table_version") == _TABLE_VERSION
            and data.get("sdist_sha256") == pin.sdist.sha256.lower()):
        return data
    return None


def table_from_sdist(pin: Pin, archive: Path) -> dict[str, Any]:
    """The pin's table built from its sdist, stamped with the sdist's sha256 (what a recorded table is)."""
    return {**build_table(_sources(archive)), "pin": pin.name, "sdist_sha256": pin.sdist.sha256.lower()}


def record_table(pin: Pin, root: Path) -> Path | None:
    """Write ``pin``'s table into the project at ``root`` from the cached, sha256-checked sdist (as `pins add`
    leaves it); None when that sdist is not in the cache."""
    archive = cache_root() / "sdists" / pin.sdist.file
    if not archive.is_file() or sha256_file(archive) != pin.sdist.sha256.lower():
        return None
    path = recorded_table_path(pin, root)
    write_atomic(path, (json.dumps(table_from_sdist(pin, archive), indent=1, sort_keys=True) + "\n").encode())
    return path


def pinned_table(pin: Pin) -> dict[str, Any] | None:
    """The pin's table as recorded in the project, else from the cache, else built from the cached sdist; None
    when none of them is here (a pin added by hand, offline)."""
    recorded = recorded_table(pin)
    if recorded is not None:
        return recorded
    cached = _cache_file(pin)
    try:
        data = read_json(cached, TABLE_MAX_BYTES, "a cached argument table")
        if isinstance(data, dict) and data.get("table_version") == _TABLE_VERSION:
            return data
    except ConfigError:
        pass
    archive = cache_root() / "sdists" / pin.sdist.file
    if not archive.is_file() or sha256_file(archive) != pin.sdist.sha256.lower():
        return None
    table = build_table(_sources(archive))
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_name(f"{cached.name}.{os.getpid()}.part")
    part.write_text(json.dumps(table, sort_keys=True), encoding="utf-8")
    os.replace(part, cached)  # complete or absent, also with two processes at once
    return table


# --- the check ---------------------------------------------------------------------------------------------


def _suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _human_int(key: str, text: str, *, auto: bool, version: str) -> int:
    """The number vLLM reads from '128k' (decimal suffixes) or '2K' (binary, whole numbers only)."""
    if auto and text.strip().lower() == "auto":
        return -1
    value = human_int(text)
    if value is None:
        example = "an integer, 'auto'" if auto else "an integer"
        raise UsageError(f"--set {key}={text!r}: expected {example} or a number with a k/m/g/t (x1000) or K/M/G/T "
                         f"(x1024) suffix, as vLLM {version} reads it; found {text!r}")
    return value


def _check_choice(key: str, value: Any, rule: dict[str, Any], version: str) -> None:
    choices: list[str] = rule["choices"]
    if isinstance(value, str) and normalized(value, rule.get("convert")) in choices:
        return
    close = _suggest(value, choices) if isinstance(value, str) else ""
    raise UsageError(f"--set {key}={value!r}: expected one of {', '.join(choices)} (the values vLLM {version} "
                     f"accepts), found {value!r}", hint=close or f"give {key} one of the values listed")


def _check_value(key: str, value: Any, rule: dict[str, Any], version: str) -> None:
    if value is None:  # null removes the option: nothing to check
        return
    if rule.get("choices"):
        _check_choice(key, value, rule, version)
        return
    if not rule.get("int"):
        return
    if isinstance(value, str) and rule.get("human"):
        value = _human_int(key, value, auto=rule["human"].endswith("_or_auto"), version=version)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"--set {key}={value!r}: expected an integer (vLLM {version} declares it int), "
                         f"found {type(value).__name__}")
    words = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}
    for op, bound in rule.items():
        if op not in words:
            continue
        holds = {"gt": value > bound, "ge": value >= bound, "lt": value < bound, "le": value <= bound}[op]
        if not holds:
            raise UsageError(f"--set {key}={value}: expected an integer {words[op]} {bound:g} for vLLM {version}, "
                             f"found {value}", hint=f"give {key} a value {words[op]} {bound:g}")


def check_sets(sets: Sequence[str], pin_name: str | None) -> SetsCheck:
    """Check each ``--set`` item under ``args`` / ``speculative`` against ``pin_name``'s vLLM (None: the
    default pin). Raises UsageError (exit 2) on an unknown name or a bad value."""
    parsed = [parse_override(item) for item in sets]
    relevant = [(o.path, o.value) for o in parsed if o.path[0] in ("args", "speculative") and len(o.path) > 1]
    try:
        pin = load_pins().get(pin_name)
    except G4BuildError as exc:
        return SetsCheck(checked=False, note=f"--set names not checked: {exc.message}")
    if not relevant:
        return SetsCheck(checked=True, version=pin.version)
    try:
        table = pinned_table(pin)
    except ValueError as exc:  # a release whose files moved again: say so instead of failing unexpectedly
        return SetsCheck(checked=False, version=pin.version,
                         note=f"--set names not checked against vLLM {pin.version}: its sdist cannot be read ({exc})")
    if table is None:
        return SetsCheck(checked=False, version=pin.version, note=(
            f"--set names not checked against vLLM {pin.version}: the project records no argument table for "
            f"{pin.name} (recipes/{TABLES_DIR}/{pin.name}.json, written by `g4build pins add`) and its sdist is not "
            f"in the cache; run `g4build source fetch --pin {pin.name}` once to check them"))
    for path, value in relevant:
        head, name = path[0], path[1]
        key = ".".join(path)
        known: dict[str, Any] = table[head]
        lookup = name[3:] if head == "args" and name.startswith("no-") and name not in known else name
        rule = known.get(lookup)
        if rule is None or (lookup != name and not rule.get("bool")):
            where = "an option of `vllm serve`" if head == "args" else "a SpeculativeConfig field"
            hint = _suggest(name, sorted(known))
            raise UsageError(f"--set {key}: expected {where} of vLLM {pin.version}, found unknown '{name}'",
                             hint=hint or f"see `vllm serve --help` for vLLM {pin.version}")
        if len(path) == 2:
            _check_value(key, value, rule, pin.version)
    return SetsCheck(checked=True, version=pin.version)
