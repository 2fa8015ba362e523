"""The unit accounting of a build series: what every compile unit of a build for one arch list does on that GPU.

``patches/deps/<series>/units-<arch>.yaml`` (only ``units-sm120.yaml`` today)::

    arch_list: "12.0f"            # the TORCH_CUDA_ARCH_LIST the accounting is for
    pins:
      <pin>:
        - group: <name>
          units: [<glob>, ...]   # tree-relative; fetched projects as <name>/..., FlashAttention vllm-flash-attn/...
          runs: <which kernels run on that GPU, and what calls them>    # exactly one of runs / kept
          kept: <it does not run there: why it must be built all the same>
          profiles: [all, gemma4]  # the kernel profiles that compile it (default: every profile)

Every unit the build compiles must match exactly one group, and every glob some unit (:func:`check`, which the
tests hold against the pin's real CMake). The plan's notes name each ``kept`` group (:func:`notes`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.data import load_yaml_mapping, require
from g4build.errors import ConfigError
from g4build.series.deps import KERNEL_PROFILES, BuildSeries


@dataclass(frozen=True, kw_only=True)
class UnitGroup:
    group: str
    units: tuple[str, ...]
    runs: str = ""
    kept: str = ""
    profiles: tuple[str, ...] = KERNEL_PROFILES

    def matches(self, unit: str) -> bool:
        return any(fnmatch.fnmatchcase(unit, g) for g in self.units)


@dataclass(frozen=True, kw_only=True)
class Accounting:
    series: str
    arch: str
    arch_list: str
    pin: str
    groups: tuple[UnitGroup, ...]

    def kept(self, profile: str) -> list[UnitGroup]:
        return [g for g in self.groups if g.kept and profile in g.profiles]


@dataclass(frozen=True)
class Mismatch:
    """What :func:`check` finds: units no group names (or several, or a group of another profile) and globs
    that name no unit of the build."""

    unaccounted: tuple[str, ...] = ()
    ambiguous: tuple[str, ...] = ()
    wrong_profile: tuple[str, ...] = ()
    stale_globs: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.unaccounted or self.ambiguous or self.wrong_profile or self.stale_globs)


def accounting_path(build: BuildSeries, arch: str) -> Path:
    return build.series.folder / f"units-{arch}.yaml"


def _group(raw: Any, where: str) -> UnitGroup:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping (group, units, runs or kept), found {type(raw).__name__}")
    units = raw.get("units")
    if not isinstance(units, list) or not units or not all(isinstance(u, str) and u for u in units):
        raise ConfigError(f"{where}.units: expected a non-empty list of path globs, found {units!r}")
    runs, kept = raw.get("runs") or "", raw.get("kept") or ""
    if not isinstance(runs, str) or not isinstance(kept, str) or bool(runs) == bool(kept):
        raise ConfigError(f"{where}: expected exactly one of runs (what runs on the GPU) or kept (why a unit that "
                          f"does not run there is built), found runs={runs!r} kept={kept!r}")
    profiles = raw.get("profiles") or list(KERNEL_PROFILES)
    if not isinstance(profiles, list) or not profiles or not set(profiles) <= set(KERNEL_PROFILES):
        raise ConfigError(f"{where}.profiles: expected kernel profiles ({', '.join(KERNEL_PROFILES)}), "
                          f"found {profiles!r}")
    return UnitGroup(group=require(raw, "group", str, where), units=tuple(units), runs=" ".join(runs.split()),
                     kept=" ".join(kept.split()), profiles=tuple(p for p in KERNEL_PROFILES if p in profiles))


def load_accounting(build: BuildSeries, pin_name: str, arch: str) -> Accounting | None:
    """The series' accounting of ``arch``'s units for ``pin_name``; None where it keeps none."""
    path = accounting_path(build, arch)
    if not path.is_file():
        return None
    data = load_yaml_mapping(path)
    where = str(path)
    arch_list = require(data, "arch_list", str, where)
    groups = require(data, "pins", dict, where).get(pin_name)
    if groups is None:
        return None
    if not isinstance(groups, list) or not groups:
        raise ConfigError(f"{where}: pins.{pin_name}: expected a list of unit groups")
    return Accounting(series=build.name, arch=arch, arch_list=arch_list, pin=pin_name,
                      groups=tuple(_group(g, f"{where}: pins.{pin_name}[{i}]") for i, g in enumerate(groups)))


def check(accounting: Accounting, units: Mapping[str, Iterable[str]]) -> Mismatch:
    """``units``: per kernel profile, the units its build compiles (as the accounting's globs name them)."""
    unaccounted: set[str] = set()
    ambiguous: set[str] = set()
    wrong: set[str] = set()
    used: set[str] = set()
    for profile, listed in units.items():
        for unit in listed:
            hits = [g for g in accounting.groups if g.matches(unit)]
            if not hits:
                unaccounted.add(unit)
            elif len(hits) > 1:
                ambiguous.add(f"{unit} ({', '.join(g.group for g in hits)})")
            elif profile not in hits[0].profiles:
                wrong.add(f"{unit} ({profile}: group {hits[0].group} says {', '.join(hits[0].profiles)})")
            used.update(glob for g in hits for glob in g.units if fnmatch.fnmatchcase(unit, glob))
    stale = [glob for g in accounting.groups for glob in g.units if glob not in used]
    return Mismatch(tuple(sorted(unaccounted)), tuple(sorted(ambiguous)), tuple(sorted(wrong)), tuple(stale))


def notes(accounting: Accounting, profile: str) -> list[str]:
    """The plan's lines: one for the accounting, one per group kept without running on the GPU."""
    kept = accounting.kept(profile)
    groups = [g for g in accounting.groups if profile in g.profiles]
    source = f"patches/deps/{accounting.series}/units-{accounting.arch}.yaml"
    head = (f"{accounting.arch} units ({source}): {len(groups) - len(kept)} of the {len(groups)} unit groups "
            f"kernel profile {profile} compiles run on {accounting.arch.upper()}")
    if not kept:
        return [head + "; none is built only for a symbol or a registration"]
    return [head + f"; {len(kept)} kept without running there:",
            *(f"{accounting.arch} units kept, not run on {accounting.arch.upper()}: {g.group} ({', '.join(g.units)})"
              f": {g.kept}" for g in kept)]
