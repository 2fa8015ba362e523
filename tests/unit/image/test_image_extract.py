"""From an image to a series: noise filtered, patch rendered by git, folder written atomically and loadable."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tests.unit.image.imagebuild import Entry, f, files_under, layer_tar, oci_layout, sym

from g4build.errors import ConfigError, ImageError, UsageError
from g4build.image import default_series_name, extract_series, resolve_output
from g4build.image.diff import is_noise, selects_package_file, series_metadata, write_series_folder
from g4build.pins.model import load_pins
from g4build.series.model import load_series

SP = "usr/local/lib/python3.12/dist-packages"
PIN = load_pins().get("vllm-0.21.0")
PRISTINE = {
    "vllm/__init__.py": "from vllm.a import run\n",
    "vllm/a.py": "def run():\n    return 1\n\n\ndef other():\n    return 2\n",
    "vllm/sub/c.py": "C = 3\n",
    "vllm/_version.py": "__version__ = '0.21.0'\n",
    "vllm/only_in_pin.py": "X = 1\n",
}


def _tree(tmp: Path) -> Path:
    tree = tmp / "pin-tree"
    for rel, text in PRISTINE.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return tree


A_IMAGE = "def run():\n    return 42\n\n\ndef other():\n    return 2\n"


def _image(tmp: Path, *, version: str = "0.21.0", a_py: str = A_IMAGE, extra: list[Entry] | None = None) -> Path:
    base = [
        f(f"{SP}/vllm/__init__.py", PRISTINE["vllm/__init__.py"]), f(f"{SP}/vllm/a.py", PRISTINE["vllm/a.py"]),
        f(f"{SP}/vllm/sub/c.py", PRISTINE["vllm/sub/c.py"]), f("usr/bin/python3", b"\x7fELF"),
    ]
    patched = [
        f(f"{SP}/vllm/a.py", a_py),
        f(f"{SP}/vllm/new_module.py", "NEW = True\n"),
        f(f"{SP}/vllm/_version.py", "__version__ = '0.21.0+image'\n"),
        f(f"{SP}/vllm/__pycache__/a.cpython-312.pyc", b"\x00bytecode"),
        f(f"{SP}/vllm/_C.abi3.so", b"\x7fELF"),
        f(f"{SP}/vllm/third_party/triton_kernels/k.py", "K = 1\n"),
        f(f"{SP}/vllm-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"),
        sym(f"{SP}/vllm/host_secret.py", "/etc/shadow"),
        *(extra or []),
    ]
    layout = tmp / "image"
    oci_layout(layout, [layer_tar(base), layer_tar(patched)], ref="example.org/spark/vllm-gemma4:25.11")
    return layout


def test_extract_writes_a_loadable_series_whose_patch_recreates_the_image_files(tmp_path: Path) -> None:
    tree, image = _tree(tmp_path), _image(tmp_path)
    out = tmp_path / "patches" / "spark-gemma4"
    work = tmp_path / "work"
    work.mkdir()
    result = extract_series(image=str(image), pin=PIN, tree=tree, out=out, workdir=work)

    assert result.folder == out and result.series == "spark-gemma4"
    assert result.changes.modified == ("vllm/a.py",) and result.changes.added == ("vllm/new_module.py",)
    assert result.changes.missing == ("vllm/only_in_pin.py",)
    assert result.package_path == f"/{SP}/vllm" and result.image_vllm_version == "0.21.0"
    assert result.warnings == ()
    assert files_under(work) == set(), "the unpacked image was not cleaned up"
    assert sorted(files_under(out.parent)) == ["spark-gemma4", "spark-gemma4/series.yaml", "spark-gemma4/vllm-0.21.0",
                                               "spark-gemma4/vllm-0.21.0/0001-python-changes-from-image.patch"]

    series = load_series(out)
    assert series.python_only and series.version == 1 and series.forwarded == "no" and series.refs == ()
    assert series.origin == f"example.org/spark/vllm-gemma4:25.11@{result.image.digest}"
    (patch,) = series.patches_for("vllm-0.21.0")
    text = patch.path.read_text()
    assert "diff --git a/vllm/a.py b/vllm/a.py" in text and "+++ b/vllm/new_module.py" in text
    for noise in ("_version", "pycache", "_C.abi3", "triton_kernels", "only_in_pin", "host_secret"):
        assert noise not in text, noise

    applied = tmp_path / "applied"
    shutil.copytree(tree, applied)
    subprocess.run(["git", "apply", str(patch.path)], cwd=applied, check=True)
    assert (applied / "vllm/a.py").read_text().endswith("return 42\n\n\ndef other():\n    return 2\n")
    assert (applied / "vllm/new_module.py").read_text() == "NEW = True\n"
    assert (applied / "vllm/only_in_pin.py").is_file()


def test_no_changes_at_all(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "vllm/new_module.py").write_text("NEW = True\n")
    image = _image(tmp_path, a_py=PRISTINE["vllm/a.py"])
    out = tmp_path / "patches" / "same"
    result = extract_series(image=str(image), pin=PIN, tree=tree, out=out)
    assert result.folder is None and result.changes.empty and not out.parent.exists()


def test_a_version_mismatch_is_a_warning_and_an_existing_folder_is_refused(tmp_path: Path) -> None:
    tree, image = _tree(tmp_path), _image(tmp_path, version="0.22.0.dev3+g1234abc")
    out = tmp_path / "patches" / "newer"
    result = extract_series(image=str(image), pin=PIN, tree=tree, out=out)
    assert any("vLLM 0.22.0.dev3+g1234abc but the pin is 0.21.0" in w for w in result.warnings)
    before = (out / "series.yaml").read_bytes()
    with pytest.raises(ImageError, match="already exists"):
        extract_series(image=str(image), pin=PIN, tree=tree, out=out)
    assert (out / "series.yaml").read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["newer"], "a temporary folder was left behind"


def test_two_vllm_packages_need_package_dir(tmp_path: Path) -> None:
    other = "opt/venv/lib/python3.12/site-packages/vllm"
    tree = _tree(tmp_path)
    image = _image(tmp_path, extra=[f(f"{other}/__init__.py", PRISTINE["vllm/__init__.py"]),
                                    f(f"{other}/a.py", "changed = True\n")])
    with pytest.raises(ImageError, match="has 2 vllm packages") as err:
        extract_series(image=str(image), pin=PIN, tree=tree, out=tmp_path / "s" / "x")
    assert "--package-dir" in (err.value.hint or "")
    result = extract_series(image=str(image), pin=PIN, tree=tree, out=tmp_path / "s" / "x", package_dir=f"/{other}")
    assert result.package_path == f"/{other}" and result.changes.modified == ("vllm/a.py",)
    assert result.changes.missing == ("vllm/only_in_pin.py", "vllm/sub/c.py")


def test_an_image_without_vllm(tmp_path: Path) -> None:
    layout = tmp_path / "image"
    oci_layout(layout, [layer_tar([f("usr/bin/python3", "x")])])
    with pytest.raises(ImageError, match="no installed vllm package"):
        extract_series(image=str(layout), pin=PIN, tree=_tree(tmp_path), out=tmp_path / "s" / "x")


def test_names_and_rules() -> None:
    assert default_series_name("nvcr.io/nvidia/vllm:25.11-py3") == "image-vllm-25-11-py3"
    assert default_series_name("ghcr.io/x/spark-vllm@sha256:" + "a" * 64) == "image-spark-vllm"
    assert resolve_output("r:1", "mine", None)[0] == "mine"
    with pytest.raises(UsageError, match="disagree"):
        resolve_output("r:1", "mine", Path("patches/theirs"))
    with pytest.raises(UsageError, match="not usable"):
        resolve_output("r:1", "Bad Name", None)
    assert is_noise("vllm/__pycache__/x.py") and is_noise("vllm/_version.py") and is_noise("vllm/x.so")
    assert is_noise("vllm/vllm_flash_attn/cute/interface.py") and not is_noise("vllm/vllm_flash_attn/__init__.py")
    assert not is_noise("vllm/v1/spec_decode/dflash.py")
    assert selects_package_file("usr/lib/python3/dist-packages/vllm/x.py")
    assert selects_package_file("venv/lib/site-packages/vllm-0.21.0.dist-info/METADATA")
    assert not selects_package_file("usr/lib/python3/dist-packages/vllm_other/x.py")
    assert not selects_package_file("workspace/vllm/x.py")
    assert selects_package_file("workspace/vllm/x.py", "/workspace/vllm")


def test_links_in_the_image_never_lead_into_the_host(tmp_path: Path) -> None:
    host = tmp_path / "host" / "vllm"
    host.mkdir(parents=True)
    (host / "__init__.py").write_text("HOST SECRET\n")
    layout = tmp_path / "image"
    oci_layout(layout, [layer_tar([sym(f"{SP}/vllm", str(host)),
                                   sym(f"{SP}/vllm-0.21.0.dist-info", str(tmp_path / "host"))])])
    with pytest.raises(ImageError, match="no installed vllm package"):
        extract_series(image=str(layout), pin=PIN, tree=_tree(tmp_path), out=tmp_path / "s" / "x")
    other = tmp_path / "image2"
    oci_layout(other, [layer_tar([sym("pkg", str(host))])])
    with pytest.raises(ImageError, match="no Python package at /pkg"):  # read inside the image: nothing there
        extract_series(image=str(other), pin=PIN, tree=_tree(tmp_path), out=tmp_path / "s" / "y", package_dir="/pkg")


def test_a_series_folder_that_would_not_load_is_not_written(tmp_path: Path) -> None:
    meta = series_metadata(name="not-the-folder", pin="vllm-0.21.0", origin="image x@sha256:0", patches=[],
                           note="", title="t", why="w")
    with pytest.raises(ConfigError, match="expected 'from-image' \\(the folder's name\\), found 'not-the-folder'"):
        write_series_folder(tmp_path / "series" / "from-image", meta, {}, [])
    assert files_under(tmp_path / "series") == set()
    meta["name"] = "from-image"
    written = write_series_folder(tmp_path / "series" / "from-image", meta, {}, [])
    assert load_series(written).name == "from-image" and files_under(tmp_path / "series") == {
        "from-image", "from-image/series.yaml"}
