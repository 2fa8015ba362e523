"""Mutations of FlashAttention 2's head-dim choice: the gemma4 profile's dims (g4build.builder.kernels) and the
vllm-flash-attn series' 0003 patch that compiles and dispatches only those (its CMake filter and switch)."""

from run_mutations import PKG, Mutation

PATCH = "patches/deps/vllm-flash-attn/vllm-0.21.0/0003-fa2-head-dims.patch"
UNIT = ("tests/unit/builder/test_build_kernel_options.py", "tests/unit/series/test_kernel_profile.py")
CMAKE = ("tests/integration/builder/test_build_fa_archs_cmake.py",)
DISPATCH = ("tests/integration/builder/test_build_fa2_dispatch.py",)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("fa2-dims-gemma4", f"{PKG}/builder/kernels.py", "GEMMA4_FA2_HEAD_DIMS = (128, 256)",
             "GEMMA4_FA2_HEAD_DIMS = (128,)", UNIT, "the sliding layers' 256 stays in the gemma4 profile"),
    Mutation("fa2-dims-cmake-group", PATCH, "if (NOT _G4_M OR CMAKE_MATCH_2 IN_LIST G4B_FA2_HEADDIMS)",
             "if (NOT _G4_M OR CMAKE_MATCH_1 IN_LIST G4B_FA2_HEADDIMS)", CMAKE,
             "the filter reads the head dim, not the split_ group"),
    Mutation("fa2-dims-switch-kept", PATCH, "+#if !defined(G4B_FA2_HEADDIMS_ONLY) || defined(G4B_FA2_HEADDIM_256)",
             "+#if !defined(G4B_FA2_HEADDIMS_ONLY)", DISPATCH, "a kept head dim dispatches to its kernel"),
)
