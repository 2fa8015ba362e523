"""The edge of the rules: gather what they need (pins, series, a wheel's manifest, checkpoints, transformers)."""

from __future__ import annotations

import importlib
import zipfile
from pathlib import Path

from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from g4build.errors import UsageError
from g4build.pins.model import load_pins
from g4build.recipes.checkpoint import CheckpointInfo, read_checkpoint
from g4build.recipes.env_policy import load_env_policy
from g4build.recipes.flashinfer import wheel_flashinfer
from g4build.recipes.gpu_guard import recorded_archs
from g4build.recipes.model import Recipe
from g4build.recipes.renamed_env import load_renamed
from g4build.recipes.rules import CheckContext, WheelInfo
from g4build.recipes.vllm_args import pinned_table
from g4build.recipes.vllm_envs import pinned_envs
from g4build.series.model import load_all
from g4build.wheelfile.manifestfile import MANIFEST_NAME, MAX_BYTES, loads


def _small(archive: zipfile.ZipFile, name: str) -> bytes:
    """A metadata member, read no further than ``MAX_BYTES`` whatever its directory entry claims."""
    with archive.open(name) as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise UsageError(f"{name}: over {MAX_BYTES} bytes; expected a small metadata file",
                         hint="the wheel is not one a build wrote: rebuild it")
    return data


def _wheel_name(filename: str) -> tuple[NormalizedName, Version]:
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise UsageError(f"--wheel {filename}: expected a wheel file name (name-version-python-abi-platform.whl), "
                         f"found {filename!r}", hint="pass the .whl file as pip or g4build wrote it") from exc
    return name, version


def _own_dist_info(names: set[str], project: NormalizedName, version: Version, filename: str) -> str | None:
    """The wheel's own ``<name>-<version>.dist-info`` folder, at the top and matching its file name (None: it has
    none, so no manifest; pip refuses it at install). A manifest in any other folder (nested, or a vendored
    package's) describes something else; two folders that both match leave it unknown which one pip reads."""
    found = set()
    for top in {n.split("/", 1)[0] for n in names if "/" in n}:
        if not top.endswith(".dist-info"):
            continue
        dist_name, _, dist_version = top[: -len(".dist-info")].partition("-")
        if canonicalize_name(dist_name) != project:
            continue
        try:
            if Version(dist_version) == version:
                found.add(top)
        except InvalidVersion:
            continue
    if len(found) > 1:
        raise UsageError(f"--wheel {filename}: expected one {project}-{version}.dist-info folder at the top of the "
                         f"wheel, found {len(found)} ({', '.join(sorted(found))})",
                         hint="pass a wheel as pip or g4build wrote it; `g4build validate WHEEL` says what is wrong")
    return found.pop() if found else None


def read_wheel_info(wheel: Path) -> WheelInfo:
    """The series a wheel carries, from its own dist-info's ``build-manifest.json`` (none for a stock wheel), and
    whether installing it brings FlashInfer (the manifest's record of FlashInfer wheels, else its METADATA)."""
    if not wheel.is_file():
        raise UsageError(f"{wheel}: expected a wheel file, found none", hint="pass the path of a built .whl")
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            dist = _own_dist_info(names, *_wheel_name(wheel.name), wheel.name)
            manifest, meta = f"{dist}/{MANIFEST_NAME}", f"{dist}/METADATA"
            raw = _small(archive, manifest) if dist and manifest in names else None
            metadata = _small(archive, meta).decode("utf-8", errors="replace") if dist and meta in names else ""
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, ValueError) as exc:
        raise UsageError(f"{wheel}: not a wheel (not a zip archive)") from exc
    data = loads(raw, str(wheel)) if raw is not None else None
    flashinfer = wheel_flashinfer(wheel.name, metadata, data)
    if data is None:
        return WheelInfo(file=wheel.name, pin=None, series={}, flashinfer=flashinfer)
    pin = data.get("pin")
    target = data.get("target")
    arch = target.get("arch") if isinstance(target, dict) else None
    route = data.get("route")
    series = {str(s["name"]): int(s.get("version", 0)) for s in data["series"] if isinstance(s, dict) and "name" in s}
    return WheelInfo(file=wheel.name, pin=str(pin["name"]) if isinstance(pin, dict) else None, series=series,
                     flashinfer=flashinfer, route=route if isinstance(route, str) else None,
                     arch=arch if isinstance(arch, str) else None, kernel_arch_list=recorded_archs(data))


def transformers_model_types() -> frozenset[str] | None:
    """Model types the importable transformers knows (None when there is none)."""
    try:
        auto = importlib.import_module("transformers.models.auto.configuration_auto")
    except Exception:  # not installed, or broken: either way we cannot ask it
        return None
    names = getattr(auto, "CONFIG_MAPPING_NAMES", None)
    return frozenset(names) if names is not None else None


def drafter_dir(recipe: Recipe, given: Path | None) -> Path | None:
    """``--draft-dir``, else the recipe's speculative model when it is a local checkpoint folder."""
    if given is not None:
        return given
    model = (recipe.speculative or {}).get("model")
    if isinstance(model, str) and model and (Path(model) / "config.json").is_file():
        return Path(model)
    return None


def gather_context(
    recipe: Recipe,
    *,
    model_dir: Path | None = None,
    draft_dir: Path | None = None,
    wheel: Path | None = None,
    ask_transformers: bool = True,
    allow_env: frozenset[str] = frozenset(),
) -> CheckContext:
    """What the rules need; ``allow_env``: the names the command line allowed (``--allow-env``)."""
    pins = load_pins()
    wheel_info = read_wheel_info(wheel) if wheel is not None else None
    pin_name = recipe.pin or (wheel_info.pin if wheel_info else None)
    pin = pins.pins.get(pin_name) if pin_name else None
    target: CheckpointInfo | None = read_checkpoint(model_dir) if model_dir is not None else None
    draft = drafter_dir(recipe, draft_dir)
    drafter = read_checkpoint(draft) if draft is not None else None
    asked = ask_transformers and recipe.method == "mtp"
    types = transformers_model_types() if asked else None
    table = pinned_table(pin) if pin is not None else None
    return CheckContext(
        pin=pin,
        known_pins=tuple(pins.pins),
        series=tuple(load_all()),
        target=target,
        drafter=drafter,
        wheel=wheel_info,
        transformers_model_types=types,
        transformers_asked=asked,
        vllm_envs=pinned_envs(pin) if pin is not None else None,
        vllm_options=frozenset(table["args"]) if table is not None and isinstance(table.get("args"), dict) else None,
        renamed_env=load_renamed(),
        env_policy=load_env_policy(known_pins=tuple(pins.pins)),
        allowed_env=allow_env,
    )
