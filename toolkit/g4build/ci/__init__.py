"""CI as data: the wheel matrix (``ci/matrix.yaml``), its expansion into cells, and the generated workflows."""

from __future__ import annotations

from g4build.ci.matrix import (
    Cell,
    MatrixSpec,
    Target,
    expand,
    github_outputs,
    load_matrix,
    newest_release,
    resolve_target,
    select_archs,
)
from g4build.ci.workflows import Rendered, render_all, stale_files

__all__ = [
    "Cell",
    "MatrixSpec",
    "Rendered",
    "Target",
    "expand",
    "github_outputs",
    "load_matrix",
    "newest_release",
    "render_all",
    "resolve_target",
    "select_archs",
    "stale_files",
]
