"""git run on material g4build did not write: nothing in a repository's metadata, or in the machine's git
configuration, may run a program.

Two strengths:

- ``hardened`` (trees made from upstream material: extracted sdists, image layers, clones of dependencies, and the
  scratch repositories g4build commits into): no hook (``core.hooksPath`` points at an empty name), no fsmonitor,
  no system or global configuration file (so no ``include``, alias, filter driver or credential helper of the
  machine's either), no prompt.
- ``network=True`` (a fetch from a remote into a repository g4build made itself): hooks and fsmonitor off as
  above, but the machine's configuration stays, since proxies, ``url.*.insteadOf`` mirrors and TLS settings of
  the user's git are what make the remote reachable; a fetch runs no program of the remote's.

A sdist's own ``.git`` never survives extraction (``source.extract``): the repository config git reads is then
always one g4build wrote.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from g4build.errors import UsageError

NETWORK_DEADLINE_S = 3600.0  # G4BUILD_GIT_DEADLINE: one fetch or clone from a remote, all its steps together

# Names that are some VCS's metadata in a tree (compared case-folded, NTFS trailing dots and spaces dropped: on
# Windows and macOS ".GIT" and ".git." are ".git"); "git~1" is .git's 8.3 short name on NTFS.
VCS_NAMES = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", ".fslckout", "git~1"})


def is_vcs_name(part: str) -> bool:
    """True when one path component names VCS metadata on some file system g4build runs on."""
    return part.lower().rstrip(". ") in VCS_NAMES


def config_args(*, network: bool = False) -> list[str]:
    """``-c`` options that switch off every program a repository's or a user's config could name; unless
    ``network``, also line-ending conversion and signing (g4build's own commits are byte for byte and unsigned)."""
    args = ["-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", "-c", "protocol.ext.allow=never"]
    if not network:
        args += ["-c", "core.untrackedCache=false", "-c", "core.autocrlf=false", "-c", "core.safecrlf=false",
                 "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"]
    return args


def env(base: Mapping[str, str] | None = None, *, network: bool = False) -> dict[str, str]:
    """The environment for such a git run: ``base`` (default ``os.environ``) plus the settings above."""
    out = dict(os.environ if base is None else base)
    out.update({"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never", "LC_ALL": "C"})
    if not network:
        out.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_SYSTEM": os.devnull, "GIT_CONFIG_GLOBAL": os.devnull})
    return out


def network_deadline() -> float:
    """``time.monotonic()`` value by which a git fetch or clone starting now must end (``G4BUILD_GIT_DEADLINE``
    seconds from now, default 3600): a remote that trickles or stalls cannot hold a run forever."""
    raw = os.environ.get("G4BUILD_GIT_DEADLINE", "").strip()
    try:
        seconds = float(raw) if raw else NETWORK_DEADLINE_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise UsageError(f"G4BUILD_GIT_DEADLINE: expected a positive number of seconds, found {raw!r}",
                         hint=f"set it to e.g. {NETWORK_DEADLINE_S:g}, or unset it for the default")
    return time.monotonic() + seconds


def left(deadline: float) -> float:
    """Seconds left until ``deadline`` (at least a tenth of one: subprocess needs a positive timeout)."""
    return max(0.1, deadline - time.monotonic())
