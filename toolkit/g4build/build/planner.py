"""``make_plan``: pin + series + target -> BuildPlan, choosing the OS module. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from g4build.build import linux, windows
from g4build.build.flashinfer import check_names
from g4build.build.plan import (
    GB_PER_NVCC_JOB,
    BuildPlan,
    Layout,
    Options,
    Step,
    Target,
    build_env,
    check_target,
    vllm_steps,
    wheel_version,
)
from g4build.depseries import BuildSeries
from g4build.errors import UsageError
from g4build.pins import Pin
from g4build.series import Series


def default_layout(pin: Pin, target: Target, *, base: str) -> Layout:
    if target.os == "windows":
        return windows.default_layout(pin, target)
    return linux.default_layout(pin, target, base=base)


def python_cmd(target: Target, exe: str | None = None) -> tuple[str, ...]:
    """The interpreter every Python step runs: ``exe`` when named (--python-exe), else the OS's default."""
    return windows.python_cmd(exe) if target.os == "windows" else linux.python_cmd(target.python, exe)


def make_plan(
    pin: Pin,
    series: Sequence[Series],
    target: Target,
    *,
    layout: Layout,
    opts: Options,
    cuda_home: str | None = None,
    build: Sequence[BuildSeries] = (),
    uncovered: Sequence[BuildSeries] = (),
) -> BuildPlan:
    """The whole vLLM build for ``target``; raises UsageError/BuildError for what is wrong before any step.
    ``build``: the pin's build series (applied after the prefetch); ``uncovered``: build series with no
    variant for the pin (named in the notes: that fix is missing from this build)."""
    check_target(target, pin, flashinfer=opts.flashinfer)
    if opts.flashinfer_wheels and target.os != "windows":
        raise UsageError(f"--flashinfer-wheel is for Windows builds: a {target.os} build compiles FlashInfer itself "
                         "(or takes flashinfer-python from the index)", hint="drop --flashinfer-wheel")
    check_names(opts.flashinfer_wheels, pin, target.python)
    notes: list[str] = []
    if target.os == "windows":
        # cl.exe has been seen crashing under sccache, with CUDA 13 at high parallelism: off unless asked for
        opts = dataclasses.replace(opts, launcher="sccache" if opts.sccache else None)
        notes.append("sccache: on (--sccache)" if opts.sccache else
                     "sccache: off on Windows (cl.exe crashes under it with CUDA 13 at high parallelism); "
                     "--sccache turns it on")
    version = wheel_version(pin, series, target.cuda, target.os, build)
    for b in build:
        notes.append(f"build series {b.name} v{b.version}: {b.series.title}")
    on = f"{pin.name}'s {target.os} base tree" if target.os == "windows" and "windows" in pin.bases else pin.name
    for b in uncovered:
        notes.append(f"build series {b.name} has no variant for {on}: {b.project} is built as that tree has it "
                     f"(missing: {b.series.title})")
    env = build_env(target, pin, version, layout, opts)
    pre: tuple[Step, ...]
    if target.os == "windows":
        windows.check_layout(layout)
        env.update(windows.env(target, layout))
        explicit = opts.python_exe is not None
        setup = windows.setup_lines(target, explicit_python=explicit)
        pre = (windows.python_step(target, layout, opts.python, explicit=explicit),
               *windows.flashinfer_steps(pin, target, layout, opts.g4build, opts.flashinfer_wheels))
        source = windows.source_steps(pin, layout, opts.g4build)
        extra = windows.extra_steps(target, layout, opts.g4build, opts.python)
        base = pin.bases["windows"]
        notes.append(f"source: Windows base {base.remote} at {base.commit}"
                     + (f", its changes over {base.onto[:12]} forward-ported onto {pin.name}" if base.onto else ""))
        notes.append(windows.flashinfer_note(pin, opts.flashinfer_wheels))
        if windows.needs_align_shim(target.cuda):
            notes.append(f"CUDA {target.cuda} + MSVC: cuda-shim gives the build a private cuda.h with 64-byte "
                         "CUtensorMap alignment when the installed one needs it (already patched or 13.3+: none); "
                         "run-time JIT reads the installed header")
    else:
        linux.check_layout(target.os, layout)
        env.update(linux.env(target, layout, cuda_home=cuda_home))
        setup = ()
        pre = ()
        source = linux.source_steps(pin, layout, opts.g4build)
        extra = ()
    if opts.launcher and target.os != "windows":
        notes.append(f"compiler cache: {opts.launcher} for every C/C++/CUDA unit, kept in {layout.compiler_cache}: "
                     "after a Python-only series bump no CUDA unit is compiled again")
    elif target.os != "windows":
        notes.append("compiler cache: none found (sccache or ccache on PATH): every rebuild, even after a "
                     "Python-only series bump, compiles every CUDA unit again; `pip install sccache` gives one")
    steps = vllm_steps(pin=pin, target=target, layout=layout, opts=opts, source=source, extra=extra,
                       version=version, pre=pre, build=build)
    jobs_from_machine = target.os == "windows" and not opts.jobs_given
    if jobs_from_machine:
        notes.append(f"MAX_JOBS: the script counts the RAM of the machine it runs on (~{GB_PER_NVCC_JOB:g} GB per "
                     f"nvcc job, at most its cores); {opts.jobs} here. Set MAX_JOBS or plan with --jobs to fix it")
    return BuildPlan(target=target, pin=pin.name, version=version, layout=layout, env=env, setup=setup,
                     steps=steps, notes=tuple(notes), jobs_from_machine=jobs_from_machine,
                     build_series=tuple(b.record(pin.name) for b in build))
