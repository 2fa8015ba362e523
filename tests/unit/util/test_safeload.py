"""The one reader for files g4build did not write (util.safeload) and the YAML 1.2 typing of data files
(util.yamlsafe): bounded bytes, depth and numbers; plain values YAML 1.1 reads another way refused naming the key."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest
import yaml
from tests.support.hangs import within

from g4build.errors import ConfigError, ValidationError
from g4build.pins.pinsfile import scalar
from g4build.series.yamlfile import dump as series_dump
from g4build.util.safeload import (
    MAX_PATCH_BYTES,
    loads_json,
    pseudo_root_of,
    read_bounded,
    read_json,
    read_patch,
    read_regular,
)
from g4build.util.yamlsafe import Dumper, load_mapping, load_text

BOM = b"\xef\xbb\xbf"  # what Windows Notepad writes first when it saves "UTF-8" (with BOM)

REFUSED_PLAIN = ["off", "no", "yes", "on", "Off", "36:24:32", "010", "1_000", "0b11", "1e5", "0o17", "2024-01-01",
                 "=", "9" * 40]


@pytest.mark.parametrize("value", REFUSED_PLAIN)
def test_plain_values_other_readers_type_differently_are_refused(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_text(f"pins:\n  a:\n    key: {value}\n", "pins.yaml")
    assert "pins.yaml:3 (key pins.a.key)" in caught.value.message


@pytest.mark.parametrize(("text", "value"), [("'off'", "off"), ('"36:24:32"', "36:24:32"), ("!!str no", "no"),
                                             ("10", 10), ("0x1F", 31), ("1.5", 1.5), ("1.0e+5", 1.0e5),
                                             ("true", True), ("false", False), ("null", None), ("~", None),
                                             ("off-by-one", "off-by-one"), ("v1.2", "v1.2")])
def test_values_both_versions_agree_on_read_as_before(text: str, value: object) -> None:
    assert load_text(f"key: {text}\n", "x.yaml") == {"key": value}


def test_a_yaml_1_1_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="a key under env"):
        load_text("env:\n  yes: 1\n", "x.yaml")


@pytest.mark.parametrize("value", ["yes", "1e5", "0o17", "010", "2024-01-01", "plain"])
def test_pins_file_quotes_what_would_not_read_back(value: str) -> None:
    assert load_text(f"key: {scalar(value)}\n", "x.yaml") == {"key": value}


# a short commit such as 531e968659 is text to YAML 1.1 and a number to 1.2: a CI run once failed on one
WRITTEN = [*REFUSED_PLAIN, "531e968659", "1234567890", "0x1F", ".5", "-1E3", "null", "~", "True", "<<", "",
           "line one\nline two", "off-by-one", "v1.2"]


@pytest.mark.parametrize("value", WRITTEN)
def test_what_g4build_writes_reads_back_as_the_same_text(value: str) -> None:
    data = {"commit": value, "list": [value], value or "empty": 1}
    assert load_text(series_dump(data), "series.yaml") == data
    assert load_text(yaml.dump(data, Dumper=Dumper), "x.yaml") == data


@pytest.mark.parametrize("value", ["a\x85b", "x\x07y", "two\nlines\x85"])
def test_a_control_character_written_is_refused_on_reading_not_turned_into_a_break(value: str) -> None:
    """NEL written raw would read back as a line break (a space in a value): escaped, the reader names it."""
    with pytest.raises(ConfigError, match="control character"):
        load_text(series_dump({"title": value}), "series.yaml")


def test_every_short_commit_written_reads_back() -> None:
    rng = random.Random(20261129)
    commits = ["".join(rng.choice("0123456789e") for _ in range(n)) for n in (7, 9, 10, 12, 40) for _ in range(400)]
    text = series_dump({"commits": commits})
    assert load_text(text, "series.yaml") == {"commits": commits}
    plain = {line[2:] for line in text.splitlines()[1:] if not line.startswith("- '")}
    assert plain and not any(re.fullmatch(r"[0-9]+(e[0-9]+)?", c) for c in plain)  # quoted only where needed


@pytest.mark.parametrize(("text", "needle"), [
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ('{"a": ' * 70 + "1" + "}" * 70, "deeper than 64"),
    ('{"n": ' + "7" * 4000 + "}", "4000 digits"),
    ('{"n": 1e999}', "not a finite number"),
    ('{"n": NaN}', "NaN is not a number"),
    ('{"n": -Infinity}', "-Infinity is not a number"),
    ('{"n": 1', "not valid JSON"),
    ("\xff", "not UTF-8"),
])
def test_json_bounds(text: str, needle: str) -> None:
    raw = text.encode("latin-1")
    with pytest.raises(ConfigError, match=needle):
        loads_json(raw, "config.json")
    with pytest.raises(ValidationError):
        loads_json(raw, "m.json", error=ValidationError)


def test_read_regular_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        within(lambda: read_regular(fifo, 100, "a config"), fifos=[fifo])
    with pytest.raises(ConfigError, match="a folder"):
        read_regular(tmp_path, 100, "a config")
    with pytest.raises(ConfigError, match="no such file"):
        read_regular(tmp_path / "none", 100, "a config")
    big = tmp_path / "big.json"
    big.write_bytes(b"1" * 101)
    with pytest.raises(ConfigError, match="101 bytes, more than the 100"):
        read_regular(big, 100, "a config")
    for target in ("/dev/zero", "/proc/self/environ", "/sys/kernel/mm"):
        link = tmp_path / f"link-{target.replace('/', '_')}"
        link.symlink_to(target)
        with pytest.raises(ConfigError, match="a path into the system's"):
            read_regular(link, 100, "a config")
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2.5, "x"]}', encoding="utf-8")
    assert read_json(good, 100, "a config") == {"a": [1, 2.5, "x"]}


@pytest.mark.parametrize("real", ["/system", "/system/lib/x.so", "/sysroot/usr/lib/libc.so.6", "/devel/x.json",
                                  "/device/config.json", "/proc2/x", "/process/x", "/", "/home/dev/sys/proc"])
def test_folders_named_like_the_kernel_trees_are_not_in_them(real: str) -> None:
    assert pseudo_root_of(real) is None


@pytest.mark.parametrize(("real", "root"), [("/proc", "/proc"), ("/proc/self/environ", "/proc"), ("/sys", "/sys"),
                                            ("/sys/kernel/mm", "/sys"), ("/dev/zero", "/dev"), ("/dev", "/dev")])
def test_the_kernel_trees_and_what_is_under_them_are(real: str, root: str) -> None:
    assert pseudo_root_of(real) == root


def test_a_real_file_in_folders_named_like_them_is_read(tmp_path: Path) -> None:
    for name in ("system", "sysroot", "devel", "proc2"):
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_bytes(b'{"ok": 1}')
        assert read_json(path, 100, "a config") == {"ok": 1}


def test_the_read_loop_refuses_one_byte_past_its_limit_instead_of_cutting(tmp_path: Path) -> None:
    # A pipe's size is unknown until read, as a file's that grows while read: only the loop itself can tell.
    for size, expected in ((100, b"x" * 100), (101, None), (5000, None), (0, b"")):
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, b"x" * size)
            os.close(write_end)
            assert read_bounded(read_end, 100) == expected
        finally:
            os.close(read_end)
    exact = tmp_path / "exact.json"
    exact.write_bytes(b"[" + b"1," * 49 + b"1]")  # 101 bytes
    assert len(read_regular(exact, 101, "a config")) == 101
    with pytest.raises(ConfigError, match="101 bytes, more than the 100"):
        read_regular(exact, 100, "a config")


def test_a_config_saved_by_notepad_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(BOM + b'{\r\n  "model_type": "gemma4",\r\n  "layers": 30\r\n}\r\n')
    assert read_json(config, 1000, "a config") == {"model_type": "gemma4", "layers": 30}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(BOM + b"name: mine\r\nargs:\r\n  max-model-len: 8192\r\n")
    assert load_mapping(recipe) == {"name": "mine", "args": {"max-model-len": 8192}}
    # only the leading mark is dropped: one inside the text is still refused as JSON
    inner = tmp_path / "inner.json"
    inner.write_bytes(b'{"a": 1}' + BOM)
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_json(inner, 1000, "a config")


def test_a_patch_file_is_bounded_and_never_blocks(tmp_path: Path) -> None:
    huge = tmp_path / "0001-huge.patch"
    with open(huge, "wb") as fh:
        fh.truncate(3 << 30)  # sparse: 3 GiB that take no disk, refused by their size before a byte is read
    with pytest.raises(ConfigError, match=f"{3 << 30} bytes, more than the {MAX_PATCH_BYTES}"):
        read_patch(huge)
    fifo = tmp_path / "0002-fifo.patch"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        within(lambda: read_patch(fifo), fifos=[fifo])
    zero = tmp_path / "0003-zero.patch"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="/dev/zero"):
        within(lambda: read_patch(zero))
    good = tmp_path / "0004-good.patch"
    good.write_bytes(b"diff --git a/x b/x\n")
    assert read_patch(good) == b"diff --git a/x b/x\n"
