"""The build's ``manifest`` step: a build's manifest made from its pin, target and resume state, written beside
the wheels and stamped into the vLLM wheel."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from g4build.builder.flashinfer import manifest_record, parse_spec
from g4build.builder.flashinfer_aot import read_record
from g4build.builder.kernels import check_build_options
from g4build.builder.plan import base_os_of, wheel_version
from g4build.builder.request import series_for
from g4build.emit.manifest import make_manifest
from g4build.emit.manifest_info import build_extra
from g4build.emit.stamp import stamp
from g4build.errors import UsageError
from g4build.pins.model import Pin
from g4build.pins.serving import requires_dist
from g4build.series.deps import build_series_for


def write_build_manifest(
    pin: Pin, out: Path, *, state: Path | None, arch: str | None, os_name: str | None, cuda: str | None,
    flashinfer_wheels: Sequence[str] = (), kernels: str | None = None, flash_attn: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Write build-manifest.json into ``out`` and stamp it into the vLLM wheel(s) there: (the manifest, the wheels
    stamped). ``flashinfer_wheels``: ``FILE=SHA256`` of the FlashInfer wheels a Windows build copied into ``out``."""
    series = series_for(pin)
    build = build_series_for(pin, base_os=base_os_of(pin, os_name))
    extra = build_extra(arch=arch, os_name=os_name, cuda=cuda, state=state)
    if kernels is not None or flash_attn is not None:  # what the build compiled beyond the arch list
        check_build_options(kernels or "all", flash_attn or "all")
        extra["build_options"] = {"kernels": kernels or "all", "flash_attn": flash_attn or "all"}
    if os_name == "windows":  # what the launch scripts and `recipe check --wheel` read
        extra["flashinfer"] = manifest_record(pin, out, [parse_spec(i) for i in flashinfer_wheels])
    elif flashinfer_wheels:
        raise UsageError("--flashinfer-wheel is for Windows builds (--os windows)")
    elif (aot := read_record(out, pin.flashinfer)) is not None:  # the scoped jit-cache build's modules
        extra["flashinfer"] = aot
    manifest = make_manifest(pin, series, route="build", extra=extra, base_os=base_os_of(pin, os_name),
                             build=build)
    # with cuda the wheel's version is known: only that wheel is stamped, not older ones in out
    # and the pin's serving ranges (transformers for Gemma 4) narrow its Requires-Dist, as an overlay's do
    version = wheel_version(pin, series, cuda, os_name, build, kernels=kernels or "all",
                            flash_attn=flash_attn or "all") if cuda else None
    touched = stamp(out, manifest, version=version, requires=requires_dist(pin), retag=True)
    return manifest, touched
