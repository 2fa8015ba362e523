"""Benchmark: hashing every member of the registry's vLLM 0.21.0 wheel (248 MB) as `validate` and `overlay` do,
read by ``zipfile`` (sizes from the central directory) against ``wheelfile.zipdata`` (local headers checked,
sizes and the deflate stream's end read from the data). One run, both ways, best of 3, ratio printed.

    python tests/benchmarks/bench_member_reading.py [--json]

Goal: reading from the data costs at most 1.2x what zipfile's reading does.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[2] / "toolkit"), str(HERE.parents[2])]

from g4build.pins.index import cache_root, fetch_verified  # noqa: E402
from g4build.pins.model import load_pins  # noqa: E402
from g4build.wheelfile.zipdata import member_chunks  # noqa: E402

CHUNK = 1 << 20


def by_zipfile(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    with zf.open(info) as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def by_data(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    assert zf.fp is not None
    return member_chunks(zf.fp, info)


def hash_all(path: Path, read: Callable[[zipfile.ZipFile, zipfile.ZipInfo], Iterator[bytes]]) -> int:
    total = 0
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            digest = hashlib.sha256()
            for chunk in read(zf, info):
                digest.update(chunk)
                total += len(chunk)
    return total


def best(fn: Callable[[], object], tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ref = load_pins().get("vllm-0.21.0").wheels["manylinux_x86_64"]
    wheel = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    assert hash_all(wheel, by_zipfile) == hash_all(wheel, by_data)  # the same bytes either way
    old = best(lambda: hash_all(wheel, by_zipfile))
    new = best(lambda: hash_all(wheel, by_data))
    result = {"wheel_mb": round(wheel.stat().st_size / 1e6), "zipfile_s": round(old, 2), "from_data_s": round(new, 2),
              "ratio": round(new / old, 2)}
    print(json.dumps(result) if "--json" in sys.argv else
          f"{result['wheel_mb']} MB wheel: zipfile {old:.2f} s, from the data {new:.2f} s, ratio {new / old:.2f}")


if __name__ == "__main__":
    main()
