"""The values a ``vllm serve`` option accepts, when vLLM declares them as a closed set: read from the pin's
source with ``ast`` (never imported), for the argument table of ``vllm_args``.

vLLM builds its options from the config dataclasses: a field typed ``Literal["a", "b"]`` (inline, or through a
module-level alias such as ``MoEBackend = Literal[...]``, aliases nested in aliases flattened) becomes
``choices=[...]``, which argparse checks after the option's ``type`` converted the text; a union with ``str``
becomes a free-form ``metavar`` instead (no choices). Where ``arg_utils.py`` then replaces an option's ``type``,
only the one conversion vLLM uses for backends (``lambda s: s.lower().replace("-", "_")``) is followed; any other,
or any change to the option's ``choices`` there, leaves that option unchecked rather than checked wrongly.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

# what vLLM's `lambda s: s.lower().replace("-", "_")` does to a value before argparse compares it
LOWER_UNDERSCORE = "lower-underscore"
_KNOWN_TYPES = {"s.lower().replace('-', '_')": LOWER_UNDERSCORE}


def literal_aliases(sources: Mapping[str, str]) -> dict[str, ast.expr]:
    """Module-level ``Name = Literal[...]`` / ``Name: TypeAlias = Literal[...]`` of every file, by name (a name
    defined twice with different values is left out: which one a field means is not known here)."""
    found: dict[str, ast.expr] = {}
    clash: set[str] = set()
    for text in sources.values():
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                name, value = node.target.id, node.value
            else:
                continue
            if not (isinstance(value, ast.Subscript) and ast.unparse(value.value).split(".")[-1] == "Literal"):
                continue
            if name in found and ast.dump(found[name]) != ast.dump(value):
                clash.add(name)
            found[name] = value
    return {k: v for k, v in found.items() if k not in clash}


def _members(node: ast.expr, aliases: Mapping[str, ast.expr], depth: int = 0) -> list[str] | None:
    """The strings of a ``Literal[...]`` (aliases inside flattened); None when any member is not a string."""
    if depth > 10:
        return None
    if isinstance(node, ast.Name):
        alias = aliases.get(node.id)
        return None if alias is None else _members(alias, aliases, depth + 1)
    if not (isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Literal"):
        return None
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    out: list[str] = []
    for item in items:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            out.append(item.value)
            continue
        inner = _members(item, aliases, depth + 1)
        if inner is None:
            return None
        out += inner
    return out


def _union(node: ast.expr) -> list[ast.expr]:
    """The alternatives of ``A | B | None``, ``Optional[A]`` and ``Union[A, B]``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_union(node.left), *_union(node.right)]
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] in ("Optional", "Union"):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return [alt for item in items for alt in _union(item)]
    return [node]


def annotation_choices(annotation: ast.expr, aliases: Mapping[str, ast.expr]) -> list[str] | None:
    """The values an option typed ``annotation`` takes, sorted, or None when it is no closed set of strings (no
    Literal, or a union with another type than None)."""
    alternatives = [a for a in _union(annotation) if not (isinstance(a, ast.Constant) and a.value is None)]
    if len(alternatives) != 1:
        return None
    members = _members(alternatives[0], aliases)
    return sorted(set(members)) if members else None


def retyped_fields(arg_utils: str) -> dict[str, str | None]:
    """Fields whose kwargs ``arg_utils.py`` changes by hand: field -> the known conversion of its new ``type``
    (``LOWER_UNDERSCORE``), or None when the change is one not followed here (another type, its choices)."""
    tree = ast.parse(arg_utils)
    named: dict[str, str] = {}  # moe_backend_kwargs = kernel_kwargs["moe_backend"]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Subscript) and isinstance(node.value.slice, ast.Constant)
                and isinstance(node.value.slice.value, str) and ast.unparse(node.value.value).endswith("kwargs")):
            named[node.targets[0].id] = node.value.slice.value

    def field_of(target: ast.expr) -> str | None:
        if isinstance(target, ast.Name):
            return named.get(target.id)
        if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
            value = target.slice.value
            return value if isinstance(value, str) and ast.unparse(target.value).endswith("kwargs") else None
        return None

    out: dict[str, str | None] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and node.slice.value in ("type", "choices")):
            continue
        field = field_of(node.value)
        if field is None:
            continue
        known = None
        if node.slice.value == "type":
            parent = next((a for a in ast.walk(tree) if isinstance(a, ast.Assign) and node in a.targets), None)
            if parent is not None and isinstance(parent.value, ast.Lambda):
                known = _KNOWN_TYPES.get(ast.unparse(parent.value.body))
        out[field] = known if out.get(field, known) == known else None
    return out


def normalized(value: str, convert: str | None) -> str:
    """``value`` as argparse compares it with the choices, after the option's conversion."""
    return value.lower().replace("-", "_") if convert == LOWER_UNDERSCORE else value
