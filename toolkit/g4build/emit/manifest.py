"""build-manifest.json: what made a wheel (pin, series, route, env, tools, timings).

Written beside the wheels and inside the vLLM wheel's ``*.dist-info/``; wheel validation reads it back to
learn which series a wheel claims (and so which fingerprints to look for). The file's name, schema and bytes
are ``g4build.wheelfile.manifestfile``'s, which validation reads without this module.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from collections.abc import Iterable
from typing import Any

from g4build import __version__
from g4build.errors import UsageError
from g4build.pins.model import Pin
from g4build.series.deps import BuildSeries
from g4build.series.model import Series, stack_digest
from g4build.source.base import fixup_patches
from g4build.util.safeload import read_patch
from g4build.wheelfile.manifestfile import SCHEMA


def created_time(derived: _dt.datetime | None = None) -> str:
    """The manifest's ``created``: ``SOURCE_DATE_EPOCH`` when set (reproducible builds), else a time derived
    from the inputs when the caller has one (an overlay: the source wheel's own timestamp), else now."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        try:
            when = _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise UsageError(
                f"SOURCE_DATE_EPOCH={epoch!r}: expected whole seconds since 1970-01-01 UTC",
                hint="e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct), or unset it",
            ) from None
    elif derived is not None:
        when = derived if derived.tzinfo else derived.replace(tzinfo=_dt.timezone.utc)
    else:
        when = _dt.datetime.now(_dt.timezone.utc)
    return when.isoformat(timespec="seconds")


def make_manifest(
    pin: Pin, series: Iterable[Series], *, route: str, extra: dict[str, Any] | None = None,
    base_os: str | None = None, created: _dt.datetime | None = None, build: Iterable[BuildSeries] = (),
) -> dict[str, Any]:
    """``route`` is ``build`` or ``overlay``; ``extra`` adds env, tools, timings, wheels...; ``base_os``: the
    build's source was the pin's base tree for that OS (recorded, and part of the digest); ``created``: a time
    derived from the inputs (see ``created_time``); ``build``: the build series the compiled code carries
    (recorded with project, dependency commit and patch sha256s, and part of the digest)."""
    chosen = list(series)
    builds = list(build)
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "g4build": __version__,
        "created": created_time(created),
        "route": route,
        "pin": pin.to_dict(),
        "digest": stack_digest(pin, chosen, base_os, [b.series for b in builds]),
        "series": [
            {
                "name": s.name,
                "version": s.version,
                "patches": [p.file for p in s.patches_for(pin.name)],
            }
            for s in chosen
        ],
    }
    if builds:
        data["build_series"] = [b.record(pin.name) for b in builds]
    if base_os is not None and base_os in pin.bases:
        base = pin.bases[base_os]
        fixups = fixup_patches(base_os, pin) if base.onto else []
        data["base"] = {"os": base_os, **base.to_dict(),
                        "fixups": [{"file": f.name, "sha256": hashlib.sha256(read_patch(f)).hexdigest()}
                                   for f in fixups]}
    if extra:
        data.update(extra)
    return data
