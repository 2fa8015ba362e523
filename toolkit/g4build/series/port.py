"""`g4build patches port`: carry a series' patches from one pin to another pin's source tree.

Each patch of the ``from`` variant is tried, in order and stacked, on the ``to`` tree with zero fuzz (as
``patches check`` does). Where it does not apply, each file it touches is merged three ways with git (base: the
``from`` pin's own file as the stack has it before the patch, read from that pin's sha256-checked sdist; ours: the
``to`` tree's file with the patches ported before; theirs: the ``from`` file with the patch applied). A patch that
applies or merges is written again as the diff it makes on the new tree; one the tree already carries (it
reverse-applies, or the merge changes nothing) is dropped and named in the variant's note; one whose merge
conflicts stops the port, and the report names each conflicting region on both trees. The new variants are then
applied once more, from the pristine ``to`` tree, with zero fuzz, and only when every ported series got that far
is anything written (all or nothing). Fingerprints of the old variant are kept where the ported files still hold
them; the others are reported.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from g4build.data import writable_root
from g4build.errors import ConfigError, PatchConflictError, SourceError, UsageError
from g4build.fsutil import write_atomic
from g4build.pins.model import Pin, PinSet, load_pins
from g4build.pins.pinsfile import scalar
from g4build.series.check import HunkProblem, PatchResult, Scratch
from g4build.series.model import Series, SeriesPatch, get_series, load_all, load_series
from g4build.series.patchfile import FileDiff, parse_patch, touched_paths
from g4build.series.refresh import NewPatch, refresh
from g4build.source import gittree
from g4build.source.merge import FileMerge, MergeConflict, describe, merge_three

_ENV = {"GIT_AUTHOR_NAME": "g4build", "GIT_AUTHOR_EMAIL": "g4build@localhost",
        "GIT_COMMITTER_NAME": "g4build", "GIT_COMMITTER_EMAIL": "g4build@localhost"}

# (pin name, tree-relative paths) -> that pin's pristine copies of the paths it has (its sdist's files)
Pristine = Callable[[str, Sequence[str]], dict[str, bytes]]


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
            "patches": [r.to_dict() for r in self.results],
            "new_files": [p.file for p in self.patches],
            "fingerprints": {k: list(v) for k, v in self.fingerprints.items()},
            "lost_fingerprints": {k: list(v) for k, v in self.lost_fingerprints.items()},
        }


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    width = max(len(a), len(b), 3)
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return tuple(abs(x - y) for x, y in zip(a, b, strict=True))


def from_pin_for(series: Series, to: str, pinset: PinSet) -> str:
    """The pin to port from: the nearest release (either side of ``to``; the older one on a tie) that the series has
    a variant for. A newer pin's variant without patches says only that upstream has the change by then, so it
    is never ported back."""
    target = pinset.get(to).parsed_version
    have = [pinset.get(n) for n, v in series.pins.items() if n in pinset.pins and n != to
            and (v.patches or pinset.get(n).parsed_version <= target)]
    if not have:
        raise UsageError(f"series {series.name} has no variant of another pin to port from "
                         f"(it has: {', '.join(series.pins) or 'none'})", hint="pass --from PIN")
    best = min(have, key=lambda p: (_distance(p.parsed_version.release, target.release),
                                    p.parsed_version > target, p.parsed_version))
    return best.name


@dataclass(frozen=True, kw_only=True)
class PortPlan:
    """What ``patches port`` carries: the ``chosen`` series (in stack order) to pin ``to``, each from its pin."""

    pinset: PinSet
    target: Pin  # the pin ported to
    stack: tuple[Series, ...]
    chosen: tuple[str, ...]
    from_pins: dict[str, str]  # series name -> the pin its patches are taken from

    def not_tried(self, ports: Sequence[SeriesPort]) -> list[str]:
        """The chosen series a stopped port never reached."""
        tried = {p.series for p in ports}
        return [n for n in self.chosen if n not in tried]


def plan_port(series: str | None, *, all_series: bool, to: str, from_pin: str | None, dry_run: bool) -> PortPlan:
    """Which series ``patches port`` carries to pin ``to`` and from which pins: ``series``, or with ``all_series``
    every series without a variant for ``to`` yet (the others are laid down as they are); each from ``from_pin``
    (which every chosen series must have a variant for), else from the nearest release it has one for."""
    if (series is None) == (not all_series):
        raise UsageError("pass a series name or --all (one of them)",
                         hint="e.g. `g4build patches port mm-prefix-fa --to vllm-0.34.0`")
    if not dry_run:
        writable_root()  # series are written in place: never into the installed package
    pinset = load_pins()
    target = pinset.get(to)
    stack = load_all()
    chosen = [s.name for s in stack if s.variant(to) is None] if all_series else [get_series(str(series)).name]
    if not chosen:
        raise UsageError(f"every series already has a variant for {to}: nothing to port",
                         hint=f"change one with `g4build patches refresh SERIES --pin {to} --tree …`")
    if from_pin is not None:
        pinset.get(from_pin)
        lacking = [s.name for s in stack if s.name in chosen and s.variant(from_pin) is None]
        if lacking:
            raise UsageError(f"--from {from_pin}: series {', '.join(lacking)} has no variant for it",
                             hint="pass a pin the series has patches for (`g4build patches list`), or drop --from")
    from_pins = {s.name: from_pin or from_pin_for(s, to, pinset) for s in stack if s.name in chosen}
    return PortPlan(pinset=pinset, target=target, stack=tuple(stack), chosen=tuple(chosen), from_pins=from_pins)


def port_conflict_error(ports: Sequence[SeriesPort], *, to: str, not_tried: Sequence[str]) -> PatchConflictError | None:
    """The error a port that stopped at a conflict ends with (None when every series ported): where it stopped,
    that nothing was written, and how to go on."""
    bad = [p for p in ports if not p.ok]
    if not bad:
        return None
    stopped = next(r for r in bad[0].results if r.status == "conflict")
    where = stopped.problems[0].describe() if stopped.problems else stopped.detail
    more = f" (and {len(stopped.problems) - 1} more)" if len(stopped.problems) > 1 else ""
    before = [p.series for p in ports if p.ok]
    return PatchConflictError(
        f"series {bad[0].series} does not port from {bad[0].from_pin} to {to}: {stopped.file} conflicts, "
        f"{where}{more}; nothing was written"
        + (f" (also not {', '.join(before)}, which ported)" if before else "")
        + (f"; not tried after it: {', '.join(not_tried)}" if not_tried else ""),
        hint=(f"port {', '.join(before)} alone first (`g4build patches port NAME --to {to}`); then " if before
              else "") + f"make the change on a tree of {to} with the series before it applied and record it with "
             f"`g4build patches refresh {bad[0].series} --pin {to} --tree PATH --from-diff`",
    )


def _git(scratch: Scratch, *args: str, stdin: bytes | None = None) -> bytes:
    return gittree.run_git(list(args), cwd=scratch.folder, env={**scratch.env, **_ENV}, stdin=stdin).stdout


def _text(data: bytes, where: str) -> str:
    return "".join(d.text() for d in parse_patch(data, where=where))


def _read(folder: Path, rel: str) -> bytes | None:
    path = folder / rel
    return path.read_bytes() if path.is_file() else None


class _Origins:
    """The old pins' own files as the stack stands at each step: the pin's pristine files (from its sdist) with the
    pin's variants of the series before, and the first patches of the one being ported, applied."""

    def __init__(self, layers: Sequence[Series], pristine: Pristine, folder: Path) -> None:
        self.layers = layers
        self.pristine = pristine
        self.folder = folder
        self.at_pin: dict[str, tuple[Scratch, list[int]]] = {}  # pin -> (its files, [layer, patch] applied up to)

    def files(self, pin: str, layer: int, patch: int, paths: Sequence[str]) -> dict[str, bytes | None]:
        """``paths`` as ``pin`` has them with ``layers[:layer]`` and ``layers[layer]``'s first ``patch`` patches."""
        if pin not in self.at_pin:
            wanted: set[str] = set()
            for s in self.layers:
                for p in s.patches_for(pin):
                    wanted |= touched_paths(parse_patch(p.read_bytes(), where=str(p.path)))
            folder = self.folder / pin
            folder.mkdir(parents=True)
            for rel, data in self.pristine(pin, sorted(wanted)).items():
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                (folder / rel).write_bytes(data)
            self.at_pin[pin] = (Scratch(folder), [0, 0])
        scratch, pos = self.at_pin[pin]
        if (pos[0], pos[1]) > (layer, patch):
            raise AssertionError(f"{pin}'s files asked for an earlier step")
        while (pos[0], pos[1]) < (layer, patch):
            series = self.layers[pos[0]]
            own = series.patches_for(pin)
            if pos[1] >= len(own):
                pos[0], pos[1] = pos[0] + 1, 0
                continue
            p = own[pos[1]]
            ok, log = scratch.apply(_text(p.read_bytes(), str(p.path)))
            if not ok:
                raise UsageError(f"patch {p.file} of {series.name} does not apply to {pin}'s own files: "
                                 f"{log.strip().splitlines()[-1] if log.strip() else 'git apply failed'}",
                                 hint=f"run `g4build patches check --pin {pin}` and fix that variant first")
            pos[1] += 1
        return {rel: _read(scratch.folder, rel) for rel in paths}


