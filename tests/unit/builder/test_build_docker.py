"""The docker executor against a recorder of the docker SDK calls it makes (no engine exists here)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from g4build.builder.executors.docker import (
    OUT,
    TOOL,
    TOOL_COPY,
    WORK,
    DockerExecutor,
    HostPaths,
    container_layout,
    copy_tool,
    image_for,
    venv_lines,
)
from g4build.builder.plan import Options
from g4build.builder.planner import make_plan
from g4build.errors import BuildError
from g4build.pins.model import Pin

from .conftest import linux_layout, target


def _tar(files: dict[str, bytes]) -> list[bytes]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return [raw[:1000], raw[1000:]]  # the SDK streams chunks


class RecordedContainer:
    def __init__(self, calls: list[tuple[str, Any]], code: int, logs: list[bytes], archive: dict[str, bytes]):
        self.calls, self.code, self._logs, self.archive = calls, code, logs, archive

    def logs(self, *, stream: bool, follow: bool) -> list[bytes]:
        self.calls.append(("logs", {"stream": stream, "follow": follow}))
        return self._logs

    def wait(self) -> dict[str, int]:
        self.calls.append(("wait", None))
        return {"StatusCode": self.code}

    def get_archive(self, path: str) -> tuple[list[bytes], dict[str, Any]]:
        self.calls.append(("get_archive", path))
        return _tar(self.archive), {"name": "out"}

    def remove(self, *, force: bool) -> None:
        self.calls.append(("remove", force))


class RecordingClient:
    """Records the calls; the attribute names follow docker.DockerClient (images.pull, containers.run)."""

    def __init__(self, code: int = 0, logs: list[bytes] | None = None, archive: dict[str, bytes] | None = None):
        self.calls: list[tuple[str, Any]] = []
        self.container = RecordedContainer(self.calls, code, logs or [b"== vllm\n", b"== vllm: done in 5s\n"],
                                           archive or {})
        self.images = self
        self.containers = self

    def pull(self, image: str) -> None:
        self.calls.append(("pull", image))

    def run(self, image: str, **kwargs: Any) -> RecordedContainer:
        self.calls.append(("run", {"image": image, **kwargs}))
        return self.container


def _hosts(tmp: Path) -> HostPaths:
    return HostPaths(work=tmp / "work", deps=tmp / "deps", out=tmp / "out", tool=tmp / "g4build")


def _plan(pin: Pin):  # type: ignore[no-untyped-def]
    t = target("wsl", executor="docker")
    return make_plan(pin, [], t, layout=container_layout(), opts=Options(jobs=4))


def test_runs_the_plan_in_a_cuda_devel_image_and_copies_wheels_out(tmp_path: Path, pin21: Pin) -> None:
    plan = _plan(pin21)
    whl = b"PK fake wheel bytes"
    client = RecordingClient(archive={"out/vllm-0.21.0+cu130.g4.x-cp38-abi3-linux_x86_64.whl": whl,
                                      "out/build-manifest.json": b"{}", "out/notes.txt": b"skip me"})
    result = DockerExecutor(_hosts(tmp_path), client_factory=lambda: client,
                            console=Console(file=io.StringIO())).run(plan)
    names = [c[0] for c in client.calls]
    assert names == ["pull", "run", "logs", "wait", "get_archive", "remove"]
    assert client.calls[0][1] == image_for("13.0") == "nvidia/cuda:13.0.0-devel-ubuntu24.04"
    run = client.calls[1][1]
    assert run["detach"] is True and run["working_dir"] == WORK
    script = run["command"][-1]
    assert run["command"][:2] == ["bash", "-c"]
    assert f"pip install -q {TOOL_COPY} build" in script and f"pip install -q {TOOL} " not in script
    assert script.index(f"-C {TOOL} ") < script.index(f"pip install -q {TOOL_COPY}")
    assert "export TORCH_CUDA_ARCH_LIST=12.0f" in script
    assert "step vllm " in script
    vols = run["volumes"]
    assert vols[str(tmp_path / "work")] == {"bind": WORK, "mode": "rw"}
    # the output folder survives the container: a resumed run skips the wheel step and still finds its wheel
    assert vols[str(tmp_path / "work" / "out")] == {"bind": OUT, "mode": "rw"}
    assert vols[str(tmp_path / "g4build")]["mode"] == "ro"
    assert run["environment"] == {"G4BUILD_CLEAN": "0"}
    assert client.calls[4][1] == OUT
    assert (tmp_path / "out" / "vllm-0.21.0+cu130.g4.x-cp38-abi3-linux_x86_64.whl").read_bytes() == whl
    assert (tmp_path / "out" / "build-manifest.json").is_file() and not (tmp_path / "out" / "notes.txt").exists()
    assert "== vllm: done" in (tmp_path / "work" / "logs" / "docker.log").read_text()
    assert result.steps[0].status == "done"


def test_clean_is_passed_to_the_script(tmp_path: Path, pin21: Pin) -> None:
    client = RecordingClient()
    DockerExecutor(_hosts(tmp_path), client_factory=lambda: client, console=Console(file=io.StringIO())).run(
        _plan(pin21), clean=True)
    assert client.calls[1][1]["environment"] == {"G4BUILD_CLEAN": "1"}


def test_failure_reports_tail_and_still_removes_the_container(tmp_path: Path, pin21: Pin) -> None:
    client = RecordingClient(code=2, logs=[b"[10/99] nvcc ...\n", b"c++: fatal error: Killed signal\n"])
    with pytest.raises(BuildError) as err:
        DockerExecutor(_hosts(tmp_path), client_factory=lambda: client,
                       console=Console(file=io.StringIO())).run(_plan(pin21))
    assert "Killed signal" in err.value.message and "exit 2" in err.value.message
    assert [c[0] for c in client.calls][-1] == "remove"
    assert "get_archive" not in [c[0] for c in client.calls]


def test_plan_must_use_the_container_layout(tmp_path: Path, pin21: Pin) -> None:
    plan = make_plan(pin21, [], target("wsl", executor="docker"), layout=linux_layout(), opts=Options(jobs=2))
    with pytest.raises(BuildError, match="container layout"):
        DockerExecutor(_hosts(tmp_path), client_factory=RecordingClient).run(plan)


def test_the_real_sdk_has_the_attributes_the_recorder_mimics() -> None:
    docker = pytest.importorskip("docker")
    from docker.models.containers import Container, ContainerCollection
    from docker.models.images import ImageCollection

    assert hasattr(docker, "from_env")
    for cls, attrs in ((ContainerCollection, ["run"]), (ImageCollection, ["pull"]),
                       (Container, ["logs", "wait", "get_archive", "remove"])):
        for attr in attrs:
            assert callable(getattr(cls, attr)), (cls, attr)


def test_the_tool_is_installed_from_a_writable_copy(tmp_path: Path) -> None:
    # the read-only mount cannot take setuptools' build/ and *.egg-info: the copy lines run for real here
    src, dst = tmp_path / "ro tool", tmp_path / "copy"
    (src / "toolkit" / "g4build").mkdir(parents=True)
    (src / "toolkit" / "g4build" / "__init__.py").write_text("x = 1\n")
    (src / "toolkit" / "g4build" / "build").mkdir()  # a package folder named build is no build output
    (src / "toolkit" / "g4build" / "build" / "plan.py").write_text("y = 2\n")
    (src / "pyproject.toml").write_text("[project]\nname = 'g4build'\n")
    for junk in (".git/HEAD", "build/lib/x.py", "toolkit/g4build.egg-info/PKG-INFO"):
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("junk\n")
    (dst / "stale.txt").parent.mkdir(parents=True)
    (dst / "stale.txt").write_text("from an earlier run\n")
    script = "set -euo pipefail\n" + "\n".join(copy_tool(str(src), str(dst))) + "\n"
    subprocess.run(["bash", "-c", script], check=True)
    got = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file())
    assert got == ["pyproject.toml", "toolkit/g4build/__init__.py", "toolkit/g4build/build/plan.py"]


def test_a_python_the_image_lacks_stops_with_what_it_has(tmp_path: Path) -> None:
    # the venv lines run for real: a Python this machine lacks stands for one the image lacks
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(venv_lines("3.99")) + "\n"],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 2
    assert "error: the image has no python3.99: expected it for --python 3.99, found Python 3." in proc.stderr
    assert not (tmp_path / "g4b").exists()
