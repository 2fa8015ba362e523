"""The native executor with real subprocesses: logs, ninja progress, resume, --clean, failure reports."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

from g4build.builder.arch import parse_arch
from g4build.builder.executors.native import NativeExecutor, error_tail, expand_globs
from g4build.builder.plan import BuildPlan, Layout, Step, Target
from g4build.errors import BuildError, ConfigError

PY = sys.executable


def _plan(tmp: Path, *steps: Step, env: dict[str, str] | None = None) -> BuildPlan:
    lay = Layout(root=str(tmp / "root"), out=str(tmp / "out"), cache=str(tmp / "deps"))
    t = Target(os="linux", arch=parse_arch("sm120"), python="3.12", cuda="13.0")
    return BuildPlan(target=t, pin="p", version="1+g4", layout=lay, env=env or {"G4_X": "planned"}, setup=(),
                     steps=steps)


def _exec(buf: io.StringIO) -> NativeExecutor:
    return NativeExecutor(console=Console(file=buf, width=200), base_env={"PATH": "/usr/bin:/bin"})


def _step(name: str, code: str, cwd: Path, **kw: object) -> Step:
    return Step(name=name, command=(PY, "-c", code), cwd=str(cwd), **kw)  # type: ignore[arg-type]


def test_runs_steps_in_order_with_env_and_logs(tmp_path: Path) -> None:
    marker = tmp_path / "order.txt"
    code1 = f"import os; open({str(marker)!r}, 'a').write('one ' + os.environ['G4_X'] + '\\n')"
    code2 = (f"import os; open({str(marker)!r}, 'a').write('two ' + os.environ['G4_STEP'] + '\\n');"
             "[print(f'[{i}/3] Building CUDA object x{i}.o') for i in range(1, 4)]")
    plan = _plan(tmp_path, _step("one", code1, tmp_path / "a"), _step("two", code2, tmp_path / "b",
                                                                     env={"G4_STEP": "stepenv"}))
    buf = io.StringIO()
    result = _exec(buf).run(plan)
    assert marker.read_text() == "one planned\ntwo stepenv\n"
    assert [s.status for s in result.steps] == ["done", "done"]
    log2 = Path(result.steps[1].log or "")
    assert log2.name == "02-two.log" and "[3/3] Building CUDA object x3.o" in log2.read_text()
    assert "2/2 two: done" in buf.getvalue()


def test_resume_skips_finished_steps_and_clean_forces(tmp_path: Path) -> None:
    counter = tmp_path / "count.txt"
    code = f"p = {str(counter)!r}; import os; open(p, 'a').write('x')"
    plan = _plan(tmp_path, _step("count", code, tmp_path), _step("always", "pass", tmp_path, resumable=False))
    ex = _exec(io.StringIO())
    ex.run(plan)
    second = ex.run(plan)
    assert counter.read_text() == "x"
    assert [s.status for s in second.steps] == ["skipped", "done"]
    changed = _plan(tmp_path, _step("count", code, tmp_path), env={"G4_X": "other"})
    ex.run(changed)  # a changed input digest reruns the step
    assert counter.read_text() == "xx"
    ex.run(changed, clean=True)
    assert counter.read_text() == "xxx"


def test_a_damaged_state_stops_a_resume_and_clean_starts_over(tmp_path: Path) -> None:
    counter = tmp_path / "count.txt"
    plan = _plan(tmp_path, _step("count", f"open({str(counter)!r}, 'a').write('x')", tmp_path))
    state = Path(plan.layout.state_file)
    state.parent.mkdir(parents=True)
    state.write_text('{"done": {"count": {"digest": "ab", "seconds": NaN}}}')
    with pytest.raises(ConfigError, match="NaN is not a number"):
        _exec(io.StringIO()).run(plan)
    assert not counter.exists()  # nothing ran on a state it could not read
    result = _exec(io.StringIO()).run(plan, clean=True)
    assert [s.status for s in result.steps] == ["done"] and counter.read_text() == "x"
    assert _exec(io.StringIO()).run(plan).steps[0].status == "skipped"  # the state written afresh reads back


def test_failure_shows_error_lines_and_log_path(tmp_path: Path) -> None:
    code = ("import sys; [print('compiling', i) for i in range(100)]; print('kernel.cu(3): error: bad thing');"
            "print('ninja: build stopped: subcommand failed.'); sys.exit(3)")
    plan = _plan(tmp_path, _step("ok", "pass", tmp_path), _step("boom", code, tmp_path),
                 _step("never", "raise SystemExit(9)", tmp_path))
    with pytest.raises(BuildError) as err:
        _exec(io.StringIO()).run(plan)
    assert "step boom failed (exit 3)" in err.value.message
    assert "kernel.cu(3): error: bad thing" in err.value.message
    assert "compiling 5" not in err.value.message
    assert err.value.hint and err.value.hint.endswith("02-boom.log")
    assert "compiling 99" in Path(err.value.hint.split("full log: ")[1]).read_text()


def test_missing_program_is_a_clear_error(tmp_path: Path) -> None:
    plan = _plan(tmp_path, Step(name="x", command=("g4build-no-such-tool",), cwd=str(tmp_path)))
    with pytest.raises(BuildError, match="cannot start g4build-no-such-tool"):
        _exec(io.StringIO()).run(plan)


def test_globs_expand_or_fail(tmp_path: Path) -> None:
    (tmp_path / "vllm-1-py3-none-any.whl").write_text("")
    assert expand_globs(("a", str(tmp_path / "vllm-*.whl"))) == ["a", str(tmp_path / "vllm-1-py3-none-any.whl")]
    with pytest.raises(BuildError, match="no file matches"):
        expand_globs((str(tmp_path / "nothing-*.whl"),))
    # a plan names its own wheel version (with its + local part); an earlier build's wheel is not picked up
    (tmp_path / "vllm-0.21.0+cu130.g4.old-cp38-abi3-linux_x86_64.whl").write_text("")
    (tmp_path / "vllm-0.21.0+cu130.g4.new-cp38-abi3-linux_x86_64.whl").write_text("")
    assert expand_globs((str(tmp_path / "vllm-0.21.0+cu130.g4.new-*.whl"),)) == [
        str(tmp_path / "vllm-0.21.0+cu130.g4.new-cp38-abi3-linux_x86_64.whl")]


def test_error_tail_prefers_error_lines() -> None:
    lines = [f"line {i}" for i in range(50)] + ["c++: fatal error: Killed signal terminated program cc1plus"]
    assert error_tail(lines) == [lines[-1]]
    assert error_tail([f"l{i}" for i in range(40)], n=3) == ["l37", "l38", "l39"]


def test_killed_compiler_suggests_fewer_jobs(tmp_path: Path) -> None:
    code = (
        "import sys; print('nvcc error   : \\'cicc\\' died due to signal 9 (Kill signal)'); "
        "print('Killed'); sys.exit(1)"
    )
    plan = _plan(tmp_path, _step("nvcc", code, tmp_path), env={"MAX_JOBS": "12"})
    with pytest.raises(BuildError) as err:
        _exec(io.StringIO()).run(plan)
    assert err.value.hint and "lower --jobs (MAX_JOBS=12 now)" in err.value.hint


def test_a_step_that_runs_again_starts_without_its_fresh_folder(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    make = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(exist_ok=True); (p / 'made').write_text('')"
    source = Step(name="source", command=(PY, "-c", make, str(tree)), cwd=str(tmp_path), fresh=str(tree))
    ex = _exec(io.StringIO())
    ex.run(_plan(tmp_path, source))
    (tree / "patched-and-built").write_text("")
    ex.run(_plan(tmp_path, source))  # skipped: the tree stays as it is
    assert (tree / "patched-and-built").is_file()
    ex.run(_plan(tmp_path, source, env={"G4_X": "new source"}))  # runs again: from no tree
    assert sorted(p.name for p in tree.iterdir()) == ["made"]
