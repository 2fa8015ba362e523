"""A launch script for a g4build-built wheel stops on a GPU the wheel has no kernels for (exit 20)."""

from run_mutations import PKG, Mutation

GUARD = f"{PKG}/recipes/gpu_guard.py"
TESTS = ("tests/integration/recipes/test_recipe_gpu_guard.py", "tests/unit/recipes/test_recipe_gpu_guard_rules.py")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("gpu-guard-bash-warns-only", GUARD, "        f\"    exit {EXIT_OTHER_GPU}\",\n", "", TESTS,
             "an H200 serves an sm_120-only wheel: some kernels silently do nothing, the output is garbage"),
    Mutation("gpu-guard-powershell-warns-only", GUARD, "        f\"        exit {EXIT_OTHER_GPU}\",\n", "", TESTS,
             "the PowerShell script serves on a GPU the wheel has no kernels for"),
    Mutation("gpu-guard-family-exact", GUARD, '        if self.suffix == "a":\n            return "exact"',
             '        if self.suffix in ("a", "f"):\n            return "exact"', TESTS,
             "a 12.0f wheel is refused on a 12.1 GPU (DGX Spark), which runs the 12.0 family"),
    Mutation("gpu-guard-ptx-ignored", GUARD, 'return "forward" if self.ptx and not self.suffix else "major"',
             'return "major"', TESTS, "a wheel with PTX the driver can JIT-compile is refused on a newer GPU"),
    Mutation("gpu-guard-overlay-stops", GUARD,
             'if not isinstance(manifest, dict) or manifest.get("route") != "build":',
             "if not isinstance(manifest, dict):", TESTS,
             "an overlay (its kernels are the registry wheel's) is stopped as if g4build had built them"),
    Mutation("gpu-guard-unbounded-list", GUARD, "if not items or len(items) > MAX_TARGETS:", "if not items:", TESTS,
             "a wheel's manifest writes an unbounded condition into the script"),
    Mutation("gpu-guard-not-wired", f"{PKG}/cli/recipe.py",
             "    ref = with_kernel_archs(with_flashinfer_wheels(wheel_ref(wheel, out), wheel, info), ctx.wheel)\n",
             "    ref = with_flashinfer_wheels(wheel_ref(wheel, out), wheel, info)\n", TESTS,
             "`recipe render --wheel` renders no guard: back to a warning"),
)
