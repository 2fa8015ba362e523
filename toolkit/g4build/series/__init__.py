"""Stage 3, patches: the series model (``patches/``), patch files, and the engine that checks, applies,
refreshes and ports series; also the build series for CMake dependencies (``patches/deps/``).

Named ``series`` rather than ``patches``: the data folder ``patches/`` ships as ``g4build._data.patches``."""
