"""Text from upstream material (index pages, sdists, wheels, manifests) checked before it names a file, a folder
or a line of a script: each check returns what is wrong (for the caller's error of its own kind) or None."""

from __future__ import annotations

import re
import unicodedata

# A file name as package indexes, wheels and sdists spell them: no separator, no space, no control character.
FILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
HEX_RE = re.compile(r"[0-9a-f]+")
_MAX_NAME = 255


def unprintable(text: str) -> str | None:
    """A control, format (bidi override, zero-width), surrogate, private-use, unassigned or line/paragraph separator
    character, named; None when every character prints as itself on one line (spaces allowed)."""
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] == "C" or cat in ("Zl", "Zp") or (cat == "Zs" and ch != " "):
            name = unicodedata.name(ch, "")
            return f"the character U+{ord(ch):04X}" + (f" ({name})" if name else "")
    return None


def file_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a plain file name (one path component, safe on Windows and POSIX), or None."""
    if not name:
        return "an empty name"
    bad = unprintable(name)
    if bad:
        return f"{bad}, which no file name may carry"
    if len(name) > _MAX_NAME:
        return f"{len(name)} characters, over the {_MAX_NAME} a file name may have"
    if "/" in name or "\\" in name:
        return "a path separator"
    if name in (".", "..") or ".." in name:
        return "'..'"
    if not FILE_NAME_RE.fullmatch(name):
        odd = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9._+-]", c)})
        return f"characters outside letters, digits and '._+-' ({''.join(odd)!r})"
    return None


def component_problem(part: str) -> str | None:
    """Why one component of a member path (an archive's, a layer's) is unsafe to write on Windows or POSIX, or
    None. Looser than ``file_name_problem``: sources carry spaces and other punctuation, never these."""
    if part in ("", ".", ".."):
        return "'..'" if part == ".." else "an empty or '.' component"
    bad = unprintable(part)
    if bad:
        return bad
    if "\\" in part:
        return "a backslash (a separator on Windows)"
    if ":" in part:
        return "a ':' (a drive or an alternate data stream on Windows)"
    folded = unicodedata.normalize("NFKC", part)
    if folded != part and (any(c in folded for c in "/\\:") or folded in (".", "..")):
        return f"characters that read as {folded!r} once normalised"
    return None
