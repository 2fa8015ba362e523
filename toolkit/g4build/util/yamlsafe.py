"""One safe way to read YAML data files (pins, series, recipes, the CI matrix) and to check their text.

PyYAML's ``safe_load`` still lets a hostile file do harm: a repeated key silently replaces the first one,
anchors and aliases expand into exponential trees (an "alias bomb"), and escapes such as ``"\\0"`` or
``"\\ud800"`` put NUL or a lone surrogate into a value. ``load_text`` refuses all of these, naming the file,
the key and the line. ``confined`` keeps a path taken from a data file inside the folder it belongs to.

Plain values are typed as YAML 1.2's core schema types them (``true``/``false``, ``null``, decimal/``0x``/``0o``
integers, decimals): a plain value that YAML 1.1 (PyYAML's default, and many other readers) types differently is
refused, naming the key, rather than read either way. ``off``, ``no``, ``yes`` and ``on`` (booleans in 1.1, text in
1.2), ``36:24:32`` (a base-60 number in 1.1), ``010`` (octal 8 in 1.1, 10 in 1.2), ``1_000``, ``0b11``, ``0o17``,
``1e5`` and dates: quote them for text, or write ``false`` / ``10`` / ``1.0e+5``. Numbers are at most
``MAX_NUMBER_CHARS`` characters long.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from g4build.errors import ConfigError
from g4build.util.safeload import MAX_NUMBER_CHARS, read_regular

# C0 controls other than tab, LF and CR; DEL and C1 controls; surrogates (only ever lone in a str).
_BAD_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_DRIVE = re.compile(r"[A-Za-z]:")
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Data files here are a few KB; the cap keeps a huge or deeply nested file from costing memory or the stack.
MAX_DATA_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), plus the merge key, kept so that '<<'
# gets its own refusal below
_CORE_12 = (
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", "~nN"),
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    (_INT_TAG, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    (_FLOAT_TAG, r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)",
     "-+.0123456789"),
    (_MERGE_TAG, r"<<", "<"),
)
_YAML_HINT = "g4build reads data files as YAML 1.2 and refuses plain values other YAML readers take another way"
_YAML_11 = Resolver()  # PyYAML's own (1.1) resolution, to find the values the two versions read differently
_TYPE_WORDS = {"tag:yaml.org,2002:str": "text", "tag:yaml.org,2002:bool": "a boolean", _INT_TAG: "an integer",
               _FLOAT_TAG: "a number", "tag:yaml.org,2002:timestamp": "a date",
               "tag:yaml.org,2002:value": "a default-value marker"}


def text_problem(text: str) -> str | None:
    """Why ``text`` is not clean Unicode text (NUL, a control character, a lone surrogate), or None."""
    m = _BAD_CHAR.search(text)
    if m is None:
        return None
    code = ord(m.group())
    if code == 0:
        kind = "a NUL character"
    elif 0xD800 <= code <= 0xDFFF:
        kind = f"a lone surrogate U+{code:04X} (not valid Unicode text)"
    else:
        kind = f"the control character U+{code:04X}"
    return f"{kind} at offset {m.start()}"


def check_tree(value: Any, where: str) -> None:
    """Refuse any key or string inside ``value`` that is not clean text; ``where`` names the root key."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise ConfigError(f"{at}: the value holds {problem}",
                                  hint="remove it; values must be plain Unicode text")
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and (problem := text_problem(key)):
                    raise ConfigError(f"{at}: the key {key!r} holds {problem}",
                                      hint="remove it; keys must be plain Unicode text")
                stack.append((child, f"{at}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{i}]") for i, child in enumerate(item))


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases while composing, before anything can expand."""

    source_name = "<yaml>"
    yaml_implicit_resolvers = {}  # noqa: RUF012 - filled once, below (YAML 1.2 core)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, AliasEvent):
            raise ConfigError(
                f"{self.source_name}:{line}: alias '*{event.anchor}' found; "
                "anchors and aliases are not allowed in g4build data files",
                hint="write the value out in full where it is needed",
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise ConfigError(
                f"{self.source_name}:{line}: anchor '&{anchor}' found; "
                "anchors and aliases are not allowed in g4build data files",
                hint="drop the anchor and write the value out in full where it is needed",
            )
        node = super().compose_node(parent, index)
        if isinstance(event, ScalarEvent) and event.tag not in (None, "!"):
            setattr(node, "explicit_tag", True)  # noqa: B010 - a tagged scalar means what its tag says
        return node


for _tag, _pattern, _first in _CORE_12:
    _Loader.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_first))


_CORE_12_TYPED = re.compile("^(?:" + "|".join(pattern for _, pattern, _ in _CORE_12) + ")$")


class Dumper(yaml.SafeDumper):
    """PyYAML's SafeDumper, writing text that ``load_text`` reads back as the same text.

    SafeDumper quotes a string only where YAML 1.1 would type it otherwise; ``531e968659`` (a short commit) or
    ``0o17`` are text there but numbers in YAML 1.2, so it wrote them plain and the reader here refused them.
    Text goes out plain only where both versions read it as text; text with a newline as a literal block; text
    with a control character or a Unicode line break escaped in double quotes (the reader then refuses it,
    rather than read NEL back as a space).
    """

    def ignore_aliases(self, data: Any) -> bool:
        return True  # anchors and aliases are refused on reading


def _represent_text(dumper: yaml.SafeDumper, value: str) -> ScalarNode:
    if _BAD_CHAR.search(value) or any(ch in value for ch in "\x85\u2028\u2029"):
        style: str | None = '"'  # escaped: written raw, NEL and the Unicode line breaks would read back as breaks
    else:
        style = "|" if "\n" in value else "'" if _CORE_12_TYPED.match(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _represent_text)


def _int_12(text: str) -> int:
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    base = 16 if digits[:2] == "0x" else 8 if digits[:2] == "0o" else 10
    return sign * int(digits[2:] if base != 10 else digits, base)


def _plain_problem(loader: _Loader, node: ScalarNode) -> str | None:
    """Why a plain scalar is refused: it reads differently in YAML 1.1 than in 1.2, or it is a number too long."""
    if node.style is not None or getattr(node, "explicit_tag", False):
        return None  # quoted, or explicitly tagged: it means what it says
    old = _YAML_11.resolve(ScalarNode, node.value, (True, False))  # type: ignore[no-untyped-call]
    if {node.tag, old} & {_INT_TAG, _FLOAT_TAG} and len(node.value) > MAX_NUMBER_CHARS:
        return (f"the number {node.value[:20]}... has {len(node.value)} characters, more than the "
                f"{MAX_NUMBER_CHARS} a data file's number may have; quote it if it is text")
    if old == node.tag == _INT_TAG:
        was_int, now_int = SafeConstructor().construct_yaml_int(node), _int_12(node.value)
        if was_int == now_int:
            return None
        was, now = f"the integer {was_int}", f"the integer {now_int}"
    elif old == node.tag:
        return None
    else:
        was, now = (_TYPE_WORDS.get(tag, tag.rsplit(":", 1)[-1]) for tag in (old, node.tag))
    return (f"the plain value {node.value!r} reads as {was} in YAML 1.1 but as {now} in YAML 1.2, so readers "
            f"disagree on it; quote it ('{node.value}') for the text, or write what YAML 1.2 reads as meant "
            "(true/false, 10, 1.0e+5)")


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _check_nodes(loader: _Loader, root: Node, source: str) -> None:
    """Duplicate keys, merge keys, bad characters and depth, found on the composed tree (key path named)."""
    stack: list[tuple[Node, str, int]] = [(root, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        at = f"{source}:{_line(node)}" + (f" (key {path})" if path else "")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{at}: nested deeper than {MAX_DEPTH} levels", hint="data files are shallow; "
                              "check the file for a mistake")
        if isinstance(node, ScalarNode):
            problem = text_problem(node.value)
            if problem:
                raise ConfigError(f"{at}: the value holds {problem}",
                                  hint="remove it; values must be plain Unicode text")
            if problem := _plain_problem(loader, node):
                raise ConfigError(f"{at}: {problem}", hint=_YAML_HINT)
        elif isinstance(node, SequenceNode):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node.value))
        elif isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    raise ConfigError(f"{source}:{_line(key_node)}: merge key '<<' under {path or 'the top level'}"
                                      " is not allowed in g4build data files",
                                      hint="write the keys out in full")
                if not isinstance(key_node, ScalarNode):
                    raise ConfigError(f"{source}:{_line(key_node)}: a key under {path or 'the top level'} is a "
                                      "list or mapping; expected plain text", hint="keys must be scalars")
                problem = text_problem(key_node.value)
                if problem:
                    raise ConfigError(f"{source}:{_line(key_node)}: the key {key_node.value!r} under "
                                      f"{path or 'the top level'} holds {problem}", hint="remove it")
                if problem := _plain_problem(loader, key_node):
                    raise ConfigError(f"{source}:{_line(key_node)}: a key under {path or 'the top level'}: {problem}",
                                      hint=_YAML_HINT)
                key = loader.construct_object(key_node)
                name = f"{path}.{key}" if path else str(key)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key (e.g. a !!binary value) cannot be a mapping key either
                    raise ConfigError(f"{source}:{_line(key_node)}: key {key!r} under {path or 'the top level'}"
                                      " cannot be used as a mapping key") from None
                if first is not None:
                    raise ConfigError(
                        f"{source}: duplicate key '{name}' at line {first} and again at line {_line(key_node)}",
                        hint="keep one of them; YAML would silently use the last",
                    )
                seen[key] = _line(key_node)
                stack.append((value_node, name, depth + 1))


def load_text(text: str, source: str) -> Any:
    """Parse one YAML document safely (see the module docstring); ``source`` names it in errors."""
    if len(text) > MAX_DATA_BYTES:
        raise ConfigError(f"{source}: {len(text)} characters, more than a data file may hold ({MAX_DATA_BYTES})",
                          hint="check that this is the right file")
    try:
        loader = _Loader(text)  # the reader refuses control characters here, before any parsing
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}", hint="remove the control character") from exc
    loader.source_name = source
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_nodes(loader, root, source)
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{source}: nested too deep to read", hint="check the file for a mistake") from None
    finally:
        loader.dispose()


def load_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML data file whose top level must be a mapping, refusing what ``load_text`` refuses (and a path
    that is not a regular file of at most ``MAX_DATA_BYTES``: ``safeload.read_regular``)."""
    if path.is_dir():
        raise ConfigError(f"{path}: expected a YAML file, found a folder")
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: file not found", hint="is G4BUILD_HOME set to the g4build checkout?")
    raw = read_regular(path, MAX_DATA_BYTES, "a YAML data file")
    try:
        text = raw.decode("utf-8-sig")  # the byte order mark Windows Notepad writes is no part of the data
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                          hint="save the file as UTF-8") from exc
    data = load_text(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, found {type(data).__name__}")
    return data


def _lexical_problem(rel: str) -> str | None:
    if not rel or text_problem(rel):
        return "an empty path or one with control characters"
    if rel.startswith("/") or _DRIVE.match(rel) or "\\" in rel:
        return "an absolute path or one with backslashes"
    if ".." in PurePosixPath(rel).parts:
        return "a path with '..'"
    return None


def tree_relative(rel: str, where: str) -> str:
    """``rel`` when it is a relative path that stays inside whatever tree it is read against, else an error."""
    problem = _lexical_problem(rel)
    if problem is not None:
        raise ConfigError(f"{where}: expected a relative path inside the source tree, found {rel!r}: {problem}",
                          hint="write the path as the tree has it, e.g. vllm/v1/worker/gpu_worker.py")
    return rel


def confined(folder: Path, rel: str, where: str) -> Path:
    """``folder / rel`` for a relative path from a data file, refused when it could leave ``folder``.

    Absolute paths, drive letters, backslashes, ``..`` parts and symlinks that resolve outside ``folder``
    are errors naming ``where`` (file and key).
    """
    problem = _lexical_problem(rel)
    if problem is None:
        base = folder.resolve()
        target = (folder / rel).resolve()
        if target != base and not target.is_relative_to(base):
            problem = f"a path that resolves to {target}, outside {base} (a symlink leaves the folder)"
    if problem is not None:
        raise ConfigError(f"{where}: expected a relative path inside {folder}, found {rel!r}: {problem}",
                          hint="data files may only name files inside their own folder")
    return folder / rel
