"""``make_plan``: pin + series + target -> BuildPlan, the OS's part from its platform module. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from g4build.builder.arch import cuda_arch_list
from g4build.builder.flashinfer import check_names
from g4build.builder.kernels import check_build_options, check_flash_attn, resolve_kernels
from g4build.builder.kernels import option_notes as build_option_notes
from g4build.builder.plan import BuildPlan, Layout, Options, Target, check_target, wheel_version
from g4build.builder.platforms import platform_for
from g4build.builder.prereqs import estimate, prerequisites
from g4build.builder.steps import build_env, orders_units, vllm_steps
from g4build.pins.model import Pin
from g4build.series.deps import BuildSeries
from g4build.series.kernelprofile import left_out
from g4build.series.model import Series
from g4build.series.unitaccount import load_accounting
from g4build.series.unitaccount import notes as accounting_notes


def default_layout(pin: Pin, target: Target, *, base: str) -> Layout:
    return platform_for(target.os).default_layout(pin, target, base=base)


def python_cmd(target: Target, exe: str | None = None) -> tuple[str, ...]:
    """The interpreter every Python step runs: ``exe`` when named (--python-exe), else the OS's default."""
    return platform_for(target.os).python_cmd(target, exe)


def kernel_notes(opts: Options, build: Sequence[BuildSeries]) -> list[str]:
    """The plan's notes for --kernels / --flash-attn, with the families the profile leaves out as the build
    series' decisions table records them (``left_out_in``)."""
    leaves_out = [f"{lo.decision.family}: {lo.decision.why}" for lo in left_out(opts.kernels, build)]
    return build_option_notes(opts.kernels, opts.flash_attn, leaves_out)


def unit_notes(pin: Pin, target: Target, opts: Options, build: Sequence[BuildSeries]) -> list[str]:
    """What the build series' unit accounting says of this build's units (what runs on the GPU, what is kept
    without running there and why), where one exists for the target arch and its arch list."""
    found = []
    for b in build:
        acc = load_accounting(b, pin.name, target.arch.name)
        if acc is None:
            continue
        arch_list = cuda_arch_list(target.arch, target.cuda)
        if arch_list != acc.arch_list:
            found.append(f"{b.name}'s unit accounting is for TORCH_CUDA_ARCH_LIST {acc.arch_list}, this build's is "
                         f"{arch_list}: its units are not accounted for")
        else:
            found += accounting_notes(acc, opts.kernels)
    return found


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
    check_build_options(opts.kernels, opts.flash_attn, auto=True)
    on = f"{pin.name}'s {target.os} base tree" if target.os == "windows" and "windows" in pin.bases else pin.name
    kernels, profile_notes = resolve_kernels(opts.kernels, target.arch.name, uncovered, on, pin.name)
    opts = dataclasses.replace(opts, kernels=kernels)
    check_flash_attn(opts.flash_attn, uncovered, on, pin.name)
    platform = platform_for(target.os)
    opts, option_notes = platform.resolve_options(target, opts)
    check_names(opts.flashinfer_wheels, pin, target.python)
    notes = [*option_notes, *profile_notes, *kernel_notes(opts, build), *unit_notes(pin, target, opts, build)]
    version = wheel_version(pin, series, target.cuda, target.os, build, kernels=opts.kernels,
                            flash_attn=opts.flash_attn)
    for b in build:
        notes.append(f"build series {b.name} v{b.version}: {b.series.title}")
    for b in uncovered:
        notes.append(f"build series {b.name} has no variant for {on}: {b.project} is built as that tree has it "
                     f"(missing: {b.series.title})")
    env = build_env(target, pin, version, layout, opts)
    platform.check_layout(target, layout)
    env.update(platform.env(target, layout, cuda_home=cuda_home))
    notes += platform.notes(pin, target, layout, opts)
    steps = vllm_steps(pin=pin, target=target, layout=layout, opts=opts,
                       source=platform.source_steps(pin, layout, opts.g4build),
                       extra=platform.extra_steps(target, layout, opts), version=version,
                       pre=platform.pre_steps(pin, target, layout, opts), build=build)
    if orders_units(target, opts):
        notes.append(f"long units first: CMake runs ninja through {layout.build_order}{layout.sep}ninja, which moves "
                     f"the units recorded in patches/build-costs/{pin.name}-{target.arch.name}.json to the front of "
                     "build.ninja (ninja itself starts ready units in file order)")
    jobs_from_machine = platform.jobs_from_machine(opts)
    if jobs_from_machine:
        notes.append(f"MAX_JOBS: the script counts the RAM of the machine it runs on (~{opts.gb_per_job:.1f} GB per "
                     f"nvcc job, at most its cores), not this one's; this plan and its estimate assume {opts.jobs}. "
                     "Set MAX_JOBS there, or plan with --jobs N, to fix it")
    return BuildPlan(target=target, pin=pin.name, version=version, layout=layout, env=env,
                     setup=platform.setup_lines(target, opts), steps=steps, notes=tuple(notes),
                     jobs_from_machine=jobs_from_machine, gb_per_job=opts.gb_per_job,
                     build_series=tuple(b.record(pin.name) for b in build),
                     prerequisites=prerequisites(pin, target, opts), estimate=estimate(target, opts))
