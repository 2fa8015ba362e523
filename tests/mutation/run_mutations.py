"""A mutation check over the index, recipe rules per pin, validate, the acceptance report and the pinned overlay:
each mutation is one realistic one-line bug (a flipped comparison, a dropped check, the wrong file or digest),
applied to a copy of this checkout, and the offline tests that cover its file are run against it. A mutation the
tests fail on is caught; one they pass is a survivor: a behaviour no test holds.

Not collected by pytest (no test_ prefix) and not run in CI: a full pass runs the covering tests once per
mutation (minutes). Usage, from the checkout's root::

    python tests/mutation/run_mutations.py                     # every mutation, this checkout's tests
    python tests/mutation/run_mutations.py --only idx-dotdot   # one (or several) by id
    python tests/mutation/run_mutations.py --tests-from REF    # the tests of git REF (e.g. before new tests)
    python tests/mutation/run_mutations.py --list              # the ids and what each breaks

Each mutation names its file, the exact text it replaces (which must occur once: a stale mutation is reported,
not run) and the replacement. The copy is made once into a temporary folder; each file is restored in a
``finally`` before the next mutation, and the folder is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "toolkit/g4build"

INDEX = ("tests/unit/index", "tests/integration/index/test_index_pip.py",
         "tests/integration/index/test_index_build.py")
VALIDATE = ("tests/unit/validate", "tests/integration/validate/test_validate_small.py",
            "tests/integration/validate/test_validate_claims.py",
            "tests/integration/validate/test_validate_untrusted_binaries.py",
            "tests/integration/overlay/test_overlay_small.py")
ACCEPTANCE = ("tests/unit/gpu_scripts/test_acceptance.py",)
RECIPES = ("tests/unit/recipes", "tests/integration/recipes/test_recipe_draft_groups.py",
           "tests/integration/recipes/test_recipe_cli.py", "tests/unit/cli/test_first_hour.py")
OVERLAY = ("tests/unit/overlay", "tests/integration/overlay/test_overlay_small.py",
           "tests/integration/overlay/test_overlay_venv.py", "tests/integration/overlay/test_overlay_pinned_small.py")


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    breaks: str  # the behaviour the bug breaks
    source: str = "own"  # "issue": one of the 17; "network": the pinned overlay path the issue found held only
    # by tests marked network or heavy (it counts seven)


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    # --- index build -------------------------------------------------------------------------------------------
    M("idx-publish-good-ones", f"{PKG}/index/site.py", "        if failed:\n", "        if failed and not entries:\n",
      INDEX, "one failing wheel among good ones still stops the build", "issue"),
    M("idx-validate-source", f"{PKG}/index/site.py", "validate_wheel(copy, ValidateOptions(pin=pin))",
      "validate_wheel(wheel, ValidateOptions(pin=pin))", INDEX, "the served copy is what is validated", "issue"),
    M("idx-publish-deletes", f"{PKG}/index/site.py", "        os.rename(out, aside)\n",
      "        shutil.rmtree(out)\n", INDEX, "the earlier site is moved aside, not deleted, until the new lands",
      "issue"),
    M("idx-dotdot", f"{PKG}/index/entry.py", 'if not _FILENAME.match(name) or ".." in name:',
      "if not _FILENAME.match(name):", INDEX, "a '..' in a wheel name is refused", "issue"),
    M("idx-no-restore", f"{PKG}/index/site.py", "            os.rename(aside, out)\n", "            pass\n",
      INDEX, "a failed publish puts the earlier site back"),
    M("idx-sha-of-metadata", f"{PKG}/index/entry.py", "sha256=file_sha256(path),",
      "sha256=hashlib.sha256(metadata).hexdigest(),", INDEX, "links carry the wheel's own sha256"),
    M("idx-any-folder", f"{PKG}/index/site.py",
      "if out.is_dir() and any(out.iterdir()) and (why := site_problem(out)):", "if False:", INDEX,
      "the site replaces only an earlier site or an empty folder"),
    M("idx-oldest-first", f"{PKG}/index/pages.py", "key=lambda e: Version(e.version), reverse=True)",
      "key=lambda e: Version(e.version), reverse=False)", INDEX, "newest version first on every page"),
    M("idx-no-requires-python", f"{PKG}/index/pages.py",
      "            attrs.append(f'data-requires-python=\"{escape(e.requires_python)}\"')", "            pass",
      INDEX, "links carry data-requires-python"),
    M("idx-bad-specifier-ok", f"{PKG}/index/entry.py", "            SpecifierSet(requires)", "            pass",
      INDEX, "an invalid Requires-Python is refused"),
    # --- validate ----------------------------------------------------------------------------------------------
    M("val-no-pin-series-check", f"{PKG}/validate/wheel.py", "    if pin_name and claimed_pin != pin_name:",
      "    if pin_name and claimed_pin != pin_name and False:", VALIDATE,
      "a wheel made for another pin fails the series check", "issue"),
    M("val-missing-fingerprint-file", f"{PKG}/validate/wheel.py",
      '                problems.append(f"{name}: {rel} is not in the wheel")', "                pass", VALIDATE,
      "a fingerprinted file missing from the wheel is reported", "issue"),
    M("val-arch-specific-any-major", f"{PKG}/validate/wheel.py",
      "        if pattern.search(name) and target.major not in majors:", "        if pattern.search(name):",
      VALIDATE, "FA3/FlashMLA are checked on the generations that use them", "issue"),
    M("val-family-ptx-any-major", f"{PKG}/validate/fatbin.py",
      "            return self.arch.major == target.major and self.arch.minor <= target.minor",
      "            return (self.arch.major, self.arch.minor) <= (target.major, target.minor)", VALIDATE,
      "family (f) PTX JIT-compiles only within its major", "issue"),
    M("val-sass-any-major", f"{PKG}/validate/fatbin.py",
      'if self.kind != "sass" or self.arch.major != target.major:', 'if self.kind != "sass":', VALIDATE,
      "SASS runs only on its own major"),
    M("val-arch-ptx-newer", f"{PKG}/validate/fatbin.py",
      "            return (self.arch.major, self.arch.minor) == (target.major, target.minor)",
      "            return (self.arch.major, self.arch.minor) <= (target.major, target.minor)", VALIDATE,
      "arch-specific (a) PTX JIT-compiles only for its own arch"),
    M("val-no-pin-version", f"{PKG}/validate/wheel.py",
      "    if pin_version and version.public != Version(pin_version).public:", "    if False:", VALIDATE,
      "a wheel of another version than the pin's fails"),
    M("val-no-digest-label", f"{PKG}/validate/wheel.py", '        if not label.endswith(f"g4.{digest}"):',
      "        if False:", VALIDATE, "the local label ends with the manifest's digest"),
    M("val-skipped-counted", f"{PKG}/validate/wheel.py",
      'none = [r.file for r in reports if r.verdicts.get(sm) == "none" and r.fatbins and r.file not in skipped]',
      'none = [r.file for r in reports if r.verdicts.get(sm) == "none" and r.fatbins]', VALIDATE,
      "a library vLLM does not use on the arch does not fail its verdict"),
    M("val-no-code-passes", f"{PKG}/validate/wheel.py",
      '        checks.extend(Check(name=f"verdict {t.sm()}", ok=False,',
      '        checks.extend(Check(name=f"verdict {t.sm()}", ok=True,', VALIDATE,
      "an arch asked of a wheel with no CUDA code is no pass"),
    M("val-fingerprint-inverted", f"{PKG}/validate/wheel.py", "for t in texts if t not in content)",
      "for t in texts if t in content)", VALIDATE, "a fingerprint text missing from its file is reported"),
    # --- the acceptance report ---------------------------------------------------------------------------------
    M("acc-tolerance-5pct", "tests/gpu/e2e/acceptance_report.py", "ACCEPTANCE_TOLERANCE = 0.02",
      "ACCEPTANCE_TOLERANCE = 0.05", ACCEPTANCE, "acceptance length within 2% of the reference", "issue"),
    M("acc-greedy-shared-only", "tests/gpu/e2e/acceptance_report.py",
      '"greedy_equal": bool(ids) and not differ and set(a) == set(b)}', '"greedy_equal": bool(ids) and not differ}',
      ACCEPTANCE, "greedy equality over every request of both runs", "issue"),
    M("acc-tolerance-strict", "tests/gpu/e2e/acceptance_report.py", "<= ACCEPTANCE_TOLERANCE * want}",
      "< ACCEPTANCE_TOLERANCE * want}", ACCEPTANCE, "exactly 2% away is within"),
    M("acc-one-sided", "tests/gpu/e2e/acceptance_report.py", '"ok": abs(got - want) <=', '"ok": (got - want) <=',
      ACCEPTANCE, "a run below the reference by more than 2% fails"),
    M("acc-empty-equal", "tests/gpu/e2e/acceptance_report.py", '"greedy_equal": bool(ids) and not differ',
      '"greedy_equal": not differ', ACCEPTANCE, "nothing compared is no greedy equality"),
    # --- recipes: rules per pin ----------------------------------------------------------------------------------
    M("rec-prefix-no-eagle3", f"{PKG}/recipes/prefix_cache.py", '"eagle": "an EAGLE", "eagle3": "an EAGLE-3", ',
      '"eagle": "an EAGLE", ', RECIPES, "0.29.0's prefix warning covers EAGLE-3 drafters", "issue"),
    M("rec-linear-backend-any-pin", f"{PKG}/recipes/renamed_env.py",
      "if mapped is not None and (options is None or row.option not in options):",
      "if mapped is not None and options is None:", RECIPES,
      "a variable is respelled only for a pin that has the option", "issue"),
    M("rec-env-case", f"{PKG}/recipes/renamed_env.py", "    key = value.strip().lower()", "    key = value.strip()",
      RECIPES, "an env value is matched case-insensitively", "issue"),
    M("rec-bool-as-int", f"{PKG}/recipes/vllm_args.py", "    if isinstance(value, bool) or not isinstance(value, int):",
      "    if not isinstance(value, int):", RECIPES, "a bool is no integer for an int option", "issue"),
    M("rec-sm121-on-sm120", f"{PKG}/recipes/wheelfit.py",
      "if built_for is not None and built_for.number == wanted.number:",
      "if built_for is not None and built_for.major == wanted.major:", RECIPES,
      "a build for another arch of the same major warns", "issue"),
    M("rec-macos-in-powershell", f"{PKG}/recipes/wheelfit.py", '    if shell == "powershell" and not windows:',
      '    if shell == "powershell" and linux:', RECIPES, "a PowerShell script refuses a macOS wheel", "issue"),
    M("rec-kv-boundary", f"{PKG}/recipes/draft_groups.py", "    size = hi if hi < lo * SPLIT_FACTOR else lo",
      "    size = hi if hi <= lo * SPLIT_FACTOR else lo", RECIPES, "KV group size at exactly 1.5x", "issue"),
    M("rec-prefix-caching-off", f"{PKG}/recipes/prefix_cache.py",
      "    return str(on).lower() in FALSE or (off is not None and str(off).lower() not in FALSE)",
      "    return str(on).lower() in FALSE", RECIPES, "no-enable-prefix-caching silences the warning"),
    M("rec-prefix-retention-zero", f"{PKG}/recipes/prefix_cache.py",
      'if value is not None and str(value).strip() not in ("0", ""):', "if value is not None:", RECIPES,
      "a retention of 0 is the default, not a set value"),
    M("rec-prefix-ignores-wheel", f"{PKG}/recipes/prefix_cache.py",
      "    return wheel_pin or (ctx.pin.name if ctx.pin is not None else recipe.pin)",
      "    return ctx.pin.name if ctx.pin is not None else recipe.pin", RECIPES, "the warning follows the wheel's pin"),
    M("rec-groups-split", f"{PKG}/recipes/draft_groups.py", "    if beside.groups[-1] > 1:",
      "    if beside.groups[-1] > 2:", RECIPES, "a drafter split over two groups is an error"),
    M("rec-bash-macos", f"{PKG}/recipes/wheelfit.py", '    if shell == "bash" and not linux:',
      '    if shell == "bash" and windows:', RECIPES, "a bash script warns for a macOS wheel"),
    M("rec-bound-ge", f"{PKG}/recipes/vllm_args.py", '"ge": value >= bound', '"ge": value > bound', RECIPES,
      "an integer at its lower bound passes"),
    # --- the pinned overlay (the seven network/heavy-only ones, offline) ---------------------------------
    M("ovl-no-whole-file-sha", f"{PKG}/overlay/wheel.py",
      "                    if isinstance(src, Streamed) and src.finish() != sha256:",
      "                    if isinstance(src, Streamed) and src.finish() != sha256 and False:", OVERLAY,
      "a streamed wheel is the pin's only if its whole file's sha256 is", "network"),
    M("ovl-no-require-pin", f"{PKG}/overlay/wheel.py", "    if require_pin:\n", "    if False:\n", OVERLAY,
      "the registry wheel that is not the pin's is refused", "network"),
    M("ovl-no-fallback", f"{PKG}/overlay/wheel.py", "                    if found == ref.sha256.lower():",
      "                    if True:", OVERLAY, "a copy under the pin's name that is not the pin's is verified",
      "network"),
    M("ovl-never-pinned", f"{PKG}/overlay/wheel.py", "sha256=ref.sha256.lower(), check=check,",
      "sha256=None, check=check,", OVERLAY, "the pin's wheel is streamed, not verified member by member", "network"),
    M("ovl-manifest-sha", f"{PKG}/overlay/wheel.py", "if isinstance(src, Streamed) else src.sha256},",
      "if isinstance(src, Streamed) else sha256},", OVERLAY, "the manifest names the source's own sha256", "network"),
    M("ovl-pin-ref-none", f"{PKG}/overlay/sourcecheck.py",
      "    return next((ref for ref in pin.wheels.values() if ref.file == source.name), None)", "    return None",
      OVERLAY, "a file named as the pin's wheel is held against its sha256", "network"),
    M("ovl-cli-no-refetch", f"{PKG}/cli/overlay.py", "            if not registry:\n", "            if True:\n",
      OVERLAY, "a damaged cached registry wheel is fetched again", "network"),
    M("ovl-cli-not-registry", f"{PKG}/cli/overlay.py", "    registry = wheel is None  #", "    registry = False  #",
      OVERLAY, "the pin's registry wheel (cached) must be the pin's bytes", "network"),
    M("ovl-cli-require-pin-off", f"{PKG}/cli/overlay.py", "require_pin=registry, check=", "require_pin=False, check=",
      OVERLAY, "a cached registry wheel that is not the pin's is refused, not verified as the user's", "network"),
    M("ovl-fetch-unverified", f"{PKG}/overlay/registry.py",
      "fetch_verified(PROJECT, ref.file, ref.sha256,", "fetch_verified(PROJECT, ref.file, None,", OVERLAY,
      "the registry wheel is verified while it downloads"),
)


def _more_mutations() -> tuple[Mutation, ...]:
    """The mutations kept beside this file, one module per topic (``sets/<topic>.py``, each a ``MUTATIONS``
    tuple built with this module's ``Mutation``): later passes add a module instead of growing this list."""
    import importlib.util

    found: list[Mutation] = []
    for path in sorted((Path(__file__).parent / "sets").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"g4build_mutation_sets.{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found.extend(module.MUTATIONS)
    return tuple(found)


def copy_tree(dest: Path, tests_from: str | None) -> None:
    """This checkout's files (tracked and untracked, not ignored) into ``dest``; the tests of git ``tests_from``
    instead of the checkout's when given."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not (tests_from and rel.startswith("tests/")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    if tests_from:
        archive = subprocess.run(["git", "archive", tests_from, "tests"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run_tests(tree: Path, tests: tuple[str, ...], network: bool, timeout: int,
              deselect: tuple[str, ...] = ()) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout' | 'none', seconds, last lines) of the covering tests that exist in ``tree``."""
    present = [t for t in tests if (tree / t).exists()]
    if not present:
        return "none", 0.0, "no covering test file in this tree"
    env = {k: v for k, v in os.environ.items() if k not in ("G4BUILD_HOME", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "toolkit"), str(tree)])
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *present,
               *(f"--deselect={d}" for d in deselect)]
    if not network:
        command[4:4] = ["-m", "not network and not heavy"]
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start, ""
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return ("pass" if done.returncode == 0 else "fail"), time.monotonic() - start, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutations only")
    parser.add_argument("--tests-from", metavar="REF", help="use the tests of this git ref (e.g. the base commit)")
    parser.add_argument("--network", action="store_true", help="also run tests marked network or heavy")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per test run (default 900)")
    parser.add_argument("--deselect", action="append", default=[], metavar="NODEID",
                        help="leave out a test that fails unmutated (repeatable; a failing baseline proves nothing)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)
    every = MUTATIONS + _more_mutations()
    ids = [m.id for m in every]
    if len(ids) != len(set(ids)):
        parser.error(f"mutation ids twice: {sorted({i for i in ids if ids.count(i) > 1})}")
    chosen = [m for m in every if not args.only or m.id in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        unknown = sorted(set(args.only) - {m.id for m in every})
        parser.error(f"unknown mutation id(s): {', '.join(unknown)} (see --list)")
    if args.list:
        for m in chosen:
            print(f"{m.id:32} {m.source:8} {m.file}: {m.breaks}")
        return 0
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="g4build-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree, args.tests_from)
        for tests in dict.fromkeys(m.tests for m in chosen):  # unmutated first: a failing baseline proves nothing
            outcome, seconds, tail = run_tests(tree, tests, args.network, args.timeout, tuple(args.deselect))
            print(f"baseline {' '.join(tests)}: {outcome} ({seconds:.0f}s)", flush=True)
            if outcome not in ("pass", "none"):
                print(tail, file=sys.stderr)
                return 1
        for m in chosen:
            path = tree / m.file
            original = path.read_text(encoding="utf-8")
            if original.count(m.old) != 1:
                outcome, seconds, tail = "stale", 0.0, f"the old text occurs {original.count(m.old)} times"
            else:
                try:
                    path.write_text(original.replace(m.old, m.new), encoding="utf-8")
                    outcome, seconds, tail = run_tests(tree, m.tests, args.network, args.timeout,
                                                       tuple(args.deselect))
                finally:
                    path.write_text(original, encoding="utf-8")
            verdict = {"fail": "caught", "pass": "SURVIVED"}.get(outcome, outcome)
            print(f"{verdict:9} {m.id:32} [{m.source}] {seconds:5.0f}s  {m.breaks}", flush=True)
            results.append({"id": m.id, "source": m.source, "file": m.file, "verdict": verdict,
                            "seconds": round(seconds, 1), "tail": tail})
    caught = sum(r["verdict"] == "caught" for r in results)
    survived = [str(r["id"]) for r in results if r["verdict"] == "SURVIVED"]
    others = [f"{r['id']} ({r['verdict']})" for r in results if r["verdict"] not in ("caught", "SURVIVED")]
    for source in ("issue", "network", "own"):
        mine = [r for r in results if r["source"] == source]
        if mine:
            print(f"{source:8} caught {sum(r['verdict'] == 'caught' for r in mine)} of {len(mine)}")
    print(f"total    caught {caught} of {len(results)}; survived: {', '.join(survived) or 'none'}"
          + (f"; not run: {', '.join(others)}" if others else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if not survived and not others else 3


if __name__ == "__main__":
    raise SystemExit(main())
