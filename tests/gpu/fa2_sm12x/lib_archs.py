"""What a built FA2 library carries, read two ways: g4build's own fatbin reader (the one ``g4build validate`` uses,
with its per-arch verdict) and ``cuobjdump --list-elf`` / ``--list-ptx`` where the CUDA toolkit has it.

    PYTHONPATH=toolkit python tests/gpu/fa2_sm12x/lib_archs.py LIB --arch sm_120 --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from g4build.validate.fatbin import Arch, library_archs


def cuobjdump(lib: Path, flag: str) -> list[str] | None:
    exe = shutil.which("cuobjdump")
    if exe is None:
        return None
    proc = subprocess.run([exe, flag, str(lib)], capture_output=True, text=True, check=False)
    return [line for line in proc.stdout.splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lib", type=Path)
    parser.add_argument("--arch", action="append", default=[], help="target, e.g. sm_120 (repeatable)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = args.lib.read_bytes()
    archs = library_archs(data, args.lib.name)
    entries = archs.entries
    result: dict[str, object] = {
        "library": args.lib.name,
        "bytes": len(data),
        "fatbins": len(archs.fatbins),
        "sass": dict(Counter(e.name for e in entries if e.kind == "sass")),
        "ptx": dict(Counter(e.name for e in entries if e.kind == "ptx")),
    }
    verdicts: dict[str, dict[str, object]] = {}
    result["verdicts"] = verdicts
    ok = True
    for text in args.arch or ["sm_120"]:
        target = Arch.parse(text)
        verdict = archs.verdict(target)
        verdicts[target.sm()] = {"verdict": verdict.verdict, "ok": verdict.ok, "detail": verdict.detail}
        ok = ok and verdict.ok
    elf = cuobjdump(args.lib, "--list-elf")
    ptx = cuobjdump(args.lib, "--list-ptx")
    if elf is not None:
        result["cuobjdump_list_elf"] = elf
        found = (re.search(r"\.(sm_\d+[a-z]?)\.", line) for line in elf)
        result["cuobjdump_elf_archs"] = dict(Counter(m.group(1) for m in found if m))
        result["cuobjdump_list_ptx"] = ptx
    result["ok"] = ok
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("cuobjdump_list")}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
