"""One exception class per failure kind, each with its own exit code.

Every message says what was expected, what was found and what to do (``hint``).
The CLI prints ``message`` and ``hint`` and exits with ``exit_code``; nothing else
in the package calls ``sys.exit``.
"""

from __future__ import annotations


class G4BuildError(Exception):
    """Base class. Subclasses set ``exit_code``; keep codes distinct and stable."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(G4BuildError):
    """An unknown name (pin, series, recipe, arch) or a bad option value."""

    exit_code = 2


class UnknownPinError(UsageError):
    exit_code = 2


class ConfigError(G4BuildError):
    """A data file (pins.yaml, series.yaml, a recipe, the CI matrix) is malformed."""

    exit_code = 3


class IntegrityError(G4BuildError):
    """A download or a tree does not match its pinned sha256 / commit."""

    exit_code = 4


class DownloadError(G4BuildError):
    """The package index or a file on it could not be reached or is missing."""

    exit_code = 5


class UnsafeArchiveError(G4BuildError):
    """An archive member, or a file an overlay writes, would land outside its folder (``..``, absolute path, link
    escape)."""

    exit_code = 6


class SourceError(G4BuildError):
    """A source tree (git clone, checkout path) is not the pinned one or cannot be prepared."""

    exit_code = 7


class PatchConflictError(G4BuildError):
    """A patch does not apply cleanly (with zero fuzz) to a tree."""

    exit_code = 8


class BuildError(G4BuildError):
    """A build prerequisite is missing or a build step failed."""

    exit_code = 9


class ValidationError(G4BuildError):
    """A wheel failed validation."""

    exit_code = 10


class RecipeError(G4BuildError):
    """A launch recipe breaks a rule or cannot be rendered."""

    exit_code = 11


class ImageError(G4BuildError):
    """An image (docker engine, docker-save tarball, OCI layout) cannot be read."""

    exit_code = 12


class LockTimeoutError(G4BuildError):
    """Another g4build process holds the cache lock for too long."""

    exit_code = 13


class DoctorFailed(G4BuildError):
    """`g4build doctor` found at least one check that fails (the machine cannot build as it is)."""

    exit_code = 14


class BaseConflictError(SourceError):
    """A fork's changes do not merge onto the pin's upstream tree (forward-ported OS base)."""

    exit_code = 15
