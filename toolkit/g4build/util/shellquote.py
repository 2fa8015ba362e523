"""One value as one shell word, for every script g4build writes: the build scripts (``builder/script.py``,
``builder/platforms/windows.py``) and the launch scripts (``recipes/render_bash.py``, ``recipes/render_powershell.py``).

bash (``bash_quote``): inside single quotes every character stands for itself and only ``'`` ends the
string; it cannot be escaped there, so each ``'`` becomes ``'\\''`` (close, an escaped quote, reopen). ``$``,
backticks, ``"``, ``\\``, line breaks and non-ASCII text reach the program exactly. ``bash_word`` (the build
scripts') is ``shlex.quote``: the same rule, but a value of only characters bash never treats specially stays
bare, and a ``'`` is spelled ``'"'"'``; kept so that emitted build scripts stay byte for byte as they were.

PowerShell (``ps_quote``): a verbatim (single-quoted) string opens and closes with any *single-quote-character*,
which the language specification (string literals, ``verbatim-string-literal``) and PowerShell's tokenizer
(``IsSingleQuote``) define as U+0027 (``'``) and the typographic U+2018, U+2019, U+201A and U+201B. Inside, two
of them in a row stand for one (the second). So each of the five is doubled: doubling only ``'`` would let a
value such as ``it\u2019s`` end the string early and run the rest as code. The typographic double quotes
(U+201C to U+201E), ``$`` and backticks mean nothing inside single quotes.

``windows_word``: a value quoted for the Windows command line (CommandLineToArgvW / the C runtime), for
PowerShell's Legacy native-argument passing (see ``recipes/render_powershell.py``).

Two things no script can carry are refused with UsageError: NUL (no argument or environment value of a program
holds one) and lone surrogates (not Unicode text: the script could not be written as UTF-8).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from g4build.errors import UsageError

PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
_PLAIN_WINDOWS_WORD = re.compile(r"[A-Za-z0-9_./:=,+@%\\-]+")
_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")


def check_writable(value: str) -> str:
    """``value`` unchanged, or UsageError when no script can carry it (NUL, a lone surrogate)."""
    bad = _UNWRITABLE.search(value)
    if bad is None:
        return value
    code = ord(bad.group())
    what = ("a NUL character, which no program argument or environment value can hold" if code == 0 else
            f"a lone surrogate U+{code:04X} (not valid Unicode text: an undecodable byte?)")
    raise UsageError(f"{value!r} cannot be written into a script: it holds {what} at offset {bad.start()}",
                     hint="remove that character from the value")


def bash_quote(value: str) -> str:
    """A bash single-quoted word whose value is ``value``."""
    return "'" + check_writable(value).replace("'", "'\\''") + "'"


def bash_word(value: str) -> str:
    """``value`` as one bash word: bare when nothing in it is special to bash, else single-quoted."""
    return shlex.quote(check_writable(value))


def ps_quote(value: str) -> str:
    """A PowerShell verbatim string whose value is ``value``: all five single-quote characters doubled."""
    body = "".join(c + c if c in PS_SINGLE_QUOTES else c for c in check_writable(value))
    return f"'{body}'"


def windows_word(value: str) -> str:
    """``value`` quoted so the Windows command-line parser returns it unchanged (and Legacy passing keeps it):
    wrapped in ``"…"``, each ``"`` as ``\\"``, backslashes before a quote or the end doubled."""
    if _PLAIN_WINDOWS_WORD.fullmatch(check_writable(value)):
        return value
    out = ['"']
    backslashes = 0
    for char in value:
        if char == "\\":
            backslashes += 1
            continue
        if char == '"':
            out.append("\\" * (2 * backslashes + 1) + '"')
        else:
            out.append("\\" * backslashes + char)
        backslashes = 0
    out.append("\\" * (2 * backslashes) + '"')
    return "".join(out)


# bare in PowerShell: no space, quote, $, `, ;, (, ), {, }, @, comma (an array there), #, <, >, | or &
_PLAIN_PS_WORD = re.compile(r"[A-Za-z0-9_./:=+\\-]+")


def bash_command(words: Sequence[str]) -> str:
    """A command line bash runs as ``words`` (each word bare where safe, else single-quoted): copyable."""
    return " ".join(bash_word(w) for w in words)


def ps_command(words: Sequence[str]) -> str:
    """A command line PowerShell runs as ``words``: a word with anything PowerShell reads specially is a verbatim
    string, and a program so quoted is called with ``&`` (a bare string would only be echoed)."""
    quoted = [w if _PLAIN_PS_WORD.fullmatch(check_writable(w)) else ps_quote(w) for w in words]
    if quoted and quoted[0] != words[0]:
        quoted[0] = "& " + quoted[0]
    return " ".join(quoted)