def port(stack: Sequence[Series], chosen: Sequence[str], *, to: str, from_pins: dict[str, str], tree: Path,
         dry_run: bool, pristine: Pristine, at_commit: str | None = None) -> list[SeriesPort]:
    """Port the ``chosen`` series (names, in stack order) onto ``tree``, the source of pin ``to``.

    ``at_commit``: take the files as that commit of the (git) tree has them. Earlier series of the stack that are
    not being ported are laid down first with their own ``to`` variant, so each port sees the files as
    ``patches apply`` will. ``pristine`` reads an old pin's own files (for the three-way merge). A series whose port
    conflicts stops the port: the series after it are not tried (they would be ported onto files that lack it),
    and nothing at all is written.
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
        origins = _Origins([s for s, _pin in layers], pristine, Path(tmp) / "origins")
        _git(scratch, "init", "-q")
        _git(scratch, "add", "-A", "-f")
        _git(scratch, "commit", "-q", "--allow-empty", "--no-gpg-sign", "--no-verify", "-m", "pristine")
        for i, (s, pin) in enumerate(layers):
            ported = s.name in chosen
            results: list[PatchResult] = []
            new: list[NewPatch] = []
            for k, p in enumerate(s.patches_for(pin)):
                r = scratch.check(p, None)
                if r.status == "conflict" and ported:
                    r = _merge(p, r, scratch, origins, to=to, from_pin=pin, layer=i, index=k)
                results.append(r)
                if r.status == "conflict":
                    break
                if r.status in ("applies", "merged"):
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
                result = replace(result, fingerprints=kept, lost_fingerprints=lost)
            out.append(result)
            if not result.ok:
                break
        if all(r.ok for r in out):
            _verify(tree, at_commit, paths, layers, out, Path(tmp) / "verify")
    if all(r.ok for r in out) and not dry_run:
        _write_all(stack, out)
        out = [replace(r, written=True) for r in out]
    return out


def _merge(patch: SeriesPatch, direct: PatchResult, scratch: Scratch, origins: _Origins, *, to: str, from_pin: str,
           layer: int, index: int) -> PatchResult:
    """The patch carried over by a three-way merge of each file it touches (``direct``: its zero-fuzz failure)."""
    diffs = parse_patch(patch.read_bytes(), where=str(patch.path))
    rels = sorted(touched_paths(diffs))
    base = origins.files(from_pin, layer, index, rels)
    theirs = origins.files(from_pin, layer, index + 1, rels)
    merges = [merge_three(rel, base=base[rel], ours=_read(scratch.folder, rel), theirs=theirs[rel],
                          ours_name=to, base_name=from_pin) for rel in rels]
    problems: list[HunkProblem] = []
    for m in merges:
        problems += _problems(m, diffs, to=to, from_pin=from_pin)
        if m.ok and m.result is not None and m.path.endswith(".py") and m.result != _read(scratch.folder, m.path):
            try:
                compile(m.result, m.path, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                problems.append(HunkProblem(file=m.path, hunk=0, line=getattr(exc, "lineno", None) or 0,
                                            why=f"the merged file is not valid Python: {exc}"))
    if problems:
        return replace(direct, detail="does not apply with zero fuzz, nor merge: " + "; ".join(
                           p.describe() for p in problems),
                       problems=tuple(problems))
    changed = [m for m in merges if m.result != _read(scratch.folder, m.path)]
    there = [m.path for m in merges if m not in changed and base[m.path] != theirs[m.path]]
    if not changed:
        return PatchResult(file=patch.file, subject=patch.subject, status="upstream",
                           detail=f"already in the tree: a three-way merge with {from_pin}'s files changes nothing")
    for m in changed:
        target = scratch.folder / m.path
        if m.result is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(m.result)
    return PatchResult(file=patch.file, subject=patch.subject, status="merged",
                       detail=f"three-way merged with {from_pin}'s files: {', '.join(m.path for m in changed)}"
                              + (f"; already in {to}: {', '.join(there)}" if there else ""))


def _problems(merge: FileMerge, diffs: Sequence[FileDiff], *, to: str, from_pin: str) -> list[HunkProblem]:
    if merge.why:
        return [HunkProblem(file=merge.path, hunk=0, line=0, why=merge.why)]
    diff = next((d for d in diffs if merge.path in (d.old_path, d.new_path)), None)
    return [HunkProblem(file=merge.path, hunk=_hunk_of(c, diff), line=c.base_line if c.base_line > 0 else 0,
                        why=describe(c, ours_name=to, base_name=from_pin)) for c in merge.conflicts]


def _hunk_of(conflict: MergeConflict, diff: FileDiff | None) -> int:
    """The number of the patch's hunk (in its file) that the conflict's lines of the old file fall in, or nearest."""
    if diff is None or not diff.hunks or conflict.base_line <= 0:
        return 0
    start, end = conflict.base_line, conflict.base_line + max(conflict.base_count, 1)

    def gap(h: Any) -> int:
        lo, hi = h.old_start, h.old_start + max(h.old_count, 1)
        return 0 if start < hi and lo < end else min(abs(start - hi), abs(lo - end))

    return int(min(diff.hunks, key=gap).number)


def _verify(tree: Path, at_commit: str | None, paths: set[str], layers: Sequence[tuple[Series, str]],
            ports: Sequence[SeriesPort], folder: Path) -> None:
    """Every layer once more from the pristine tree, new variants included, each patch with zero fuzz."""
    scratch = Scratch.of(tree, folder, paths, at_commit)
    by_name = {p.series: p for p in ports}
    for s, pin in layers:
        items = ([(p.file, p.data) for p in by_name[s.name].patches] if s.name in by_name
                 else [(p.file, p.read_bytes()) for p in s.patches_for(pin)])
        for file, data in items:
            ok, log = scratch.apply(_text(data, file))
            if not ok:
                raise SourceError(f"{s.name} {file}: the ported variant does not apply back onto the pristine tree "
                                  f"with zero fuzz ({log.strip()}); nothing was written",
                                  hint="report this; port that series by hand meanwhile")


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


def port_note(port_: SeriesPort) -> str:
    """The new variant's note: where it came from and how each patch got there (already-upstream ones by name)."""
    def count(status: str) -> int:
        return sum(r.status == status for r in port_.results)

    upstream = [r.file.rsplit("/", 1)[-1] for r in port_.results if r.status == "upstream"]
    return (f"Ported from {port_.from_pin} by `g4build patches port`: {count('applies')} patch(es) applied, "
            f"{count('merged')} three-way merged, {len(upstream)} already upstream"
            + (f" ({', '.join(upstream)})" if upstream else "") + ". Review before release.")


