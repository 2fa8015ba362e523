"""Image sources: OCI layouts (folder, tarball, multi-platform), `docker save` tarballs, the Docker engine."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from tests.unit.image.imagebuild import d, docker_save, f, files_under, layer_tar, oci_layout, sym, tar_folder

from g4build.errors import ImageError, IntegrityError, UnsafeArchiveError
from g4build.image.layers import Limits, apply_layers
from g4build.image.sources import choose_manifest, open_image

LOWER = layer_tar([d("app/"), f("app/one.py", "1\n"), f("app/two.py", "2\n"), d("cfg/"), f("cfg/a", "a")])
UPPER = layer_tar([
    f("app/.wh.two.py"), f("cfg/.wh..wh..opq"), f("cfg/b", "b"), f("app/one.py", "1 changed\n"),
    sym("out", "../../.."), f("../evil", "x"), f("/abs-evil", "x"),
])


def _unpack(image: str, root: Path, **kw: Any) -> tuple[Any, Any]:
    with open_image(image, **kw) as opened:
        report = apply_layers(opened.layers, root)
        return opened.info, report


def _check_tree(root: Path) -> None:
    assert sorted(files_under(root)) == ["app", "app/one.py", "cfg", "cfg/b"]
    assert (root / "app" / "one.py").read_text() == "1 changed\n"


def test_oci_layout_folder(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    digest = oci_layout(layout, [LOWER, UPPER])
    info, report = _unpack(str(layout), tmp_path / "work" / "root")
    _check_tree(tmp_path / "work" / "root")
    assert files_under(tmp_path / "work") == {"root", *(f"root/{p}" for p in files_under(tmp_path / "work" / "root"))}
    assert (info.reference, info.digest, info.kind, info.platform) == (
        "example.org/team/vllm-gemma4:1.0", digest, "oci-layout", "linux/amd64")
    assert info.origin == f"example.org/team/vllm-gemma4:1.0@{digest}"
    assert {s.name for s in report.unsafe} == {"out", "../evil", "/abs-evil"}


@pytest.mark.parametrize("compress", [False, True])
def test_oci_layout_tarball_plain_layers(tmp_path: Path, compress: bool) -> None:
    layout = tmp_path / "layout"
    digest = oci_layout(layout, [LOWER, UPPER], gzip_layers=False)
    archive = tar_folder(layout, tmp_path / ("image.tar.gz" if compress else "image.tar"), compress=compress)
    info, _ = _unpack(str(archive), tmp_path / "root")
    _check_tree(tmp_path / "root")
    assert info.digest == digest


def test_multi_platform_index_picks_the_asked_platform_and_skips_attestations(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    oci_layout(layout, [LOWER, UPPER], archs=("arm64", "amd64"), attestation=True)
    info, _ = _unpack(str(layout), tmp_path / "root", platform="linux/arm64")
    assert info.platform == "linux/arm64"
    _check_tree(tmp_path / "root")
    with pytest.raises(ImageError, match=r"no image for platform linux/s390x; found linux/arm64, linux/amd64"):
        _unpack(str(layout), tmp_path / "root2", platform="linux/s390x")


def test_choose_manifest_prefers_the_host_arch_then_the_first() -> None:
    descs = [{"digest": "a", "platform": {"os": "linux", "architecture": "unknown"}},
             {"digest": "b", "platform": {"os": "linux", "architecture": "riscv64"}}]
    assert choose_manifest(descs, None, "x")["digest"] == "b"
    arm = {"digest": "c", "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}
    assert choose_manifest([*descs, arm], "linux/arm64", "x")["digest"] == "c"


def test_a_tampered_blob_fails_its_digest(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    oci_layout(layout, [LOWER, UPPER])
    manifest_digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads((layout / "blobs" / "sha256" / manifest_digest.split(":")[1]).read_text())
    blob = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]
    blob.write_bytes(gzip.compress(layer_tar([f("app/one.py", "evil\n")]), mtime=0))
    with pytest.raises(IntegrityError, match="expected digest"):
        _unpack(str(layout), tmp_path / "root")


def test_a_tampered_manifest_fails_its_digest(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    oci_layout(layout, [LOWER])
    manifest_digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    blob = layout / "blobs" / "sha256" / manifest_digest.split(":")[1]
    blob.write_text(blob.read_text().replace('"schemaVersion": 2', '"schemaVersion": 2 '))
    with pytest.raises(IntegrityError, match="does not match its digest"):
        _unpack(str(layout), tmp_path / "root")


@pytest.mark.parametrize("legacy", [True, False])
def test_docker_save_tarball(tmp_path: Path, legacy: bool) -> None:
    archive = tmp_path / "in" / "image.tar"
    archive.parent.mkdir()
    image_id = docker_save(archive, [LOWER, UPPER], legacy=legacy)
    info, report = _unpack(str(archive), tmp_path / "out" / "root")
    _check_tree(tmp_path / "out" / "root")
    assert (info.reference, info.digest, info.kind) == ("example.org/team/vllm-gemma4:1.0", image_id, "docker-save")
    assert report.layers == 2


@pytest.mark.parametrize("legacy", [True, False])
def test_a_docker_save_config_that_is_not_its_image_id_fails(tmp_path: Path, legacy: bool) -> None:
    archive = tmp_path / "image.tar"
    image_id = docker_save(archive, [LOWER], legacy=legacy)
    work = tmp_path / "image.tar.d"  # the folder docker_save packed
    (config,) = [p for p in work.rglob("*") if p.is_file() and p.name.startswith(image_id[7:])]
    config.write_text(config.read_text().replace('"amd64"', '"arm64"'))
    tar_folder(work, archive)
    with pytest.raises(IntegrityError, match=f"does not match its digest {image_id}"):
        _unpack(str(archive), tmp_path / "root")
    assert not (tmp_path / "root").exists() or files_under(tmp_path / "root") == set()


def test_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    with pytest.raises(ImageError, match="neither a `docker save` archive"):
        _unpack(str(tmp_path / "folder"), tmp_path / "root")
    with pytest.raises(ImageError, match="does not exist"):
        _unpack(str(tmp_path / "missing.tar"), tmp_path / "root")
    (tmp_path / "junk.tar").write_bytes(b"junk" * 300)
    with pytest.raises(ImageError, match="not a readable tar archive"):
        _unpack(str(tmp_path / "junk.tar"), tmp_path / "root")


# --- the Docker engine, through a recorder of the SDK calls g4build makes -------------------------------


class _Image:
    def __init__(self, ref: str) -> None:
        self.id = "sha256:" + "1" * 64
        self.attrs = {"RepoDigests": [f"{ref.split(':')[0]}@sha256:{'2' * 64}"], "Os": "linux",
                      "Architecture": "arm64"}


class _Container:
    def __init__(self, rec: DockerRecorder, image_id: str) -> None:
        self.rec, self.image_id = rec, image_id

    def export(self, chunk_size: int = 2 * 1024 * 1024) -> Iterator[bytes]:
        self.rec.calls.append(("export",))
        data = self.rec.export_tar
        return (data[i:i + 7000] for i in range(0, len(data), 7000))

    def remove(self, force: bool = False) -> None:
        self.rec.calls.append(("remove", self.image_id, force))


class DockerRecorder:
    """Implements the docker SDK surface g4build uses; records each call. Local images: ``local``."""

    def __init__(self, export_tar: bytes, local: set[str]) -> None:
        self.export_tar, self.local = export_tar, local
        self.calls: list[tuple[Any, ...]] = []
        self.images = self
        self.containers = self

    def ping(self) -> bool:
        self.calls.append(("ping",))
        return True

    def get(self, name: str) -> _Image:
        self.calls.append(("images.get", name))
        if name not in self.local:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return _Image(name)

    def pull(self, repository: str, tag: str | None = None, **kwargs: Any) -> _Image:
        self.calls.append(("images.pull", repository, kwargs))
        return _Image(repository)

    def create(self, image: str, command: Any = None, **kwargs: Any) -> _Container:
        self.calls.append(("containers.create", image, command, kwargs))
        return _Container(self, image)


FLAT = layer_tar([d("app/"), f("app/one.py", "1 changed\n"), d("cfg/"), f("cfg/b", "b")])


def test_engine_pulls_a_missing_image_exports_without_starting_and_removes(tmp_path: Path) -> None:
    rec = DockerRecorder(FLAT, local=set())
    info, report = _unpack("example.org/team/vllm-gemma4:1.0", tmp_path / "root", docker_factory=lambda: rec)
    _check_tree(tmp_path / "root")
    image_id = "sha256:" + "1" * 64
    assert rec.calls == [
        ("ping",), ("images.get", "example.org/team/vllm-gemma4:1.0"),
        ("images.pull", "example.org/team/vllm-gemma4:1.0", {}), ("containers.create", image_id, ["true"], {}),
        ("export",), ("remove", image_id, True),
    ]
    assert (info.kind, info.digest, info.platform) == ("docker-engine", "sha256:" + "2" * 64, "linux/arm64")
    assert report.layers == 1


def test_engine_pulls_the_asked_platform(tmp_path: Path) -> None:
    rec = DockerRecorder(FLAT, local=set())
    _unpack("example.org/team/vllm-gemma4:1.0", tmp_path / "root", docker_factory=lambda: rec, platform="linux/arm64")
    assert ("images.pull", "example.org/team/vllm-gemma4:1.0", {"platform": "linux/arm64"}) in rec.calls
    assert rec.calls[-1][0] == "remove"


def test_engine_uses_a_local_image_and_removes_the_container_when_unpacking_fails(tmp_path: Path) -> None:
    rec = DockerRecorder(FLAT, local={"local/vllm:dev"})
    with pytest.raises(UnsafeArchiveError), open_image("local/vllm:dev", docker_factory=lambda: rec) as opened:
        apply_layers(opened.layers, tmp_path / "root", limits=Limits(max_members=1))
    assert [c[0] for c in rec.calls] == ["ping", "images.get", "containers.create", "export", "remove"]


def test_no_engine_is_an_image_error_with_the_offline_routes() -> None:
    def unreachable() -> Any:
        raise docker.errors.DockerException("Error while fetching server API version: connection refused")

    with pytest.raises(ImageError, match="no Docker engine answers") as err, open_image(
        "example.org/x:1", docker_factory=unreachable
    ):
        pass
    assert "docker save" in (err.value.hint or "")


def test_the_real_sdk_without_an_engine_is_an_image_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such.sock'}")
    with pytest.raises(ImageError, match="no Docker engine answers"), open_image("example.org/x:1"):
        pass

