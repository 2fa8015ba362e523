"""`g4build patches port`: carry a series' patches from one pin to another pin's source tree.

Each patch of the ``from`` variant is tried, in order and stacked, on the ``to`` tree with zero fuzz (as
``patches check`` does). A patch that applies (offsets allowed) is written again as the diff it makes on the new
tree, so the new variant applies exactly; one the tree already carries is dropped; one that conflicts stops
that series: nothing of it is written and the report says which file, hunk and line. Fingerprints of the old
variant are kept where the ported files still hold them; the others are reported.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g4build import gittree
from g4build.errors import ConfigError, UsageError
from g4build.patch_refresh import NewPatch, refresh, write_atomic
from g4build.patchfile import parse_patch, touched_paths
from g4build.patching import PatchResult, Scratch
from g4build.pins import PinSet
from g4build.pins_add import scalar
from g4build.series import Series, load_series

_ENV = {"GIT_AUTHOR_NAME": "g4build", "GIT_AUTHOR_EMAIL": "g4build@localhost",
        "GIT_COMMITTER_NAME": "g4build", "GIT_COMMITTER_EMAIL": "g4build@localhost"}


@dataclass(frozen=True, kw_only=True)
class SeriesPort:
    series: str
    from_pin: str
    to_pin: str
    results: tuple[PatchResult, ...]
    patches: tuple[NewPatch, ...] = ()  # the new variant (empty when every patch is upstream)
    fingerprints: dict[str, tuple[str, ...]] = field(default_factory=dict)
    lost_fingerprints: dict[str, tuple[str, ...]] = field(default_factory=dict)
    written: bool = False

    @property
    def ok(self) -> bool:
        return all(r.status != "conflict" for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": self.series, "from": self.from_pin, "to": self.to_pin, "ok": self.ok, "written": self.written,
            "patches": [{"file": r.file, "status": r.status, "detail": r.detail} for r in self.results],
            "new_files": [p.file for p in self.patches],
            "fingerprints": {k: list(v) for k, v in self.fingerprints.items()},
            "lost_fingerprints": {k: list(v) for k, v in self.lost_fingerprints.items()},
        }


def from_pin_for(series: Series, to: str, pinset: PinSet) -> str:
    """The pin to port from: the highest pin not above ``to``'s version that the series has a variant for."""
    target = pinset.get(to).parsed_version
    have = [pinset.get(n) for n in series.pins if n in pinset.pins and n != to]
    below = sorted((p for p in have if p.parsed_version <= target), key=lambda p: p.parsed_version)
    if not below:
        raise UsageError(f"series {series.name} has no variant of a pin at or below {to} to port from "
                         f"(it has: {', '.join(series.pins) or 'none'})", hint="pass --from PIN")
    return below[-1].name


def _git(scratch: Scratch, *args: str, stdin: bytes | None = None) -> bytes:
    return gittree.run_git(list(args), cwd=scratch.folder, env={**scratch.env, **_ENV}, stdin=stdin).stdout


def port(stack: Sequence[Series], chosen: Sequence[str], *, to: str, from_pins: dict[str, str], tree: Path,
         dry_run: bool, at_commit: str | None = None) -> list[SeriesPort]:
    """Port the ``chosen`` series (names, in stack order) onto ``tree``, the source of pin ``to``.

    ``at_commit``: take the files as that commit of the (git) tree has them. Earlier series of the stack that are
    not being ported are laid down first with their own ``to`` variant, so each port sees the files as
    ``patches apply`` will. A series whose port conflicts is not written; the series after it are not tried (they
    would be ported onto files that lack it).
    """
    names = [s.name for s in stack]
    last = max(names.index(c) for c in chosen)
    layers: list[tuple[Series, str]] = []
    for s in stack[: last + 1]:
        if s.name in chosen:
            if s.variant(to) is not None:
                raise UsageError(f"series {s.name} already has a variant for {to}",
                                 hint=f"change it with `g4build patches refresh {s.name} --pin {to} --tree …`")
            layers.append((s, from_pins[s.name]))
        elif s.variant(to) is not None:
            layers.append((s, to))
    paths: set[str] = set()
    for s, pin in layers:
        for p in s.patches_for(pin):
            paths |= touched_paths(parse_patch(p.read_bytes(), where=str(p.path)))
        variant = s.variant(pin)
        paths |= set(variant.fingerprints if variant else ())
    out: list[SeriesPort] = []
    with tempfile.TemporaryDirectory(prefix="g4build-port-") as tmp:
        scratch = Scratch.of(tree, Path(tmp) / "tree", paths, at_commit)
        _git(scratch, "init", "-q")
        _git(scratch, "add", "-A", "-f")
        _git(scratch, "commit", "-q", "--allow-empty", "--no-gpg-sign", "--no-verify", "-m", "pristine")
        for s, pin in layers:
            ported = s.name in chosen
            results: list[PatchResult] = []
            new: list[NewPatch] = []
            for p in s.patches_for(pin):
                r = scratch.check(p, None)
                results.append(r)
                if r.status == "conflict":
                    break
                if r.status == "applies":
                    _git(scratch, "add", "-A", "-f")
                    data = _git(scratch, *gittree.diff_args(), "--cached", "HEAD", "--")
                    _git(scratch, "commit", "-q", "--no-gpg-sign", "--no-verify", "-m", p.subject)
                    new.append(NewPatch(file=f"{to}/{p.file.rsplit('/', 1)[-1]}", subject=p.subject, data=data))
            if not ported:
                if any(r.status == "conflict" for r in results):
                    raise UsageError(f"series {s.name}'s own {to} variant does not apply on the tree",
                                     hint=f"run `g4build patches check --pin {to}` and fix it first")
                continue
            result = SeriesPort(series=s.name, from_pin=pin, to_pin=to, results=tuple(results), patches=tuple(new))
            if result.ok:  # a stopped port's files are half-way: no fingerprint verdict on them
                kept, lost = _fingerprints(s, pin, scratch.folder)
                result = SeriesPort(**{**result.__dict__, "fingerprints": kept, "lost_fingerprints": lost})
            if result.ok and not dry_run:
                _write(s, result)
                result = SeriesPort(**{**result.__dict__, "written": True})
            out.append(result)
            if not result.ok:
                break
    return out


