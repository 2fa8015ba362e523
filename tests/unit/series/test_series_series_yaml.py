"""Line-level edits of hand-written series YAML: only the version and one pin's patch list change."""

from __future__ import annotations

import yaml

from g4build.series.yamlfile import append_order, set_pin_patches

TEXT = '''\
# Series metadata (hand written)
name: s
version: 3
title: "A title: with a colon"
why: >-
  Folded text that a dump would
  rewrite into one long line.
refs:
  - "vllm-project/vllm#1"
python_only: true
pins:
  vllm-0.21.0:
    # the old pin
    patches:
      - file: vllm-0.21.0/0001-a.patch
        subject: "First"
      - file: vllm-0.21.0/0002-b.patch
        subject: "Second"

    fingerprints:
      vllm/x.py: ["marker"]
    note: ""
  vllm-0.33.0:
    patches: []
    note: "upstream has it"
'''

NEW = [{"file": "vllm-0.21.0/0001-a.patch", "subject": "First, reworded: yes"}]


def _changed_lines(before: str, after: str) -> set[str]:
    return set(before.splitlines()) ^ set(after.splitlines())


def test_refresh_edit_touches_only_version_and_the_pins_patches() -> None:
    out = set_pin_patches(TEXT, "vllm-0.21.0", NEW, 4)
    data = yaml.safe_load(out)
    assert data["version"] == 4
    assert data["pins"]["vllm-0.21.0"]["patches"] == NEW
    assert data["pins"]["vllm-0.21.0"]["fingerprints"] == {"vllm/x.py": ["marker"]}
    assert data["pins"]["vllm-0.33.0"] == {"patches": [], "note": "upstream has it"}
    assert _changed_lines(TEXT, out) == {
        "version: 3", "version: 4",
        '        subject: "First"', '      - file: vllm-0.21.0/0002-b.patch', '        subject: "Second"',
        '        subject: "First, reworded: yes"',
    }
    assert "why: >-\n  Folded text that a dump would\n" in out
    assert "    # the old pin\n" in out


def test_edit_of_an_empty_list_and_a_new_pin() -> None:
    out = set_pin_patches(TEXT, "vllm-0.33.0", [{"file": "vllm-0.33.0/0001-c.patch", "subject": "C"}], 4)
    assert yaml.safe_load(out)["pins"]["vllm-0.33.0"]["patches"] == [
        {"file": "vllm-0.33.0/0001-c.patch", "subject": "C"}]
    assert "why: >-" in out

    added = set_pin_patches(TEXT, "vllm-0.40.0", NEW, 4)
    data = yaml.safe_load(added)
    assert data["pins"]["vllm-0.40.0"] == {"patches": NEW, "fingerprints": {}, "note": ""}
    assert list(data["pins"]) == ["vllm-0.21.0", "vllm-0.33.0", "vllm-0.40.0"]
    assert "why: >-" in added


def test_layout_the_editor_does_not_know_falls_back_to_a_full_dump() -> None:
    flow = "# head\nname: s\nversion: 1\ntitle: t\npython_only: false\npins: {vllm-0.21.0: {patches: []}}\n"
    out = set_pin_patches(flow, "vllm-0.21.0", NEW, 2)
    assert out.startswith("# head\n")
    data = yaml.safe_load(out)
    assert (data["version"], data["pins"]["vllm-0.21.0"]["patches"]) == (2, NEW)


def test_append_order_keeps_comments() -> None:
    assert append_order("# order here\norder: []\n", "x") == "# order here\norder:\n  - x\n"
    text = "# c\norder:\n- a\n# trailing comment\n"
    out = append_order(text, "b")
    assert yaml.safe_load(out)["order"] == ["a", "b"]
    assert out.startswith("# c\norder:\n- a\n")
