"""Hostile YAML data files: repeated keys, anchors/aliases, paths leaving their folder, missing required keys,
NUL and control characters. Every data file g4build reads goes through one safe loader; each error names the
file and the key (and the lines)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from g4build.ci.spec import load_matrix
from g4build.errors import ConfigError
from g4build.pins.model import load_pins
from g4build.recipes import load_recipe
from g4build.series.model import load_all, load_series
from g4build.series.yamlfile import append_order, set_pin_patches

REPO = Path(__file__).resolve().parents[3]
PINS_TEXT = (REPO / "patches" / "pins.yaml").read_text(encoding="utf-8")


def _line_of(text: str, needle: str, start: int = 0) -> int:
    return text[:text.index(needle, start)].count("\n") + 1


# --- repeated keys ---------------------------------------------------------------------------------------------


def test_duplicate_pin_key_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    # The reported case: a second 'vllm-0.21.0:' entry (0.33.0's body) silently won.
    text = PINS_TEXT.replace("  vllm-0.33.0:\n", "  vllm-0.21.0:\n", 1)
    path = tmp_path / "pins.yaml"
    path.write_text(text, encoding="utf-8")
    first = _line_of(text, "  vllm-0.21.0:\n")
    second = _line_of(text, "  vllm-0.21.0:\n", text.index("  vllm-0.21.0:\n") + 1)
    with pytest.raises(ConfigError) as info:
        load_pins(path)
    message = info.value.message
    assert str(path) in message and "'pins.vllm-0.21.0'" in message
    assert f"line {first}" in message and f"line {second}" in message
    assert info.value.exit_code == 3


def test_cli_pins_show_refuses_duplicate_pin(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(REPO / "patches", home / "patches")
    (home / "patches" / "pins.yaml").write_text(PINS_TEXT.replace("  vllm-0.33.0:\n", "  vllm-0.21.0:\n", 1),
                                                encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(home)}
    result = subprocess.run([sys.executable, "-m", "g4build", "pins", "show", "vllm-0.21.0"], capture_output=True,
                            text=True, encoding="utf-8", env=env, check=False)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "duplicate key 'pins.vllm-0.21.0'" in result.stdout + result.stderr
    assert "0.33.0" not in result.stdout


def _copy_series(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root)
    return root


# Each real data file kind, with one top-level key written twice at its end.
_DUPLICATED: list[tuple[str, str, Callable[[Path], object]]] = [
    ("patches/pins.yaml", "default: vllm-0.33.0\n", load_pins),
    ("ci/matrix.yaml", 'build_python: "3.11"\n', load_matrix),
    ("patches/mm-prefix-fa/series.yaml", "version: 99\n", lambda p: load_series(p.parent)),
    ("recipes/gemma4-31b-dflash.yaml", "model: ./elsewhere\n", lambda p: load_recipe(str(p))),
]


@pytest.mark.parametrize(("rel", "extra", "loader"), _DUPLICATED, ids=[d[0] for d in _DUPLICATED])
def test_every_data_file_refuses_a_repeated_key(
        tmp_path: Path, rel: str, extra: str, loader: Callable[[Path], object]) -> None:
    source = REPO / rel
    if rel.startswith("patches/") and rel != "patches/pins.yaml":
        path = _copy_series(tmp_path) / Path(rel).relative_to("patches")
    else:
        path = tmp_path / source.name
    text = source.read_text(encoding="utf-8")
    key = extra.split(":")[0]
    path.write_text(text.rstrip("\n") + "\n" + extra, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        loader(path)
    message = info.value.message
    assert f"duplicate key '{key}'" in message and str(path) in message
    last = text.rstrip("\n").count("\n") + 2  # the appended line
    assert f"line {_line_of(text, key + ':')}" in message and f"line {last}" in message


# --- anchors and aliases ---------------------------------------------------------------------------------------


def _alias_bomb(levels: int, width: int) -> str:
    """The classic exponential alias tree; kept tiny here (width**levels) so the test stays cheap either way."""
    lines = ["name: bomb", "model: ./m", "hardware: {vram_gb: 32, arch: sm120}", "args:",
             f"  l0: &l0 [{', '.join(['x'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"  l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_recipe_alias_bomb_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(levels=3, width=4), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_recipe(str(path))
    assert f"{path}:5: anchor '&l0'" in info.value.message


def test_alias_and_merge_key_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "pins.yaml"
    path.write_text(PINS_TEXT + "extra: *nothing\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"alias '\*nothing'"):
        load_pins(path)
    path.write_text(PINS_TEXT.replace("    torch: \"2.14.0\"\n", "    <<: {torch: \"2.14.0\"}\n", 1),
                    encoding="utf-8")
    with pytest.raises(ConfigError, match=r"merge key '<<' under pins\.vllm-0\.33\.0"):
        load_pins(path)


def test_series_yaml_editing_uses_the_safe_loader() -> None:
    with pytest.raises(ConfigError, match="anchor"):
        set_pin_patches("name: x\npins: &p {}\n", "vllm-0.21.0", [], 2)
    with pytest.raises(ConfigError, match="duplicate key 'order'"):
        append_order("order: [a]\norder: [b]\n", "c")


# --- paths from data files -------------------------------------------------------------------------------------


def _series_with_file(tmp_path: Path, file: str) -> Path:
    folder = _copy_series(tmp_path) / "mm-prefix-fa"
    meta = folder / "series.yaml"
    text = meta.read_text(encoding="utf-8")
    meta.write_text(text.replace("file: vllm-0.21.0/0001-flash-attn-exact-mm-prefix.patch", f"file: {file}", 1),
                    encoding="utf-8")
    return folder


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink-out"])
def test_patch_file_outside_the_series_folder_is_refused(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "secret.patch"
    outside.write_text("not a patch of ours\n", encoding="utf-8")
    if kind == "dotdot":
        file = "../../secret.patch"
    elif kind == "absolute":
        file = str(outside)
    else:
        file = "vllm-0.21.0/link.patch"
    folder = _series_with_file(tmp_path, file)
    if kind == "symlink-out":
        (folder / "vllm-0.21.0" / "link.patch").symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        load_series(folder)
    message = info.value.message
    assert str(folder / "series.yaml") in message and "pins.vllm-0.21.0.patches[0].file" in message
    assert "inside" in message


def test_symlink_that_stays_inside_the_series_folder_is_fine(tmp_path: Path) -> None:
    folder = _series_with_file(tmp_path, "vllm-0.21.0/link.patch")
    (folder / "vllm-0.21.0" / "link.patch").symlink_to("0001-flash-attn-exact-mm-prefix.patch")
    series = load_series(folder)
    target = folder / "vllm-0.21.0" / "0001-flash-attn-exact-mm-prefix.patch"
    assert series.patches_for("vllm-0.21.0")[0].read_bytes() == target.read_bytes()


def test_order_entry_leaving_patches_is_refused(tmp_path: Path) -> None:
    root = _copy_series(tmp_path)
    (tmp_path / "evil").mkdir()
    shutil.copy(root / "mm-prefix-fa" / "series.yaml", tmp_path / "evil" / "series.yaml")
    (root / "series.yaml").write_text("order:\n  - ../evil\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"series\.yaml\.order: '\.\./evil' is not a series folder name"):
        load_all(root)


@pytest.mark.parametrize("rel", ["/etc/hosts", "../outside.py", "C:/x.py", "a\\b.py"])
def test_fingerprint_path_must_stay_in_the_tree(tmp_path: Path, rel: str) -> None:
    folder = _copy_series(tmp_path) / "mm-prefix-fa"
    meta = folder / "series.yaml"
    text = meta.read_text(encoding="utf-8")
    quoted = "'" + rel + "'"
    meta.write_text(text.replace("      vllm/v1/attention/backends/mm_prefix_fa.py:", f"      {quoted}:", 1),
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="fingerprints") as info:
        load_series(folder)
    assert "inside the source tree" in info.value.message


@pytest.mark.parametrize(("old", "new", "key"), [
    ("file: vllm-0.21.0.tar.gz", "file: ../../vllm-0.21.0.tar.gz", "sdist.file"),
    ("file: vllm-0.21.0.tar.gz", "file: /tmp/vllm-0.21.0.tar.gz", "sdist.file"),
    ("  vllm-0.33.0:\n", "  ../vllm-0.33.0:\n", "pins"),
    ("      windows:\n", "      ../win:\n", "bases"),
    ("          - requirements/common.txt", "          - 'C:/requirements/common.txt'", "keep_pin"),
])
def test_pin_names_and_files_cannot_leave_their_folder(tmp_path: Path, old: str, new: str, key: str) -> None:
    path = tmp_path / "pins.yaml"
    assert old in PINS_TEXT
    path.write_text(PINS_TEXT.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ConfigError, match=key) as info:
        load_pins(path)
    assert str(path) in info.value.message


# --- required keys ---------------------------------------------------------------------------------------------


def test_pin_entry_without_patches_is_refused(tmp_path: Path) -> None:
    folder = _copy_series(tmp_path) / "mm-prefix-fa"
    meta = folder / "series.yaml"
    text = meta.read_text(encoding="utf-8")
    start = text.index("    patches:\n", text.index("  vllm-0.21.0:"))
    end = text.index("    fingerprints:\n", start)
    meta.write_text(text[:start] + text[end:], encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_series(folder)
    assert str(meta) in info.value.message and "pins.vllm-0.21.0: missing key 'patches'" in info.value.message


# --- NUL, control characters, encoding -------------------------------------------------------------------------


@pytest.mark.parametrize(("escape", "what"), [("\\0", "NUL"), ("\\e", "U+001B"), ("\\ud800", "lone surrogate")])
def test_bad_character_in_a_value_names_file_and_key(tmp_path: Path, escape: str, what: str) -> None:
    path = tmp_path / "pins.yaml"
    path.write_text(PINS_TEXT.replace('torch: "2.14.0"', f'torch: "2.14.0{escape}"', 1), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_pins(path)
    message = info.value.message
    assert str(path) in message and "(key pins.vllm-0.33.0.torch)" in message and what in message


def test_bad_character_in_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pins.yaml"
    path.write_text(PINS_TEXT.replace("  vllm-0.33.0:\n", '  "vllm-0.33.0\\0":\n', 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="NUL") as info:
        load_pins(path)
    assert "under pins" in info.value.message


def test_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pins.yaml"
    path.write_bytes(PINS_TEXT.encode("utf-8").replace(b"2.14.0", b"2.14\xff0", 1))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_pins(path)


def test_a_raw_control_byte_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    """PyYAML's reader refuses raw control characters before parsing; that too must name the file (exit 3)."""
    from g4build.errors import ConfigError
    from g4build.util.yamlsafe import load_mapping

    path = tmp_path / "pins.yaml"
    path.write_bytes(b"pins:\n  x: \x07bell\n")
    with pytest.raises(ConfigError, match=r"pins.yaml: not valid YAML"):
        load_mapping(path)
