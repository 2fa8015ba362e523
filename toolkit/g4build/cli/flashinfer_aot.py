"""`g4build flashinfer-aot`: the FlashInfer JIT modules the launch recipes load, compiled ahead of time into a
flashinfer-jit-cache wheel (the build step ``g4build wheel`` plans; ``--list`` only derives the modules)."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import typer

from g4build.builder.arch import flashinfer_arch_list, parse_arch
from g4build.builder.flashinfer_aot import (
    RECORD_FILE,
    JitCacheInfo,
    flashinfer_arch_name,
    manifest_record,
    pack_wheel,
)
from g4build.builder.flashinfer_aot_build import Module, compile_modules, source_commit, source_tree
from g4build.cli._common import JSON_OPTION, console, print_json
from g4build.errors import ConfigError
from g4build.pins.model import Pin, load_pins
from g4build.recipes import recipe_names
from g4build.recipes.flashinfer_modules import TABLE_FILE, Derived, load_table, modules_for_pin


def _arch_list(text: str, pin: Pin) -> str:
    """``12.0f`` / ``9.0`` as FlashInfer spells them, or an arch name (sm120) in the pin's CUDA spelling."""
    items = text.split()
    if items and all(re.fullmatch(r"\d{1,2}\.\d[af]?", i) for i in items):
        for item in items:
            flashinfer_arch_name(item)
        return " ".join(items)
    return flashinfer_arch_list(parse_arch(text), pin.cuda)


def _platform_tag() -> str:
    return f"linux_{platform.machine()}"


def flashinfer_aot(
    pin_name: str | None = typer.Option(None, "--pin", help="Pin whose vLLM and FlashInfer to read."),
    arch: str = typer.Option("12.0f", "--arch", help="FLASHINFER_CUDA_ARCH_LIST ('12.0f', '9.0', '9.0 12.0f') "
                             "or an arch name (sm120)."),
    recipes: list[str] = typer.Option(None, "--recipe", help="Derive from this recipe (repeatable; default: all)."),
    list_only: bool = typer.Option(False, "--list", help="Only print the derived modules, compile nothing."),
    out: Path = typer.Option(Path("wheelhouse"), "--out", help="Folder for the jit-cache wheel and its record."),
    work: Path = typer.Option(Path("flashinfer-aot-work"), "--work", help="Folder for the source and the build."),
    python: str | None = typer.Option(None, "--python-exe", help="Python of the build environment (torch, "
                                      "apache-tvm-ffi, jinja2); default: this one."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Parallel compile jobs (MAX_JOBS)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Compile only the FlashInfer modules the recipes make vLLM load, for ARCH, into a flashinfer-jit-cache wheel."""
    pins = load_pins()
    pin = pins.get(pin_name or pins.default)
    table = load_table()
    names = list(recipes or recipe_names())
    derived = modules_for_pin(pin.name, names, table)
    arch_list = _arch_list(arch, pin)
    if list_only:
        _show(pin, arch_list, derived, as_json)
        return
    source = table.sources.get(pin.flashinfer)
    if source is None:
        raise ConfigError(f"recipes/{TABLE_FILE}: no sources entry for FlashInfer {pin.flashinfer} (pin {pin.name})",
                          hint="add its flashinfer-python sdist file and sha256 there")
    tree = source_tree(pin.flashinfer, source.file, source.sha256, work.resolve())
    modules = [Module(name=d.module.name, generator=d.module.generator, majors=d.module.majors) for d in derived]
    built_dir, built = compile_modules(python=python, tree=tree, work=work.resolve() / arch_list.replace(" ", "_"),
                                       modules=modules, arch_list=arch_list, jobs=jobs)
    info = JitCacheInfo(flashinfer=pin.flashinfer, source_file=source.file, source_sha256=source.sha256,
                        arch_list=arch_list, modules=built.modules,
                        majors=tuple((m.name, m.majors) for m in modules if m.majors))
    wheel = pack_wheel(built_dir, out, info, _platform_tag())
    record = {**manifest_record(info, wheel, built.seconds, built.sizes), "skipped": list(built.skipped),
              "recipes": names, "commit": source_commit(tree)}
    (out / RECORD_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if as_json:
        print_json(record)
        return
    console.print(f"wrote {wheel} ({', '.join(built.modules)} for {arch_list}, {built.seconds:.0f} s)",
                  highlight=False, markup=False)
    for name in built.skipped:
        console.print(f"note: {name} has no code for {arch_list} (its generator targets other archs)",
                      highlight=False, markup=False)


def _show(pin: Pin, arch_list: str, derived: list[Derived], as_json: bool) -> None:
    rows = [{"module": d.module.name, "generator": d.module.generator, "majors": list(d.module.majors),
             "reasons": list(d.reasons)} for d in derived]
    if as_json:
        print_json({"pin": pin.name, "flashinfer": pin.flashinfer, "arch_list": arch_list, "modules": rows})
        return
    console.print(f"{pin.name} (FlashInfer {pin.flashinfer}), {arch_list}:", highlight=False, markup=False)
    for d in derived:
        console.print(f"  {d.module.name}  ({d.module.generator})", highlight=False, markup=False)
        for reason in d.reasons:
            console.print(f"    {reason}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("flashinfer-aot")(flashinfer_aot)
