"""Where an image's filesystem comes from: a Docker engine, a ``docker save`` tarball, or an OCI image layout.

``open_image(IMAGE)`` yields the image's identity (reference + digest) and its layers as uncompressed tar
streams, in order, ready for ``layers.apply_layers``. Content-addressed blobs are verified against their
sha256 while they are read. The engine route uses the docker SDK: the image is taken locally or pulled, a
container is created (never started), its filesystem exported as one stream, and the container removed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import platform as host_platform
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any, Protocol, cast

from g4build.errors import ImageError, IntegrityError
from g4build.image.engine import DockerFactory, open_engine_image
from g4build.image.layers import clean_member_name, drain
from g4build.image.model import ImageInfo, LayerStream, OpenedImage
from g4build.util.safeload import loads_json

_BLOB = re.compile(r"^blobs/(sha256)/([0-9a-f]{64})$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BUFFER = 1 << 20
_MAX_JSON = 64 << 20


# --- readers -------------------------------------------------------------------------------------------------


class _HashingReader(io.RawIOBase):
    """Passes bytes through and hashes them, so a blob is verified as it streams."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.hash.update(data)
        return n


def _decompressed(buffered: io.BufferedReader[Any], label: str) -> IO[bytes]:
    magic = buffered.peek(4)[:4]
    if magic.startswith(_GZIP_MAGIC):
        return cast(IO[bytes], gzip.GzipFile(fileobj=buffered, mode="rb"))
    if magic.startswith(_ZSTD_MAGIC):
        try:
            import zstandard  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ImageError(
                f"layer {label} is zstd-compressed and the zstandard module is not installed",
                hint="pip install zstandard, or re-save the image with gzip layers",
            ) from exc
        reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(buffered)
        return reader
    return buffered


def _verified_layers(entries: Iterable[tuple[str, Callable[[], IO[bytes]], str | None]]) -> Iterator[LayerStream]:
    """Yield each layer's uncompressed stream; once the consumer moves on, finish reading and check its digest."""
    for label, opener, digest in entries:
        with opener() as raw:
            hashing = _HashingReader(raw)
            buffered = io.BufferedReader(hashing, _BUFFER)
            stream = _decompressed(buffered, label)
            yield label, stream
            drain(stream)
            drain(buffered)
            found = "sha256:" + hashing.hash.hexdigest()
            if digest is not None and found != digest:
                raise IntegrityError(
                    f"layer {label}: expected digest {digest}, found {found}",
                    hint="the image files are damaged or were altered; save or pull the image again",
                )


# --- bundles: a folder or a tarball holding an image -----------------------------------------------------


class _Bundle(Protocol):
    name: str

    def has(self, rel: str) -> bool: ...

    def open(self, rel: str) -> IO[bytes]: ...


class _DirBundle:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.name = root.name

    def _path(self, rel: str) -> Path:
        clean = clean_member_name(rel)
        if not clean:
            raise ImageError(f"{self.name}: the image names '{rel}', a path outside the image folder")
        path = (self.root / clean).resolve()
        if not path.is_relative_to(self.root):
            raise ImageError(f"{self.name}: '{rel}' links outside the image folder; refusing it")
        return path

    def has(self, rel: str) -> bool:
        return self._path(rel).is_file()

    def open(self, rel: str) -> IO[bytes]:
        path = self._path(rel)
        if not path.is_file():
            raise ImageError(f"{self.name}: '{rel}' is missing", hint="the image folder is incomplete")
        return path.open("rb")


class _TarBundle:
    def __init__(self, path: Path, stack: ExitStack) -> None:
        self.name = path.name
        try:
            self.tar = stack.enter_context(tarfile.open(path, "r:*"))  # noqa: SIM115 (closed by the stack)
            names = ((clean_member_name(m.name), m) for m in self.tar.getmembers() if not m.isdir())
            self.members = {name: m for name, m in names if name}
        except (tarfile.TarError, OSError) as exc:
            raise ImageError(
                f"{path.name}: not a readable tar archive: {exc}",
                hint="pass a `docker save` tarball, an OCI layout folder or tarball, or an image reference",
            ) from exc

    def has(self, rel: str) -> bool:
        return clean_member_name(rel) in self.members

    def open(self, rel: str) -> IO[bytes]:
        member = self.members.get(clean_member_name(rel) or "")
        try:
            reader = self.tar.extractfile(member) if member is not None else None  # links resolve inside the tar
        except (KeyError, RecursionError, tarfile.TarError) as exc:  # a link to nothing, or a loop of links
            raise ImageError(f"{self.name}: '{rel}' is a link that leads to no file of the archive ({exc})",
                             hint="the archive is damaged or was altered: save the image again") from None
        if reader is None:
            raise ImageError(f"{self.name}: '{rel}' is missing or not a file", hint="the archive is incomplete")
        return reader


