"""The Docker engine route, through the docker SDK: take the image locally or pull it, create a container
(never started), stream its exported filesystem, and remove the container when the caller is done."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

from g4build.errors import ImageError
from g4build.image.layers import drain
from g4build.image.model import ImageInfo, LayerStream, OpenedImage

DockerFactory = Callable[[], Any]
_BUFFER = 1 << 20


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the SDK's export stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def _docker_from_env() -> Any:
    import docker

    return docker.from_env(timeout=30)


def open_engine_image(
    reference: str, factory: DockerFactory | None, stack: ExitStack, *, platform: str | None = None
) -> OpenedImage:
    import docker.errors

    try:
        client = (factory or _docker_from_env)()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageError(
            f"no Docker engine answers for image '{reference}': {exc}",
            hint="start Docker, or pass a `docker save` tarball or an OCI layout folder instead",
        ) from exc
    try:
        try:
            image = client.images.get(reference)
        except docker.errors.ImageNotFound:
            image = client.images.pull(reference, **({"platform": platform} if platform else {}))
        container = client.containers.create(image.id, command=["true"])  # created, never started
    except docker.errors.DockerException as exc:
        raise ImageError(f"Docker could not prepare image '{reference}': {exc}") from exc
    stack.callback(container.remove, force=True)
    attrs = image.attrs or {}
    repo_digests = attrs.get("RepoDigests") or []
    digest = str(repo_digests[0]).split("@", 1)[1] if repo_digests else str(image.id)
    info = ImageInfo(
        reference=reference,
        digest=digest,
        kind="docker-engine",
        platform=f"{attrs.get('Os', '?')}/{attrs.get('Architecture', '?')}",
    )

    def stream() -> Iterator[LayerStream]:
        reader = io.BufferedReader(_ChunkReader(iter(container.export())), _BUFFER)
        yield "container export", reader
        drain(reader)

    return OpenedImage(info=info, layers=stream())
