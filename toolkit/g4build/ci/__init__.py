"""CI as data: the wheel matrix (``ci/matrix.yaml``), its expansion into cells, and the generated workflows."""

from __future__ import annotations

from g4build.ci.matrix import (
    Cell,
    Target,
    append_github_outputs,
    buildable,
    expand,
    github_outputs,
    latest_release,
    newest_release,
    read_github_outputs,
    resolve_target,
    select_archs,
)
from g4build.ci.spec import MatrixSpec, exclusion_notes, load_matrix
from g4build.ci.workflows import Rendered, render_all, stale_files, write_rendered

__all__ = [
    "Cell",
    "MatrixSpec",
    "Rendered",
    "Target",
    "append_github_outputs",
    "buildable",
    "exclusion_notes",
    "expand",
    "github_outputs",
    "latest_release",
    "load_matrix",
    "newest_release",
    "read_github_outputs",
    "render_all",
    "resolve_target",
    "select_archs",
    "stale_files",
    "write_rendered",
]