def _read_json(bundle: _Bundle, rel: str, digest: str | None = None) -> Any:
    """A JSON document of the image; a blob named by ``digest`` must hash to it."""
    with bundle.open(rel) as fh:
        data = fh.read(_MAX_JSON + 1)
    if len(data) > _MAX_JSON:
        raise ImageError(f"{bundle.name}: {rel} is over {_MAX_JSON} bytes; not an image document")
    if digest is not None and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise IntegrityError(f"{bundle.name}: {rel} does not match its digest {digest}",
                             hint="the image files are damaged or were altered; save or pull the image again")
    # bounded as every file g4build did not write: nesting, number size, NaN and Infinity (safeload)
    return loads_json(data, f"{bundle.name}: {rel}", error=ImageError)


def _read_blob_json(bundle: _Bundle, digest: Any, where: str) -> Any:
    return _read_json(bundle, _blob_path(digest, where), str(digest))


def _blob_path(digest: str, where: str) -> str:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ImageError(f"{where}: expected a sha256 digest, found {digest!r}")
    return "blobs/sha256/" + digest.split(":", 1)[1]


# --- docker save ------------------------------------------------------------------------------------------


def _tags(entry: dict[str, Any]) -> list[str]:
    tags = entry.get("RepoTags")
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def _docker_save(bundle: _Bundle) -> OpenedImage:
    manifest = _read_json(bundle, "manifest.json")
    if not isinstance(manifest, list) or not manifest or not all(isinstance(e, dict) for e in manifest):
        raise ImageError(f"{bundle.name}: manifest.json holds no image (expected a list of objects)")
    if len(manifest) > 1:
        names = ", ".join(str(t) for entry in manifest for t in _tags(entry)) or "untagged images"
        raise ImageError(
            f"{bundle.name} holds {len(manifest)} images ({names}); expected one",
            hint="save one image per tarball: docker save IMAGE -o image.tar",
        )
    entry = manifest[0]
    config = str(entry.get("Config") or "")
    layer_paths = entry.get("Layers")
    if not config or not isinstance(layer_paths, list):
        raise ImageError(f"{bundle.name}: manifest.json lacks Config or Layers")
    # The config's name is the image ID, the sha256 of its bytes: check it, since Origin records it.
    hexid = config.rsplit("/", 1)[-1].removesuffix(".json")
    if not _DIGEST.fullmatch(f"sha256:{hexid}"):
        raise ImageError(
            f"{bundle.name}: manifest.json names the config '{config}'; expected <sha256 hex>.json or "
            "blobs/sha256/<hex> (the image ID)",
            hint="save the image again with `docker save IMAGE -o image.tar`",
        )
    cfg = _read_json(bundle, config, f"sha256:{hexid}")
    if not isinstance(cfg, dict):
        raise ImageError(f"{bundle.name}: {config} is not an image config")
    tags = _tags(entry)
    info = ImageInfo(
        reference=str(tags[0]) if tags else bundle.name,
        digest=f"sha256:{hexid}",
        kind="docker-save",
        platform=f"{cfg.get('os', '?')}/{cfg.get('architecture', '?')}",
    )

    def entries() -> Iterator[tuple[str, Callable[[], IO[bytes]], str | None]]:
        for raw in layer_paths:
            rel = str(raw)
            m = _BLOB.fullmatch(rel)
            yield rel, partial(bundle.open, rel), (f"sha256:{m.group(2)}" if m else None)

    return OpenedImage(info=info, layers=_verified_layers(entries()))


# --- OCI image layout -------------------------------------------------------------------------------------


def _host_arch() -> str:
    machine = host_platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def _platform_name(desc: dict[str, Any]) -> str:
    p = desc.get("platform") or {}
    name = f"{p.get('os', '?')}/{p.get('architecture', '?')}"
    return name + (f"/{p['variant']}" if p.get("variant") else "")


def choose_manifest(descriptors: list[dict[str, Any]], want: str | None, where: str) -> dict[str, Any]:
    """Pick one entry of an image index: ``want`` ("os/arch[/variant]"), else the host's arch, else the first.

    An entry without a platform (the top of a layout whose image is itself an index) fits any platform;
    attestation entries (platform unknown/unknown) are never images.
    """
    real = [d for d in descriptors if (d.get("platform") or {}).get("architecture") != "unknown"]
    if not real:
        raise ImageError(f"{where}: the image index lists no image manifest")
    if want:
        for d in real:
            plat = d.get("platform")
            name = _platform_name(d)
            if not plat or name == want or (name.rsplit("/", 1)[0] == want and plat.get("variant")):
                return d
        raise ImageError(
            f"{where}: no image for platform {want}; found {', '.join(_platform_name(d) for d in real)}",
            hint="pass one of those to --platform",
        )
    for d in real:
        if (d.get("platform") or {}).get("architecture") == _host_arch():
            return d
    return real[0]


