"""Mutations of the scoped FlashInfer build: the derived module list, the jit-cache wheel, its validation."""

from run_mutations import PKG, Mutation

RECIPES = ("tests/unit/recipes/test_recipe_flashinfer_modules.py",)
AOT = ("tests/unit/builder/test_build_flashinfer_aot.py",)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("fi-aot-sampler-zero-counts", f"{PKG}/recipes/flashinfer_modules.py",
             "                if int(value) != 0:\n", "                if int(value) >= 0:\n", RECIPES,
             "VLLM_USE_FLASHINFER_SAMPLER=0 would still compile the sampler"),
    Mutation("fi-aot-checkpoint-ignored", f"{PKG}/recipes/flashinfer_modules.py",
             "        if any(str(checkpoint.get(k) or \"\").lower() != v.lower() for k, v in trigger.checkpoint):\n",
             "        if False:\n", RECIPES, "a bf16 recipe would get the NVFP4 GEMM module"),
    Mutation("fi-aot-unknown-paths-pass", f"{PKG}/recipes/flashinfer_modules.py",
             "    if places:\n        raise RecipeError", "    if not places:\n        raise RecipeError", RECIPES,
             "a recipe reaching FlashInfer through a MoE/attention backend would build without its kernels"),
    Mutation("fi-aot-one-fatbin-enough", f"{PKG}/validate/jit_cache.py",
             "    missing = sum(1 for f in found.fatbins.fatbins if not any(e.runs_on(target) for e in f.entries))\n",
             "    missing = 0 if any(e.runs_on(target) for e in found.fatbins.entries) else 1\n", AOT,
             "a module with one translation unit lacking SASS for the arch would pass validation"),
    Mutation("fi-aot-extra-module-ok", f"{PKG}/validate/jit_cache.py",
             "    if extra or missing:\n", "    if missing:\n", AOT,
             "a jit-cache wheel holding modules it does not list would pass"),
    Mutation("fi-aot-g4-label", f"{PKG}/builder/flashinfer_aot.py", "+g4jit.{library_digest", "+g4.{library_digest",
             AOT, "the jit-cache wheel would claim g4 series without a build-manifest (validate's metadata check)"),
)
