"""Where sccache keeps compiled units, read from the variables sccache itself reads: a bucket (S3-compatible,
GCS, Azure), Redis, WebDAV, the GitHub Actions cache, or else this machine's folder. sccache takes an empty
variable as unset, and so does this reading. The build plan and ``doctor`` report it; nothing here decides it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Env = Callable[[str], "str | None"]


@dataclass(frozen=True, kw_only=True)
class CacheBackend:
    kind: str  # "s3", "gcs", "azure", "redis", "webdav", "gha" or "local"
    where: str  # for people: "S3 bucket my-cache (endpoint ...)"

    @property
    def shared(self) -> bool:
        """Other machines (CI runners) read what this one compiled."""
        return self.kind != "local"


def sccache_backend(env: Env, local_dir: str | None = None) -> CacheBackend:
    def get(name: str) -> str:
        return env(name) or ""

    if bucket := get("SCCACHE_BUCKET"):
        extra = ", ".join(f"{k} {v}" for k, v in (("endpoint", get("SCCACHE_ENDPOINT")),
                                                   ("region", get("SCCACHE_REGION"))) if v)
        return CacheBackend(kind="s3", where=f"S3-compatible bucket {bucket}" + (f" ({extra})" if extra else ""))
    if bucket := get("SCCACHE_GCS_BUCKET"):
        return CacheBackend(kind="gcs", where=f"GCS bucket {bucket}")
    if get("SCCACHE_AZURE_CONNECTION_STRING"):
        return CacheBackend(kind="azure", where=f"Azure blob container {get('SCCACHE_AZURE_BLOB_CONTAINER') or '?'}")
    if get("SCCACHE_REDIS") or get("SCCACHE_REDIS_ENDPOINT"):
        return CacheBackend(kind="redis", where="Redis")
    if endpoint := get("SCCACHE_WEBDAV_ENDPOINT"):
        return CacheBackend(kind="webdav", where=f"WebDAV {endpoint}")
    version = get("SCCACHE_GHA_VERSION")
    if version or get("SCCACHE_GHA_ENABLED").lower() in ("true", "on", "1"):
        return CacheBackend(kind="gha", where="the GitHub Actions cache" + (f" (namespace {version})" if version
                                                                           else ""))
    return CacheBackend(kind="local", where=local_dir or get("SCCACHE_DIR") or "sccache's default folder")
