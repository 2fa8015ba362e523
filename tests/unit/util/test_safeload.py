"""The one reader for files g4build did not write (util.safeload) and the YAML 1.2 typing of data files
(util.yamlsafe): bounded bytes, depth and numbers; plain values YAML 1.1 reads another way refused naming the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from g4build.errors import ConfigError, ValidationError
from g4build.pins.pinsfile import scalar
from g4build.util.safeload import loads_json, read_json, read_regular
from g4build.util.yamlsafe import load_text

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
        read_regular(fifo, 100, "a config")
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
