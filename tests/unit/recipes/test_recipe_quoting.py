"""Quoting: bash single quotes, PowerShell verbatim strings, and the Windows command line for Legacy passing."""

from __future__ import annotations

import subprocess

import pytest
from tests.unit.recipes.recipe_shell_semantics import (
    ps_legacy_command_line,
    ps_legacy_needs_quotes,
    ps_verbatim,
    windows_split,
)

from g4build.util.shellquote import bash_quote, ps_quote, windows_word

HOSTILE = [
    "plain",
    "with space",
    "it's",
    'say "hi"',
    "$HOME ${PATH} $(id) `id`",
    "a;b && c | d > e",
    "line1\nline2\r\nline3",
    "tab\there",
    "ünïcödé ✓ 日本語",
    "\u2019typographic\u2019 \u2018quotes\u2019 \u201alow\u201b ''",
    "\\",
    "C:\\path with space\\",
    'trailing\\"',
    '\\\\"\\\\',
    "%PATH% !x! ^&",
    "",
    '{"method":"dflash","model":"C:\\\\m d\\\\x","num_speculative_tokens":15}',
    '"',
    '""',
    " leading and trailing ",
    "\u00a0nbsp\u2028ls",
]


def test_windows_split_model_matches_documented_examples() -> None:
    # The examples of Microsoft's "Parsing C command-line arguments" table.
    assert windows_split('"abc" d e') == ["abc", "d", "e"]
    assert windows_split('a\\\\\\b d"e f"g h') == ["a\\\\\\b", "de fg", "h"]
    assert windows_split('a\\\\\\"b c d') == ['a\\"b', "c", "d"]
    assert windows_split('a\\\\\\\\"b c" d e') == ["a\\\\b c", "d", "e"]
    assert windows_split('a"b"" c d') == ['ab" c d']


@pytest.mark.parametrize("value", HOSTILE)
def test_windows_word_survives_legacy_passing(value: str) -> None:
    word = windows_word(value)
    assert word != ""
    assert not ps_legacy_needs_quotes(word)  # Legacy passing leaves it as it is
    line = ps_legacy_command_line(["serve", word, "--x"])
    assert windows_split(line) == ["serve", value, "--x"]


def test_without_pre_quoting_legacy_passing_breaks_json() -> None:
    value = '{"method":"dflash"}'
    assert windows_split(ps_legacy_command_line([value])) == ["{method:dflash}"]
    assert windows_split(ps_legacy_command_line(["a", "", "b"])) == ["a", "b"]


@pytest.mark.parametrize("value", HOSTILE)
def test_powershell_verbatim_string_reads_back(value: str) -> None:
    text = ps_quote(value)
    read, end = ps_verbatim(text)
    assert read == value and end == len(text)


def test_typographic_quote_cannot_end_a_powershell_string() -> None:
    text = ps_quote("x\u2019; Remove-Item C:\\ ; \u2019")
    read, end = ps_verbatim(text)
    assert end == len(text) and read == "x\u2019; Remove-Item C:\\ ; \u2019"


@pytest.mark.parametrize("value", HOSTILE)
def test_bash_single_quotes_read_back(value: str) -> None:
    result = subprocess.run(["bash", "-c", f"printf %s {bash_quote(value)}"], capture_output=True, check=True)
    assert result.stdout.decode() == value
