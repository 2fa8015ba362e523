"""`g4build manifest --state` and the `.g4build-done/*.seconds` timings an emitted script leaves are read bounded
and typed: a FIFO or /dev/zero is refused without hanging, wrong types and numbers that are no timing (nan, 1e999,
negative, a month and more) are a ConfigError (exit 3) before anything is written into a wheel or beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.support.hangs import within

from g4build.builder.state import MAX_STEP_SECONDS, BuildState
from g4build.errors import ConfigError
from g4build.wheelfile.manifestfile import MANIFEST_NAME, loads

from .conftest import run_cli
from .test_build_cli import _wheel


def _out(tmp_path: Path) -> tuple[Path, Path, bytes]:
    from g4build.builder.plan import wheel_version
    from g4build.builder.request import series_for
    from g4build.pins.model import load_pins
    from g4build.series.deps import build_series_for

    pin = load_pins().get("vllm-0.21.0")
    out = tmp_path / "wheels"
    out.mkdir()
    vllm = _wheel(out, version=wheel_version(pin, series_for(pin), "13.0", build=build_series_for(pin)))
    return out, vllm, vllm.read_bytes()


def _manifest(out: Path, state: Path, capsys: pytest.CaptureFixture[str],
              fifos: list[Path] | None = None) -> tuple[int, str, str]:
    argv = ["manifest", "--out", str(out), "--state", str(state), "--arch", "sm120", "--os", "linux",
            "--cuda", "13.0", "--json"]
    return within(lambda: run_cli(argv, capsys), fifos=fifos or [])


def _nothing_written(out: Path, vllm: Path, before: bytes) -> None:
    assert vllm.read_bytes() == before and sorted(p.name for p in out.iterdir()) == [vllm.name]


BAD_STATES = {
    "a list": b"[1, 2]",
    "done a list": b'{"done": [1]}',
    "seconds a string": b'{"done": {"vllm": {"digest": "ab", "seconds": "12"}}}',
    "seconds true": b'{"done": {"vllm": {"digest": "ab", "seconds": true}}}',
    "seconds negative": b'{"done": {"vllm": {"digest": "ab", "seconds": -5}}}',
    "seconds absurd": b'{"done": {"vllm": {"digest": "ab", "seconds": 1e12}}}',
    "seconds NaN": b'{"done": {"vllm": {"digest": "ab", "seconds": NaN}}}',
    "seconds 1e999": b'{"done": {"vllm": {"digest": "ab", "seconds": 1e999}}}',
    "digest a number": b'{"done": {"vllm": {"digest": 7, "seconds": 1}}}',
    "entry a string": b'{"done": {"vllm": "done"}}',
    "step name with a line break": b'{"done": {"vl\\nlm": {"digest": "ab", "seconds": 1}}}',
    "nested 200k deep": b"[" * 200_000 + b"]" * 200_000,
    "not JSON": b"{done",
}


@pytest.mark.parametrize("content", BAD_STATES.values(), ids=list(BAD_STATES))
def test_a_state_that_is_not_one_g4build_writes_stamps_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
) -> None:
    out, vllm, before = _out(tmp_path)
    state = tmp_path / "state.json"
    state.write_bytes(content)
    code, _, err = _manifest(out, state, capsys)
    assert code == ConfigError.exit_code and str(state) in err and "unexpected" not in err, err
    _nothing_written(out, vllm, before)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_state_that_is_no_regular_file_is_refused_without_hanging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str,
) -> None:
    out, vllm, before = _out(tmp_path)
    state = tmp_path / "state.json"
    if kind == "fifo":
        os.mkfifo(state)
    elif kind == "dev-zero":
        state.symlink_to("/dev/zero")
    else:
        state.mkdir()
    code, _, err = _manifest(out, state, capsys, [state])
    found = {"fifo": "FIFO", "dev-zero": "/dev/zero", "folder": "a folder"}[kind]
    assert code == ConfigError.exit_code and found in err and "unexpected" not in err, err
    _nothing_written(out, vllm, before)


BAD_SECONDS = {"nan": b"nan\n", "inf": b"inf\n", "1e999": b"1e999\n", "negative": b"-5\n", "31 days": b"2678400\n",
               "ten digits": b"9999999999\n",
               "a word": b"twelve\n", "non-ASCII digits": "١٢\n".encode(), "two numbers": b"1\n2\n", "empty": b""}


@pytest.mark.parametrize("content", BAD_SECONDS.values(), ids=list(BAD_SECONDS))
def test_a_seconds_marker_that_is_no_timing_stamps_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
) -> None:
    out, vllm, before = _out(tmp_path)
    done = tmp_path / ".g4build-done"
    done.mkdir()
    (done / "source.seconds").write_bytes(b"12\n")
    (done / "vllm.seconds").write_bytes(content)
    code, _, err = _manifest(out, tmp_path / "state.json", capsys)  # no state file: the script's markers only
    assert code == ConfigError.exit_code and "vllm.seconds" in err and "unexpected" not in err, err
    _nothing_written(out, vllm, before)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "big"])
def test_a_seconds_marker_that_is_no_small_regular_file_is_refused_without_hanging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str,
) -> None:
    out, vllm, before = _out(tmp_path)
    done = tmp_path / ".g4build-done"
    done.mkdir()
    marker = done / "vllm.seconds"
    if kind == "fifo":
        os.mkfifo(marker)
    elif kind == "dev-zero":
        marker.symlink_to("/dev/zero")
    else:
        with open(marker, "wb") as fh:
            fh.truncate(1 << 30)
    code, _, err = _manifest(out, tmp_path / "state.json", capsys, [marker])
    found = {"fifo": "FIFO", "dev-zero": "/dev/zero", "big": str(1 << 30)}[kind]
    assert code == ConfigError.exit_code and found in err and "unexpected" not in err, err
    _nothing_written(out, vllm, before)


def test_timings_as_bash_and_powershell_write_them_reach_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out, vllm, _ = _out(tmp_path)
    done = tmp_path / ".g4build-done"
    done.mkdir()
    (done / "source.seconds").write_bytes(b"12\n")  # bash: echo "$took"
    (done / "patches.seconds").write_bytes(b"\xef\xbb\xbf7\r\n")  # Windows PowerShell 5.1's Set-Content
    (done / f"vllm.{'ab' * 8}").write_bytes(b"")  # the digest marker beside it is no timing
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"done": {"vllm": {"digest": "ab" * 8, "seconds": 3600.25}}}))
    code, out_text, err = _manifest(out, state, capsys)
    assert code == 0, err
    manifest = loads((out / MANIFEST_NAME).read_bytes(), "beside")
    assert manifest["timings"] == {"source": 12.0, "patches": 7.0, "vllm": 3600.25}
    assert json.loads(out_text)["wheels_stamped"] == [vllm.name]


def test_the_executor_state_round_trips_and_a_missing_one_is_empty(tmp_path: Path) -> None:
    from g4build.builder.plan import Step

    state = BuildState.load(tmp_path / "b" / "state.json")
    assert state.done == {} and state.timings() == {}
    step = Step(name="vllm", title="build", command=("true",), cwd=str(tmp_path))
    state.record(step, "ab" * 8, 12.345)
    again = BuildState.load(tmp_path / "b" / "state.json")
    assert again.finished(step, "ab" * 8) and again.timings() == {"vllm": 12.35}
    (tmp_path / "b" / "state.json").write_text(json.dumps({"done": {"vllm": {"digest": "ab", "seconds":
                                                                             MAX_STEP_SECONDS + 1}}}))
    with pytest.raises(ConfigError, match="expected 0 to 2592000 seconds"):
        BuildState.load(tmp_path / "b" / "state.json")
