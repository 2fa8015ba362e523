"""What a build of one pin for one arch was measured to cost, shipped as data
(``patches/build-costs/<pin>-<arch>.json``): the peak memory per parallel nvcc job (``MAX_JOBS`` comes from it)
and the compile time of its longest units (``ninjaorder`` starts those first). ``tests/device/unit_costs.py``
writes the file from a device build's ``.ninja_log`` and peak memory. No file for a pin and arch: the old rule
of thumb (5 GB a job), no ordering.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError

FOLDER = "build-costs"
BUILD_ARCH = "sm120"  # the arch doctor's build route checks for (the product's wheels are for RTX 50xx)
GB_PER_JOB_UNMEASURED = 5.0  # an nvcc job on vLLM's heavy units needs ~4-6 GB; OOM "Killed" is the usual failure


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    unit: str  # the object's path after its last ``CMakeFiles/``, an fnmatch pattern (``_C.dir/*/x.cu.o``)
    seconds: float


@dataclass(frozen=True, kw_only=True)
class BuildCosts:
    pin: str
    arch: str
    peak_gb: float  # the build's peak memory in use (GB, 10^9 bytes) ...
    at_jobs: int  # ... at this many parallel jobs
    margin: float  # the figure used per job is peak_gb / at_jobs times this
    measured: str  # where the figures come from (machine, run)
    units: tuple[UnitCost, ...] = ()

    @property
    def gb_per_job(self) -> float:
        return self.peak_gb / self.at_jobs * self.margin

    def seconds_of(self, output: str) -> float | None:
        """The recorded cost of a ninja output (``.../CMakeFiles/_C.dir/csrc/a.cu.o``): the first entry whose
        pattern matches, None for a unit not recorded."""
        key = output.replace("\\", "/").rsplit("CMakeFiles/", 1)[-1]
        return next((u.seconds for u in self.units if fnmatch.fnmatchcase(key, u.unit)), None)


def costs_file(patches: Path, pin: str, arch: str) -> Path:
    return patches / FOLDER / f"{pin}-{arch}.json"


def _number(raw: dict[str, Any], key: str, where: Path, kind: type = float) -> Any:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or \
            (kind is int and not isinstance(value, int)):
        raise ConfigError(f"{where}: {key!r} must be a positive {'integer' if kind is int else 'number'}, "
                          f"found {value!r}", hint="rewrite the file with tests/device/unit_costs.py")
    return kind(value)


def parse_costs(raw: Any, where: Path) -> BuildCosts:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object, found {type(raw).__name__}",
                          hint="rewrite the file with tests/device/unit_costs.py")
    units = raw.get("units", [])
    if not isinstance(units, list) or not all(
            isinstance(u, dict) and isinstance(u.get("unit"), str) and isinstance(u.get("seconds"), (int, float))
            and not isinstance(u.get("seconds"), bool) and u["seconds"] >= 0 for u in units):
        raise ConfigError(f"{where}: 'units' must be a list of {{\"unit\": pattern, \"seconds\": number >= 0}}",
                          hint="rewrite the file with tests/device/unit_costs.py")
    return BuildCosts(pin=str(raw.get("pin", "")), arch=str(raw.get("arch", "")),
                      peak_gb=_number(raw, "peak_gb", where), at_jobs=_number(raw, "at_jobs", where, int),
                      margin=_number(raw, "margin", where), measured=str(raw.get("measured", "")),
                      units=tuple(UnitCost(unit=u["unit"], seconds=float(u["seconds"])) for u in units))


def load_costs(patches: Path, pin: str, arch: str) -> BuildCosts | None:
    """The recorded costs of ``pin`` built for ``arch``; None when none were recorded."""
    path = costs_file(patches, pin, arch)
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: expected JSON, could not read it ({e})",
                          hint="rewrite the file with tests/device/unit_costs.py") from e
    costs = parse_costs(raw, path)
    if (costs.pin, costs.arch) != (pin, arch):
        raise ConfigError(f"{path}: records pin {costs.pin!r} arch {costs.arch!r}, expected {pin!r} {arch!r}",
                          hint="the file name says which build it describes: fix one or the other")
    return costs


@dataclass(frozen=True, kw_only=True)
class JobsChoice:
    jobs: int
    gb_per_job: float
    why: str  # one line: RAM, the per-job figure and where it comes from, cores


def choose_jobs(*, mem_gb: float, cores: int | None, costs: BuildCosts | None, nvcc_threads: int = 1) -> JobsChoice:
    """Parallel nvcc jobs that fit: the RAM over the measured peak per job (with its margin; 5 GB when this
    build was never measured), times each job's threads, never more than the cores, at least one."""
    per_job = costs.gb_per_job if costs is not None else GB_PER_JOB_UNMEASURED
    need = per_job * max(1, nvcc_threads)
    by_mem = int(mem_gb // need)
    jobs = max(1, by_mem if cores is None else min(cores, by_mem))
    source = (f"{per_job:.1f} GB a job, measured for {costs.pin} {costs.arch}: peak {costs.peak_gb:g} GB at "
              f"{costs.at_jobs} jobs, x{costs.margin:g} margin" if costs is not None
              else f"{per_job:g} GB a job, not measured for this build")
    bound = "the cores" if cores is not None and by_mem > cores else "the RAM" if by_mem else "one at the least"
    threads = f", {nvcc_threads} nvcc threads each" if nvcc_threads > 1 else ""
    n_cores = "unknown" if cores is None else str(cores)
    why = (f"{mem_gb:.0f} GB RAM / {source}{threads} = {by_mem}; {n_cores} cores; {jobs} job{'s' * (jobs != 1)}, "
           f"bound by {bound}")
    return JobsChoice(jobs=jobs, gb_per_job=per_job, why=why)