def _oci_layout(bundle: _Bundle, want_platform: str | None) -> OpenedImage:
    index = _read_json(bundle, "index.json")
    descriptors = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(descriptors, list) or not descriptors:
        raise ImageError(f"{bundle.name}: index.json lists no manifests")
    top = choose_manifest(descriptors, want_platform, f"{bundle.name}: index.json")
    annotations = top.get("annotations") or {}
    reference = str(
        annotations.get("io.containerd.image.name") or annotations.get("org.opencontainers.image.ref.name")
        or bundle.name
    )
    desc = top
    for _ in range(4):  # nested indexes (a multi-platform image saved under one tag)
        doc = _read_blob_json(bundle, desc.get("digest", ""), f"{bundle.name}: descriptor")
        if desc.get("mediaType") in _INDEX_TYPES or "manifests" in doc:
            desc = choose_manifest(doc.get("manifests") or [], want_platform, f"{bundle.name}: {desc['digest']}")
            continue
        break
    else:
        raise ImageError(f"{bundle.name}: image indexes nest too deeply")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise ImageError(f"{bundle.name}: manifest {desc['digest']} has no layers list")
    config = _read_blob_json(bundle, (doc.get("config") or {}).get("digest", ""), f"{bundle.name}: config")
    info = ImageInfo(
        reference=reference,
        digest=str(desc["digest"]),
        kind="oci-layout",
        platform=f"{config.get('os', '?')}/{config.get('architecture', '?')}",
    )

    def entries() -> Iterator[tuple[str, Callable[[], IO[bytes]], str | None]]:
        for layer in layers:
            digest = str(layer.get("digest", "")) if isinstance(layer, dict) else repr(layer)
            rel = _blob_path(digest, f"{bundle.name}: layer")
            yield digest[:19], partial(bundle.open, rel), digest

    return OpenedImage(info=info, layers=_verified_layers(entries()))


# --- dispatch ---------------------------------------------------------------------------------------------


def _looks_like_path(image: str) -> bool:
    return (
        image.startswith((".", "/", "~"))
        or image.endswith((".tar", ".tar.gz", ".tgz", ".oci"))
        or (os.sep == "\\" and ("\\" in image or re.match(r"^[A-Za-z]:", image) is not None))
    )


def _opened(bundle: _Bundle, platform: str | None) -> OpenedImage:
    """The image's documents read; any of them of another shape than docker-save's or OCI's (a list where an
    object belongs, a number for a digest) is an ImageError naming the archive, never a traceback."""
    try:
        return _docker_save(bundle) if bundle.has("manifest.json") else _oci_layout(bundle, platform)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise ImageError(f"{bundle.name}: the image's documents do not have the docker-save or OCI layout shape "
                         f"({type(exc).__name__}: {str(exc)[:200]})",
                         hint="the archive is damaged or was altered: save the image again") from None


@contextmanager
def open_image(
    image: str, *, platform: str | None = None, docker_factory: DockerFactory | None = None
) -> Iterator[OpenedImage]:
    """Open ``image`` (a folder, a tarball, or an engine reference) for reading its layers."""
    with ExitStack() as stack:
        path = Path(image).expanduser()
        bundle: _Bundle
        if path.is_dir():
            bundle = _DirBundle(path)
        elif path.is_file():
            bundle = _TarBundle(path, stack)
        elif os.path.lexists(path):  # a FIFO or a device: never opened (a FIFO would block)
            raise ImageError(f"image '{image}' is neither a folder nor a regular file (a FIFO, a device or a link "
                             "to nothing)", hint="pass a `docker save` tarball or an OCI layout folder or tarball")
        elif _looks_like_path(image):
            raise ImageError(
                f"image '{image}' does not exist",
                hint="pass an existing `docker save` tarball or OCI layout, or an image reference for Docker",
            )
        else:
            yield open_engine_image(image, docker_factory, stack, platform=platform)
            return
        if bundle.has("manifest.json") or bundle.has("index.json"):
            yield _opened(bundle, platform)
        else:
            raise ImageError(
                f"{bundle.name} is neither a `docker save` archive (manifest.json) nor an OCI layout (index.json)",
                hint="create one with `docker save IMAGE -o image.tar` or `skopeo copy docker://IMAGE oci:DIR`",
            )
