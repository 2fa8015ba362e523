"""What every image source yields: the image's identity and its layers as uncompressed tar streams."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

LayerStream = tuple[str, IO[bytes]]


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    reference: str
    digest: str
    kind: str  # "docker-engine", "docker-save" or "oci-layout"
    platform: str

    @property
    def origin(self) -> str:
        return f"{self.reference}@{self.digest}"


@dataclass(frozen=True, kw_only=True)
class OpenedImage:
    info: ImageInfo
    layers: Iterable[LayerStream]
