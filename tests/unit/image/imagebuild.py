"""Build real image archives in tests: layer tars, OCI image layouts (folder or tarball), `docker save` tarballs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Entry:
    name: str
    kind: str = "file"  # file, dir, symlink, hardlink, fifo, chr
    data: bytes = b""
    target: str = ""
    mode: int = 0o644


def f(name: str, data: bytes | str = b"") -> Entry:
    return Entry(name=name, data=data.encode() if isinstance(data, str) else data)


def d(name: str) -> Entry:
    return Entry(name=name, kind="dir", mode=0o755)


def sym(name: str, target: str) -> Entry:
    return Entry(name=name, kind="symlink", target=target)


def hard(name: str, target: str) -> Entry:
    return Entry(name=name, kind="hardlink", target=target)


def layer_tar(entries: list[Entry]) -> bytes:
    """An uncompressed layer tar holding ``entries`` in order (names exactly as given)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mode = e.mode
            info.mtime = 1_700_000_000
            if e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE,
            }[e.kind]
            info.linkname = e.target
            if e.kind == "chr":
                info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_blob(blobs: Path, data: bytes) -> dict[str, Any]:
    digest = _sha(data)
    (blobs / digest.split(":")[1]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def _config(layers: list[bytes], arch: str) -> bytes:
    return json.dumps({
        "architecture": arch, "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [_sha(x) for x in layers]},
    }).encode()


def oci_layout(
    dest: Path, layers: list[bytes], *, ref: str = "example.org/team/vllm-gemma4:1.0", gzip_layers: bool = True,
    archs: tuple[str, ...] = ("amd64",), attestation: bool = False,
) -> str:
    """Write an OCI image layout folder; return the digest of the image manifest (the host-arch one if several)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
    descs = []
    for arch in archs:
        layer_descs = []
        for raw in layers:
            blob = gzip.compress(raw, mtime=0) if gzip_layers else raw
            layer_descs.append({"mediaType": media, **_put_blob(blobs, blob)})
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       **_put_blob(blobs, _config(layers, arch))},
            "layers": layer_descs,
        }).encode()
        descs.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **_put_blob(blobs, manifest),
                      "platform": {"architecture": arch, "os": "linux"}})
    if attestation:
        att = json.dumps({"schemaVersion": 2, "config": {**_put_blob(blobs, b"{}")}, "layers": []}).encode()
        descs.insert(0, {"mediaType": "application/vnd.oci.image.manifest.v1+json", **_put_blob(blobs, att),
                         "platform": {"architecture": "unknown", "os": "unknown"}})
    annotations = {"org.opencontainers.image.ref.name": ref}
    if len(descs) == 1:
        top = {**descs[0], "annotations": annotations}
    else:
        index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                            "manifests": descs}).encode()
        top = {"mediaType": "application/vnd.oci.image.index.v1+json", **_put_blob(blobs, index),
               "annotations": annotations}
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    real = [x for x in descs if x["platform"]["architecture"] != "unknown"]
    return str(real[0]["digest"])


def tar_folder(folder: Path, dest: Path, *, compress: bool = False) -> Path:
    """Pack a folder's contents (names relative to it) into a tarball, as `docker save` / skopeo write them."""
    with tarfile.open(dest, "w:gz" if compress else "w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return dest


def docker_save(dest: Path, layers: list[bytes], *, tag: str = "example.org/team/vllm-gemma4:1.0",
                legacy: bool = True) -> str:
    """Write a `docker save` tarball; legacy: ``<id>/layer.tar`` + ``<hex>.json``; else ``blobs/sha256``.

    Returns the image ID (the config digest)."""
    work = dest.with_name(dest.name + ".d")
    work.mkdir()
    config = _config(layers, "amd64")
    config_hex = hashlib.sha256(config).hexdigest()
    paths = []
    if legacy:
        (work / f"{config_hex}.json").write_bytes(config)
        config_rel = f"{config_hex}.json"
        for i, raw in enumerate(layers):
            lid = hashlib.sha256(f"layer{i}".encode()).hexdigest()
            (work / lid).mkdir()
            (work / lid / "layer.tar").write_bytes(raw)
            paths.append(f"{lid}/layer.tar")
    else:
        blobs = work / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        config_rel = "blobs/sha256/" + _put_blob(blobs, config)["digest"].split(":")[1]
        for raw in layers:
            paths.append("blobs/sha256/" + _put_blob(blobs, raw)["digest"].split(":")[1])
    (work / "manifest.json").write_text(json.dumps([{"Config": config_rel, "RepoTags": [tag], "Layers": paths}]))
    tar_folder(work, dest)
    return "sha256:" + config_hex


def files_under(top: Path) -> set[str]:
    """Every entry (files, links, folders) under ``top`` as relative POSIX names: to find strays."""
    return {p.relative_to(top).as_posix() for p in top.rglob("*")}
