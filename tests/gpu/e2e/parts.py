"""Carry a large file to a machine that only takes small transfers: split it here, stash the parts there one
transfer at a time, join them there and accept the result only if its sha256 is the one the pin records.

  python tests/gpu/e2e/parts.py split FILE --out DIR --sizes-mib 17,60,60,60,60
      writes DIR/1/part, DIR/2/part, ... (one folder per transfer) and DIR/<n>/parts.json in each
  python tests/gpu/e2e/parts.py stash DIR --stage STAGE
      copies the parts carried in DIR/*/ into STAGE, each checked against parts.json
  python tests/gpu/e2e/parts.py join --stage STAGE --pin vllm-0.21.0 --dest DIR [--pins patches/pins.yaml]
      concatenates the parts, checks the whole file's sha256 against the pin's registry wheel entry and only
      then moves it to DIR/<the pin's wheel file name>; a missing or damaged part is named, nothing is written
  python tests/gpu/e2e/parts.py bundle FILE [FILE...] --out DIR --sizes-mib 30,60,60
      several wheels as one stream of parts (a pin's torch, triton, NCCL): parts.json lists each member's
      name, offset, size and sha256
  python tests/gpu/e2e/parts.py unbundle --stage STAGE --dest DIR
      cuts the staged bundle back into its wheels, each written only once its sha256 and the whole stream's
      match parts.json (the run then checks every wheel against the repository's list, run_e2e.sh install_listed)

Standard library only (plus PyYAML for pins.yaml, present wherever g4build runs). Exit codes: 0 done, 3 a part is
missing, 4 a sha256 differs, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

MIB = 1024 * 1024
EXIT_MISSING = 3
EXIT_MISMATCH = 4
BUNDLE = "bundle"
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.whl")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(4 * MIB), b""):
            h.update(block)
    return h.hexdigest()


def split(src: Path, out: Path, sizes_mib: list[int], extra: dict[str, object] | None = None) -> dict[str, object]:
    total = src.stat().st_size
    capacity = sum(sizes_mib) * MIB
    if capacity < total:
        raise SystemExit(
            f"parts.py: the sizes hold {capacity / MIB:.1f} MiB but {src.name} is {total / MIB:.1f} MiB; "
            "add a transfer (another size) or make them larger"
        )
    parts: list[dict[str, object]] = []
    with src.open("rb") as f:
        for index, size in enumerate(sizes_mib, start=1):
            data = f.read(size * MIB)
            if not data:
                break
            folder = out / str(index)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "part").write_bytes(data)
            parts.append({"index": index, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    index_doc: dict[str, object] = {
        "file": src.name,
        "size": total,
        "sha256": sha256_of(src),
        "parts": parts,
        **(extra or {}),
    }
    for part in parts:
        (out / str(part["index"]) / "parts.json").write_text(json.dumps(index_doc, indent=1) + "\n")
    return index_doc


def stash(carried: Path, stage: Path) -> list[int]:
    """Copy every carried part into STAGE after checking it; return the indexes now staged."""
    stage.mkdir(parents=True, exist_ok=True)
    done: list[int] = []
    for parts_json in sorted(carried.glob("*/parts.json")):
        doc = json.loads(parts_json.read_text())
        index = int(parts_json.parent.name)
        entry = next((p for p in doc["parts"] if p["index"] == index), None)
        part = parts_json.parent / "part"
        if entry is None or not part.is_file():
            continue
        digest = sha256_of(part)
        if digest != entry["sha256"]:
            print(f"part {index}: sha256 {digest}, expected {entry['sha256']}: damaged in transfer", file=sys.stderr)
            raise SystemExit(EXIT_MISMATCH)
        tmp = stage / f".part-{index}.tmp"
        shutil.copyfile(part, tmp)
        os.replace(tmp, stage / f"part-{index}")
        shutil.copyfile(parts_json, stage / "parts.json")
        done.append(index)
    staged = sorted(int(p.name.split("-")[1]) for p in stage.glob("part-*"))
    print(f"stashed parts {done}; staged now: {staged}")
    return staged


def pin_wheel(pins_file: Path, pin: str) -> tuple[str, str]:
    import yaml

    doc = yaml.safe_load(pins_file.read_text())
    try:
        entry = doc["pins"][pin]["wheels"]["manylinux_x86_64"]
    except (KeyError, TypeError):
        raise SystemExit(f"parts.py: {pins_file} has no manylinux_x86_64 wheel for pin {pin!r}") from None
    return str(entry["file"]), str(entry["sha256"])


def join(stage: Path, pins_file: Path, pin: str, dest: Path) -> Path:
    file_name, expected = pin_wheel(pins_file, pin)
    target = dest / file_name
    if target.is_file() and sha256_of(target) == expected:
        print(f"{target.name}: already joined, sha256 {expected}")
        return target
    index_path = stage / "parts.json"
    if not index_path.is_file():
        print(f"no parts.json in {stage}: no part was stashed yet", file=sys.stderr)
        raise SystemExit(EXIT_MISSING)
    doc = json.loads(index_path.read_text())
    missing = [p["index"] for p in doc["parts"] if not (stage / f"part-{p['index']}").is_file()]
    if missing:
        print(f"{doc['file']}: parts {missing} of {len(doc['parts'])} are not staged in {stage}; carry them "
              "(tests/gpu/e2e/README.md says how)", file=sys.stderr)
        raise SystemExit(EXIT_MISSING)
    dest.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=".join-", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for p in doc["parts"]:
                data = (stage / f"part-{p['index']}").read_bytes()
                h.update(data)
                out.write(data)
        digest = h.hexdigest()
        if digest != expected:
            print(f"{file_name}: joined sha256 {digest} but {pin} in {pins_file.name} says {expected}: "
                  "not installed", file=sys.stderr)
            raise SystemExit(EXIT_MISMATCH)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{target.name}: {target.stat().st_size} bytes, sha256 {expected} matches pin {pin}")
    return target


def bundle(files: list[Path], out: Path, sizes_mib: list[int]) -> dict[str, object]:
    """Concatenate FILES into one stream and split it like one file; parts.json names the members."""
    names = [f.name for f in files]
    bad = [n for n in names if not MEMBER_NAME.fullmatch(n)]
    if bad or len(set(names)) != len(names):
        raise SystemExit(f"parts.py: bundle members must be distinct wheel file names; got {bad or names}")
    out.mkdir(parents=True, exist_ok=True)
    members: list[dict[str, object]] = []
    fd, tmp_name = tempfile.mkstemp(dir=out, prefix=".bundle-", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        offset = 0
        with os.fdopen(fd, "wb") as sink:
            for f in files:
                h = hashlib.sha256()
                with f.open("rb") as source:
                    for block in iter(lambda: source.read(4 * MIB), b""):
                        h.update(block)
                        sink.write(block)
                size = f.stat().st_size
                members.append({"name": f.name, "offset": offset, "size": size, "sha256": h.hexdigest()})
                offset += size
        named = tmp.with_name(BUNDLE)
        os.replace(tmp, named)
        tmp = named
        return split(tmp, out, sizes_mib, {"members": members})
    finally:
        tmp.unlink(missing_ok=True)


class _Chain:
    """The staged parts read as one stream, in order."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = list(paths)
        self._f = None

    def read(self, n: int) -> bytes:
        chunks: list[bytes] = []
        while n > 0:
            if self._f is None:
                if not self._paths:
                    break
                self._f = self._paths.pop(0).open("rb")
            data = self._f.read(n)
            if not data:
                self._f.close()
                self._f = None
                continue
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def unbundle(stage: Path, dest: Path) -> list[Path]:
    index_path = stage / "parts.json"
    if not index_path.is_file():
        print(f"no parts.json in {stage}: no part was stashed yet", file=sys.stderr)
        raise SystemExit(EXIT_MISSING)
    doc = json.loads(index_path.read_text())
    members = doc.get("members")
    if doc.get("file") != BUNDLE or not isinstance(members, list):
        print(f"{index_path}: not a bundle (made by `parts.py bundle`)", file=sys.stderr)
        raise SystemExit(2)
    missing = [p["index"] for p in doc["parts"] if not (stage / f"part-{p['index']}").is_file()]
    if missing:
        print(f"bundle: parts {missing} of {len(doc['parts'])} are not staged in {stage}; carry them", file=sys.stderr)
        raise SystemExit(EXIT_MISSING)
    offset = 0
    for m in members:  # names become paths: plain wheel names only, contiguous, the stream's whole size
        if not MEMBER_NAME.fullmatch(str(m.get("name", ""))) or m.get("offset") != offset:
            print(f"bundle member {m!r}: not a plain wheel name at offset {offset}", file=sys.stderr)
            raise SystemExit(EXIT_MISMATCH)
        offset += int(m["size"])
    if offset != doc["size"]:
        print(f"bundle members cover {offset} bytes of {doc['size']}", file=sys.stderr)
        raise SystemExit(EXIT_MISMATCH)
    dest.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    chain = _Chain([stage / f"part-{p['index']}" for p in doc["parts"]])
    written: list[Path] = []
    temps: list[Path] = []
    try:
        for m in members:
            tmp = dest / f".{m['name']}.tmp"
            temps.append(tmp)
            h = hashlib.sha256()
            left = int(m["size"])
            with tmp.open("wb") as out:
                while left:
                    data = chain.read(min(left, 4 * MIB))
                    if not data:
                        break
                    h.update(data)
                    whole.update(data)
                    out.write(data)
                    left -= len(data)
            if left or h.hexdigest() != m["sha256"]:
                print(f"{m['name']}: sha256 {h.hexdigest()}, parts.json says {m['sha256']}", file=sys.stderr)
                raise SystemExit(EXIT_MISMATCH)
        if whole.hexdigest() != doc["sha256"]:
            print(f"bundle: sha256 {whole.hexdigest()}, parts.json says {doc['sha256']}", file=sys.stderr)
            raise SystemExit(EXIT_MISMATCH)
        for m, tmp in zip(members, temps, strict=True):
            os.replace(tmp, dest / m["name"])
            written.append(dest / m["name"])
    finally:
        chain.close()
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    print(f"unbundled {len(written)} files into {dest}: {', '.join(p.name for p in written)}")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("file", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--sizes-mib", required=True, help="comma-separated part sizes, one per transfer")
    st = sub.add_parser("stash")
    st.add_argument("carried", type=Path)
    st.add_argument("--stage", type=Path, required=True)
    j = sub.add_parser("join")
    j.add_argument("--stage", type=Path, required=True)
    j.add_argument("--pin", required=True)
    j.add_argument("--dest", type=Path, required=True)
    j.add_argument("--pins", type=Path, default=Path(__file__).resolve().parents[3] / "patches" / "pins.yaml")
    b = sub.add_parser("bundle")
    b.add_argument("files", type=Path, nargs="+")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--sizes-mib", required=True, help="comma-separated part sizes, one per transfer")
    u = sub.add_parser("unbundle")
    u.add_argument("--stage", type=Path, required=True)
    u.add_argument("--dest", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd in ("split", "bundle"):
        try:
            sizes = [int(x) for x in args.sizes_mib.split(",") if x]
        except ValueError:
            ap.error(f"--sizes-mib wants integers like 17,60,60; got {args.sizes_mib!r}")
        doc = split(args.file, args.out, sizes) if args.cmd == "split" else bundle(args.files, args.out, sizes)
        print(json.dumps({k: v for k, v in doc.items() if k not in ("parts", "members")}), f"{len(doc['parts'])} parts")  # type: ignore[arg-type]
    elif args.cmd == "stash":
        stash(args.carried, args.stage)
    elif args.cmd == "unbundle":
        unbundle(args.stage, args.dest)
    else:
        join(args.stage, args.pins, args.pin, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