def _write_all(stack: Sequence[Series], ports: Sequence[SeriesPort]) -> None:
    """Write every ported variant, or none: a failure takes back the ones already written."""
    by_name = {s.name: s for s in stack}
    done: list[tuple[Series, SeriesPort, bytes]] = []
    try:
        for p in ports:
            series = by_name[p.series]
            before = (series.folder / "series.yaml").read_bytes()
            done.append((series, p, before))
            _write(series, p)
    except BaseException:
        for series, p, before in done:
            _undo(series, p, before)
        raise


def _undo(series: Series, port_: SeriesPort, before: bytes) -> None:
    # the variant is new, so every file of it is ours to take back
    write_atomic(series.folder / "series.yaml", before)
    for p in port_.patches:
        (series.folder / p.file).unlink(missing_ok=True)
    folder = series.folder / port_.to_pin
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _write(series: Series, port_: SeriesPort) -> None:
    meta = series.folder / "series.yaml"
    refresh(series, port_.to_pin, list(port_.patches))
    note = port_note(port_)
    edited = _set_extras(meta.read_bytes().decode("utf-8"), port_.to_pin, port_.fingerprints, note)
    write_atomic(meta, edited.encode())
    loaded = load_series(series.folder).variant(port_.to_pin)
    if loaded is None or loaded.fingerprints != port_.fingerprints or loaded.note != note:
        raise ConfigError(f"{meta}: the ported variant {port_.to_pin} does not read back as written; "
                          "nothing was kept", hint="report this; port by hand meanwhile")


def _set_extras(text: str, pin: str, fingerprints: dict[str, tuple[str, ...]], note: str) -> str:
    """Replace the new variant's empty ``fingerprints: {}`` and ``note: ""`` lines (as refresh writes them)."""
    lines = text.splitlines(keepends=True)
    key = next((n for n, line in enumerate(lines) if re.match(rf"^(\s+){re.escape(pin)}:\s*$", line)), None)
    if key is None:
        raise ConfigError(f"series.yaml: no block for {pin} after writing its patches",
                          hint="add fingerprints and a note by hand")
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
