"""Mutations of --kernels auto and its consequences: what auto picks per arch and tree, the refusal of a
profile the tree cannot build, the wheel's version names a build of fewer kernels, the manifest
step stamps the wheel of its own options, and the refusal's way out names the pins that have the profile."""

from run_mutations import PKG, Mutation

TESTS = ("tests/unit/builder/test_build_kernel_options.py",)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("ka-auto-profile", f"{PKG}/builder/kernels.py", 'AUTO_PROFILE = {"sm120": "gemma4"}',
             "AUTO_PROFILE: dict[str, str] = {}", TESTS,
             "--kernels auto builds every kernel for sm120 (the 20-minute desktop build is lost)"),
    Mutation("ka-auto-fallback", f"{PKG}/builder/kernels.py", "        if missing := implementing(want, uncovered):",
             "        if missing := implementing(want, ()):", TESTS,
             "auto claims gemma4 on a tree without the series that implements it (0.21.0's Windows base tree)"),
    Mutation("ka-refuse-by-name", f"{PKG}/builder/kernels.py", "    if missing := implementing(kernels, uncovered):",
             "    if missing := implementing(kernels, ()):", TESTS,
             "--kernels gemma4 on a tree without the profile's series is claimed, not refused"),
    Mutation("ka-version-words", f"{PKG}/builder/plan.py", " version_words(kernels, flash_attn))", " ())", TESTS,
             "a gemma4 wheel and an all wheel of one pin share a version (the launch script keeps the installed one)"),
    Mutation("ka-manifest-version", f"{PKG}/emit/write.py", 'kernels=kernels or "all",', 'kernels="all",', TESTS,
             "the manifest step stamps the wheel of the options it records, not an all build's left in --out"),
    Mutation("ka-way-to-pin", f"{PKG}/builder/kernels.py",
             "    if all(b.series.variant(pin) is not None for b in missing):\n", "    if True:\n", TESTS,
             "a pin the profile's series does not cover is told which pins have it, not WSL"),
    Mutation("ka-manifest-choices", f"{PKG}/builder/kernels.py",
             "    choices = (AUTO, *KERNEL_PROFILES) if auto else KERNEL_PROFILES\n",
             "    choices = (AUTO, *KERNEL_PROFILES)\n", TESTS,
             "`manifest --kernels auto` is not told auto is among its choices"),
    Mutation("ka-flash-attn-series", f"{PKG}/builder/kernels.py",
             'if flash_attn != "all" and (missing := [b for b in uncovered if b.name == FLASH_ATTN_SERIES]):',
             'if flash_attn != "all" and (missing := [b for b in uncovered if b.name == "none"]):', TESTS,
             "--flash-attn 2 on a pin without vllm-flash-attn is refused, not claimed while FA3 is built"),
)