def _fingerprints(series: Series, pin: str, folder: Path) -> tuple[dict[str, tuple[str, ...]],
                                                                       dict[str, tuple[str, ...]]]:
    variant = series.variant(pin)
    kept: dict[str, tuple[str, ...]] = {}
    lost: dict[str, tuple[str, ...]] = {}
    for rel, texts in (variant.fingerprints if variant else {}).items():
        path = folder / rel
        body = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        have = tuple(t for t in texts if t in body)
        gone = tuple(t for t in texts if t not in body)
        if have:
            kept[rel] = have
        if gone:
            lost[rel] = gone
    return kept, lost


def _write(series: Series, port_: SeriesPort) -> None:
    meta = series.folder / "series.yaml"
    before = meta.read_bytes()
    try:
        refresh(series, port_.to_pin, list(port_.patches))
        note = (f"Ported from {port_.from_pin} by `g4build patches port`: "
                f"{sum(r.status == 'applies' for r in port_.results)} patch(es) applied, "
                f"{sum(r.status == 'upstream' for r in port_.results)} already upstream. Review before release.")
        edited = _set_extras(meta.read_bytes().decode("utf-8"), port_.to_pin, port_.fingerprints, note)
        write_atomic(meta, edited.encode())
        loaded = load_series(series.folder).variant(port_.to_pin)
        if loaded is None or loaded.fingerprints != port_.fingerprints or loaded.note != note:
            raise ConfigError(f"{meta}: the ported variant {port_.to_pin} does not read back as written; "
                              "nothing was kept", hint="report this; port by hand meanwhile")
    except BaseException:
        # the variant is new, so every file of it is ours to take back
        write_atomic(meta, before)
        for p in port_.patches:
            (series.folder / p.file).unlink(missing_ok=True)
        folder = series.folder / port_.to_pin
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


def _set_extras(text: str, pin: str, fingerprints: dict[str, tuple[str, ...]], note: str) -> str:
    """Replace the new variant's empty ``fingerprints: {}`` and ``note: ""`` lines (as refresh writes them)."""
    lines = text.splitlines(keepends=True)
    key = next((n for n, line in enumerate(lines) if re.match(rf"^(\s+){re.escape(pin)}:\s*$", line)), None)
    if key is None:
        raise ConfigError(f"series.yaml: no block for {pin} after writing its patches",
                          hint="report this; add fingerprints and a note by hand")
    pad = re.match(r"^(\s*)", lines[key]).group(1) + "  "  # type: ignore[union-attr]
    for n in range(key + 1, len(lines)):
        line = lines[n]
        if line.strip() and not line.startswith(pad):
            break
        if line == f"{pad}fingerprints: {{}}\n" and fingerprints:
            block = [f"{pad}fingerprints:\n"]
            for rel, texts in fingerprints.items():
                block.append(f"{pad}  {scalar(rel)}:\n")
                block += [f"{pad}    - {json.dumps(t, ensure_ascii=False)}\n" for t in texts]
            lines[n] = "".join(block)
        elif line == f'{pad}note: ""\n':
            lines[n] = f"{pad}note: {json.dumps(note, ensure_ascii=False)}\n"
    return "".join(lines)
