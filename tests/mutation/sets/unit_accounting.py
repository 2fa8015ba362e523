"""Mutations of the unit accounting (g4build.series.unitaccount) and the QuTLASS sm100 patch's data."""

from run_mutations import PKG, Mutation

TESTS = ("tests/unit/series/test_unit_accounting.py",)
INTEGRATION = ("tests/integration/builder/test_build_unit_accounting.py",)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("ua-unaccounted", f"{PKG}/series/unitaccount.py", "                unaccounted.add(unit)\n",
             "                pass\n", TESTS, "a unit no group names is reported, not passed over"),
    Mutation("ua-stale-glob", f"{PKG}/series/unitaccount.py",
             "    stale = [glob for g in accounting.groups for glob in g.units if glob not in used]\n",
             "    stale: list[str] = []\n", TESTS, "a glob naming no unit of the build is reported"),
    Mutation("ua-profile", f"{PKG}/series/unitaccount.py", "            elif profile not in hits[0].profiles:\n",
             "            elif False:\n", TESTS, "a unit compiled in a profile its group does not list is reported"),
    Mutation("ua-runs-or-kept", f"{PKG}/series/unitaccount.py",
             "or bool(runs) == bool(kept):\n", "or not (runs or kept):\n", TESTS,
             "a group says either what runs or why it is kept, never both"),
    Mutation("ua-kept-notes", f"{PKG}/series/unitaccount.py",
             "        return [g for g in self.groups if g.kept and profile in g.profiles]\n",
             "        return []\n", TESTS, "the plan names each group kept without running on the GPU"),
    Mutation("ua-arch-list", f"{PKG}/builder/planner.py", "        if arch_list != acc.arch_list:\n",
             "        if False:\n", TESTS, "an accounting for another arch list is not presented as this build's"),
    Mutation("ua-qutlass-sm100", "patches/deps/vllm-kernel-archs/units-sm120.yaml",
             "qutlass/qutlass/csrc/fused_quantize_nv.cu]", "qutlass/qutlass/csrc/fused_quantize_nv.cu,\n"
             "              qutlass/qutlass/csrc/*_sm100.cu]", TESTS,
             "the accounting names no unit the build leaves out (QuTLASS's sm100 units, 0004)"),
)
