"""Fill g4build's dependency cache from carried archives, as `g4build prefetch` would leave it (offline machines).

    python tests/device/fill_deps_cache.py SDIST CARRIED_DIR CACHE_DEPS_DIR

Each FetchContent dependency the sdist's CMake declares is looked for as ``CARRIED_DIR/<name>.tar.xz``; a missing
one becomes an empty folder (nothing of it compiles for sm_120). The folders get prefetch's stamp, so
`g4build prefetch` and `g4build deps apply` use them without the network.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

from g4build.builder.deps import find_deps


def main(sdist: Path, carried: Path, cache: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
        wanted = [m for m in tar.getmembers() if m.name.endswith(".cmake") or m.name.endswith("/CMakeLists.txt")]
        tar.extractall(tmp, members=wanted, filter="data")
        deps = find_deps(next(Path(tmp).iterdir()))
    for dep in deps:
        dest = cache / dep.cache_name
        if (dest / ".g4build-prefetched").is_file():
            continue
        dest.mkdir(parents=True, exist_ok=True)
        archive = carried / f"{dep.name}.tar.xz"
        if archive.is_file():
            with tarfile.open(archive) as t:
                t.extractall(dest, filter="data")
            how = f"from {archive.name}"
        else:
            how = "not carried: empty (nothing of it compiles for sm_120)"
        if dep.name == "triton_kernels":  # Python files vLLM copies into the wheel; none carried
            (dest / "python" / "triton_kernels" / "triton_kernels").mkdir(parents=True, exist_ok=True)
        (dest / ".g4build-prefetched").write_text(f"{dep.repository} {dep.tag} (carried for an offline build)\n")
        print(f"dependency {dep.name} @ {dep.tag}: {how}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
