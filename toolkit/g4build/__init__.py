"""g4build: vLLM + Gemma 4 + DFlash wheels for SM120 on Windows, WSL and Linux.

The pipeline, one subpackage per stage, in the order a build runs them:

    pins      1. pin: the pinned upstream releases (patches/pins.yaml) and the package index they come from
    source    2. source: the pin's source tree, verified; the Windows fork's base ported onto it; git plumbing
    series    3. patches: the patch series (patches/) and the engine that checks, applies, refreshes, ports them
    builder   4. build: the build as data (BuildPlan), one module per OS (platforms), executors, host probing
    validate  5. validate: a built (or overlaid) wheel read once and checked: tags, RECORD, series, CUDA archs
    emit      6. emit: build-manifest.json (what made the wheels) beside them and stamped into the vLLM wheel

Routes, each on top of the stages it uses and independent of the others:

    overlay   series laid over a released wheel or an installed venv instead of a build
    index     a package index (PEP 503/691/658) that users pip-install validated wheels from
    image     a prepatched container image's vLLM files turned into a series
    recipes   launch recipes, checked against a wheel's manifest and rendered as bash or PowerShell
    ci        the wheel matrix (ci/matrix.yaml) and the GitHub workflows generated from it
    doctor    preflight checks of this machine before a long build

Beneath the stages: wheelfile (wheel files at the byte level, and the file format of build-manifest.json, which
validate and the routes read without emit), data (where the data folders are), util (hardened YAML, shell
quoting, fault injection), errors and fsutil. On top, cli: it parses, calls a stage or a route and renders the
result.

Layers, top to bottom: a module imports from its own subpackage or from a lower layer, never from a higher one,
and no route from another (tests/unit/test_layout.py holds the code to this list):

    cli
    overlay | index | image | recipes | ci | doctor
    emit
    validate
    builder
    series
    source
    pins
    wheelfile
    data
    util
    errors | fsutil
"""

__version__ = "0.1.0"

import os as _os

# GitPython raises ImportError at import when no git executable is on PATH, which would turn every command
# (doctor, which reports the missing git, included) into a traceback. Let it import; the commands that need git
# check for it and say so.
_os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
