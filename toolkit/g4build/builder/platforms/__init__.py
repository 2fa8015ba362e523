"""What the planner asks of an OS, as one small Protocol (cibuildwheel's ``platforms/`` style): the modules
``linux`` (Linux and WSL) and ``windows`` each satisfy it with module-level functions, so every OS difference
of a plan lives in one file and ``make_plan`` picks the module once.

mypy checks the contract: ``LINUX`` and ``WINDOWS`` are the two modules typed as ``Platform``.
"""

from __future__ import annotations

from typing import Protocol

from g4build.builder.plan import Layout, Options, Step, Target
from g4build.builder.platforms import linux, windows
from g4build.pins.model import Pin


class Platform(Protocol):
    SCRIPT: str  # the shell of the scripts a plan for this OS is written as

    def default_layout(self, pin: Pin, target: Target, *, base: str) -> Layout:
        """Where a build lives when --root is not given (``base``: g4build's cache folder here)."""
        ...

    def python_cmd(self, target: Target, exe: str | None) -> tuple[str, ...]:
        """The interpreter every Python step runs: ``exe`` when named (--python-exe), else the OS's default."""
        ...

    def resolve_options(self, target: Target, opts: Options) -> tuple[Options, tuple[str, ...]]:
        """The options as this OS builds with them (refusing what it cannot do), and notes saying why."""
        ...

    def check_layout(self, target: Target, layout: Layout) -> None:
        """Raise UsageError for build paths this OS's tools cannot use."""
        ...

    def env(self, target: Target, layout: Layout, *, cuda_home: str | None) -> dict[str, str]:
        """What this OS adds to the build environment."""
        ...

    def setup_lines(self, target: Target, opts: Options) -> tuple[str, ...]:
        """Script lines run before any step (toolchain activation, checks that stop early)."""
        ...

    def pre_steps(self, pin: Pin, target: Target, layout: Layout, opts: Options) -> tuple[Step, ...]:
        """Steps before the source is fetched."""
        ...

    def source_steps(self, pin: Pin, layout: Layout, g4build: tuple[str, ...]) -> tuple[Step, ...]:
        """The steps that make the pin's source tree for this OS at ``layout.src``."""
        ...

    def extra_steps(self, target: Target, layout: Layout, opts: Options) -> tuple[Step, ...]:
        """Steps after the series are applied, before the build requirements."""
        ...

    def notes(self, pin: Pin, target: Target, layout: Layout, opts: Options) -> tuple[str, ...]:
        """What the plan should tell the user about this OS's choices."""
        ...

    def jobs_from_machine(self, opts: Options) -> bool:
        """Whether the script computes MAX_JOBS on the machine it runs on (unless set there)."""
        ...


# Each module is typed as a Platform on its own: mypy checks a module against a Protocol only where the module
# itself is assigned (``windows if ... else linux`` would be a plain ModuleType, which satisfies anything).
LINUX: Platform = linux
WINDOWS: Platform = windows


def platform_for(os_name: str) -> Platform:
    """``windows`` for Windows, else ``linux`` (WSL is Linux; an unknown OS is refused by ``check_target``)."""
    return WINDOWS if os_name == "windows" else LINUX
