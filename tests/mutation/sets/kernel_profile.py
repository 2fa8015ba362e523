"""Mutations of the kernel-profile data a plan reads (g4build.series.kernelprofile, the decisions' profile keys)."""

from run_mutations import PKG, Mutation

TESTS = ("tests/unit/series/test_kernel_profile.py",)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("kp-left-out-filter", f"{PKG}/series/kernelprofile.py", "if profile in d.left_out_in]",
             "if profile not in d.left_out_in]", TESTS, "a profile lists the families it leaves out, not the kept"),
    Mutation("kp-unknown-profile", f"{PKG}/series/kernelprofile.py", "    if profile not in KERNEL_PROFILES:\n",
             "    if not profile:\n", TESTS, "an unknown profile is a usage error, not a CMake argument"),
    Mutation("kp-family-pairing", f"{PKG}/series/deps.py", "    if bool(left_out) != bool(families):\n",
             "    if False:\n", TESTS, "a left-out family names the G4B_NO_ definition its bindings read"),
)
