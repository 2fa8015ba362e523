"""The environment a pin serves in: the transformers, torch and FlashInfer versions its release works with, as
data (``patches/pins.yaml``), and one small Python program that compares them with what a Python has installed.

The program runs where vLLM will run: launch scripts run it before ``vllm serve`` (a clear message naming the
installed and the expected version, instead of a model-load traceback minutes later) and ``g4build doctor`` runs
it with ``--json``. It reads installed versions with ``importlib.metadata`` (nothing is imported) and compares them
with ``packaging`` (which transformers requires; without it the program says nothing). An installed version that
does not parse is outside every range (the launch stops: fail closed), and is printed escaped (``ascii``), so no
escape sequence from a package's metadata reaches the terminal. It holds single quotes only: Windows PowerShell
5.1 drops double quotes from the arguments it passes to a program.
"""

from __future__ import annotations

from dataclasses import dataclass

from g4build.pins.model import Pin

TRANSFORMERS = "transformers"
TORCH = "torch"
FLASHINFER = "flashinfer-python"
MISMATCH_EXIT = 3  # the program's exit status when a version stops the launch


@dataclass(frozen=True, kw_only=True)
class Expected:
    project: str  # the distribution's name, as importlib.metadata finds it
    spec: str  # PEP 440 specifiers
    required: bool  # absent is a finding (FlashInfer is optional: checked only where installed)
    fatal: bool  # outside the range stops a launch (else a warning)
    why: str


def expected(pin: Pin) -> tuple[Expected, ...]:
    """What ``pin``'s release works with: its recorded transformers range (Gemma 4 checkpoints fail to load
    outside it), and the torch and FlashInfer its kernels are built against."""
    out = []
    if pin.transformers:
        out.append(Expected(project=TRANSFORMERS, spec=pin.transformers, required=True, fatal=True,
                            why=f"vLLM {pin.version} reads the configs of the published Gemma 4 checkpoints with "
                                "these transformers only (g4build pin data)"))
    out.append(Expected(project=TORCH, spec=f"=={pin.torch}", required=True, fatal=False,
                        why=f"vLLM {pin.version} is built against torch {pin.torch}"))
    out.append(Expected(project=FLASHINFER, spec=f"=={pin.flashinfer}", required=False, fatal=False,
                        why=f"vLLM {pin.version} is tested with FlashInfer {pin.flashinfer}"))
    return tuple(out)


_PROGRAM = """\
import importlib.metadata as m, json, sys
WANT = %s
try:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:
    SpecifierSet = None
def shown(text):
    return text if text.isascii() and text.isprintable() else ascii(text)
rows = []
for project, spec, required, fatal, why in WANT:
    try:
        found = m.version(project)
    except m.PackageNotFoundError:
        found = None
    unparsed = False
    if found is None:
        ok = not required
    elif not isinstance(found, str):
        found, ok, unparsed = repr(found), False, True
    elif SpecifierSet is None:
        ok = None
    else:
        try:
            ok = SpecifierSet(spec).contains(Version(found), prereleases=True)
        except Exception:
            ok, unparsed = False, True
    rows.append((project, spec, required, fatal, why, found, ok, unparsed))
if sys.argv[1:] == ['--json']:
    keys = 'project spec required fatal why found ok unparsed'.split()
    print(json.dumps([dict(zip(keys, row)) for row in rows]))
    sys.exit(0)
stop = False
for project, spec, required, fatal, why, found, ok, unparsed in rows:
    if ok is not False:
        continue
    if found is None:
        have = 'is not installed'
    elif unparsed:
        have = shown(found) + ' is installed, which does not parse as a version,'
    else:
        have = shown(found) + ' is installed'
    level = 'error' if fatal else 'warning'
    print('%%s: %%s %%s here, expected %%s%%s: %%s' %% (level, project, have, project, spec, why), file=sys.stderr)
    if fatal:
        stop = True
        print('hint: pip install %%r (in this environment), then start again' %% (project + spec), file=sys.stderr)
sys.exit(%d if stop else 0)
"""


def check_program(pin: Pin) -> str:
    """The program for ``pin`` (exit 3 and an error naming both versions where a fatal one is off)."""
    literal = repr([(e.project, e.spec, e.required, e.fatal, e.why) for e in expected(pin)])
    program = _PROGRAM % (literal, MISMATCH_EXIT)
    if '"' in program:  # a pin's values come from pins.yaml, checked there; a double quote would not survive
        raise ValueError(f"pin {pin.name}: its serving environment cannot be written without a double quote")
    return program


def requires_dist(pin: Pin) -> dict[str, str]:
    """The Requires-Dist narrowing a wheel of ``pin`` carries: project -> specifiers (its recorded ranges)."""
    return {TRANSFORMERS: pin.transformers} if pin.transformers else {}
