"""Independent models of how the shells and Windows read what the renderers write (test helpers).

- ``ps_verbatim``: PowerShell's reading of a single-quoted string (four quote characters; a doubled one
  stands for itself), returning the value and where the string ends.
- ``ps_legacy_command_line``: how Windows PowerShell 5.1 / 7.0-7.2 (Legacy passing) join native arguments:
  an argument gets surrounding quotes only when it has whitespace outside double quotes (its NeedQuotes).
- ``windows_split``: how the C runtime / CommandLineToArgvW split a command line into argv.
"""

from __future__ import annotations

PS_QUOTES = "'\u2018\u2019\u201a\u201b"


def ps_verbatim(text: str, start: int = 0) -> tuple[str, int]:
    """Read a verbatim string starting at ``text[start]`` (a quote); return (value, index after it)."""
    assert text[start] in PS_QUOTES, text[start:start + 10]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c in PS_QUOTES:
            if i + 1 < len(text) and text[i + 1] in PS_QUOTES:
                out.append(text[i + 1])
                i += 2
                continue
            return "".join(out), i + 1
        out.append(c)
        i += 1
    raise AssertionError("unterminated verbatim string")


def _dotnet_whitespace(c: str) -> bool:
    return c.isspace() or c in "\x85\xa0"


def ps_legacy_needs_quotes(arg: str) -> bool:
    quotes = 0
    after_backslash = False
    needs = False
    for c in arg:
        if c == '"' and not after_backslash:
            quotes += 1
        elif _dotnet_whitespace(c) and quotes % 2 == 0:
            needs = True
        after_backslash = c == "\\"
    return needs


def ps_legacy_command_line(args: list[str]) -> str:
    parts = []
    for arg in args:
        if arg == "":
            continue  # Legacy passing drops empty arguments
        parts.append(f'"{arg}"' if ps_legacy_needs_quotes(arg) else arg)
    return " ".join(parts)


def windows_split(line: str) -> list[str]:
    """The C runtime's argv rules (backslashes, quotes, "" inside quotes)."""
    args: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            return args
        current: list[str] = []
        in_quotes = False
        while i < n and (in_quotes or line[i] not in " \t"):
            if line[i] == "\\":
                j = i
                while j < n and line[j] == "\\":
                    j += 1
                count = j - i
                if j < n and line[j] == '"':
                    current.append("\\" * (count // 2))
                    if count % 2:
                        current.append('"')
                        i = j + 1
                    else:
                        i = j
                else:
                    current.append("\\" * count)
                    i = j
                continue
            if line[i] == '"':
                if in_quotes and i + 1 < n and line[i + 1] == '"':
                    current.append('"')
                    i += 2
                    continue
                in_quotes = not in_quotes
                i += 1
                continue
            current.append(line[i])
            i += 1
        args.append("".join(current))
