"""Where sccache keeps units, as the plan and doctor report it: read from the variables sccache reads."""

from __future__ import annotations

import pytest

from g4build.builder.cachebackend import sccache_backend
from g4build.builder.plan import Layout, Options
from g4build.builder.steps import compiler_cache_where


@pytest.mark.parametrize(("env", "kind", "where"), [
    ({}, "local", "/c/compiler-cache"),
    ({"SCCACHE_GHA_ENABLED": "true"}, "gha", "the GitHub Actions cache"),
    ({"SCCACHE_GHA_ENABLED": "false", "SCCACHE_GHA_VERSION": ""}, "local", "/c/compiler-cache"),  # CI, bucket set
    ({"SCCACHE_GHA_ENABLED": "false", "SCCACHE_GHA_VERSION": "k1"}, "gha", "the GitHub Actions cache (namespace k1)"),
    ({"SCCACHE_GHA_ENABLED": "false", "SCCACHE_GHA_VERSION": "", "SCCACHE_BUCKET": "b", "SCCACHE_REGION": "auto"},
     "s3", "S3-compatible bucket b (region auto)"),
    ({"SCCACHE_GCS_BUCKET": "g"}, "gcs", "GCS bucket g"),
])
def test_backend_from_the_environment(env: dict[str, str], kind: str, where: str) -> None:
    backend = sccache_backend(env.get, "/c/compiler-cache")
    assert (backend.kind, backend.where, backend.shared) == (kind, where, kind != "local")


def test_plan_names_the_shared_backend_only_for_sccache() -> None:
    layout = Layout(root="/b", cache="/c", out="/o", sep="/")
    shared = "S3-compatible bucket b"
    assert compiler_cache_where(Options(jobs=1, launcher="sccache", cache_backend=shared), layout).startswith(shared)
    assert compiler_cache_where(Options(jobs=1, launcher="ccache", cache_backend=shared), layout) == "/c/compiler-cache"
    assert compiler_cache_where(Options(jobs=1, launcher="sccache"), layout) == "/c/compiler-cache"
