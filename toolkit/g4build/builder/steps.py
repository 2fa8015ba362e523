"""What a build runs: the environment every step sees, and the steps of a vLLM build in order around the OS's
own (the series, torch, the wheel, FlashInfer, the manifest, validation, launch scripts), or the one step of any
CUDA extension (``extension_plan``). Pure: no filesystem, no subprocess, no clock."""

from __future__ import annotations

from collections.abc import Sequence

from g4build.builder.arch import cuda_arch_list, flashinfer_arch_list
from g4build.builder.flashinfer_aot import PACKAGE
from g4build.builder.kernels import build_option_args
from g4build.builder.plan import BuildPlan, Layout, Options, Step, Target
from g4build.pins.model import Pin
from g4build.series.deps import BuildSeries

FLASHINFER_REMOTE = "https://github.com/flashinfer-ai/flashinfer.git"
# `python -m build --no-isolation` builds against what is installed: install `build` and the project's own
# [build-system] requires (read from its pyproject.toml, so a new FlashInfer release needs no change here).
BUILD_REQUIRES = (
    "import subprocess, sys; "
    "pip = lambda *a: subprocess.check_call([sys.executable, '-m', 'pip', 'install', *a]); "
    "pip('build'); "
    "toml = __import__('tomllib' if sys.version_info >= (3, 11) else 'tomli'); "
    "pip(*toml.load(open('pyproject.toml', 'rb'))['build-system']['requires'])"
)


def build_env(target: Target, pin: Pin | None, version: str, layout: Layout, opts: Options) -> dict[str, str]:
    """The environment every step of a vLLM build sees (the OS module adds its own on top)."""
    env = {
        "TORCH_CUDA_ARCH_LIST": cuda_arch_list(target.arch, target.cuda),
        "MAX_JOBS": str(opts.jobs),
        "NVCC_THREADS": str(opts.nvcc_threads),
        "CMAKE_BUILD_TYPE": "Release",
        "VLLM_TARGET_DEVICE": "cuda",
        "SETUPTOOLS_SCM_PRETEND_VERSION": version,
        "VLLM_VERSION_OVERRIDE": version,
        # prefetched FetchContent sources (FETCHCONTENT_SOURCE_DIR_*, VLLM_*_SRC_DIR) as a CMake initial cache
        "CMAKE_ARGS": f"-C {layout.deps_file}",
        "FETCHCONTENT_BASE_DIR": layout.join("fetchcontent"),
        # vLLM's developer switch, blanked should the user's environment export it: set, vllm_flash_attn.cmake
        # installs FlashAttention 4's cute folder as a symlink to the source, its imports not rewritten (see
        # builder/deps.py); empty, it unsets the variable and the initial cache's FetchContent source is used
        "VLLM_FLASH_ATTN_SRC_DIR": "",
    }
    if opts.flashinfer and target.os != "windows":
        env["FLASHINFER_CUDA_ARCH_LIST"] = flashinfer_arch_list(target.arch, target.cuda)
    if opts.launcher is None:
        env["VLLM_DISABLE_SCCACHE"] = "1"
    else:
        if opts.launcher == "ccache":
            env["VLLM_DISABLE_SCCACHE"] = "1"  # vLLM prefers sccache when both exist; pick the one we found
        env.update(compiler_cache_env(opts.launcher, layout))
    if extra := build_option_args(opts.kernels, opts.flash_attn):
        env["CMAKE_ARGS"] = f"{env['CMAKE_ARGS']} {extra}"
    if orders_units(target, opts):  # setup.py configures and builds in one go: CMake itself names the wrapper
        env["CMAKE_ARGS"] += f" -DCMAKE_MAKE_PROGRAM={layout.build_order}{layout.sep}ninja"
    return env


def orders_units(target: Target, opts: Options) -> bool:
    """The build runs ninja through g4build's wrapper (a POSIX shell script: not on Windows)."""
    return opts.unit_order and target.os != "windows"


def compiler_cache_where(opts: Options, layout: Layout) -> str:
    """Where the compiler cache keeps units: sccache's shared backend when one is configured, else the folder."""
    if opts.launcher == "sccache" and opts.cache_backend:
        return f"{opts.cache_backend}, shared with every machine that uses it"
    return layout.compiler_cache


def compiler_cache_env(launcher: str, layout: Layout) -> dict[str, str]:
    """The compiler cache for every C, C++ and CUDA unit, named to CMake itself (vLLM's setup.py appends
    CMAKE_ARGS after its own choice, so this one wins), and its folder. The build's paths do not change with
    the series version (the source folder, the patched dependency copies), so after a Python-only series bump
    every unit is a cache hit: no nvcc runs."""
    launchers = " ".join(f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}" for lang in ("C", "CXX", "CUDA"))
    return {"CMAKE_ARGS": f"-C {layout.deps_file} {launchers}",
            "SCCACHE_DIR" if launcher == "sccache" else "CCACHE_DIR": layout.compiler_cache}


def build_series_steps(pin: Pin, build: Sequence[BuildSeries], layout: Layout, g4b: tuple[str, ...]) -> list[Step]:
    """One step per build series, after the prefetch: vLLM's own to the tree, a dependency's to a patched copy
    that the CMake initial cache then names. Always run (cheap once the copy exists): a prefetch that ran again
    rewrote the initial cache with the pristine copies."""
    steps = []
    for b in build:
        v = b.variant(pin.name)
        n = len(b.series.patches_for(pin.name))
        at = f" @ {v.commit[:12]}" if v is not None and v.commit else ""
        steps.append(Step(
            name=f"deps-{b.name}", title=f"patch {b.project}{at}: {b.name} v{b.version} ({n} patch{'es' * (n != 1)})",
            command=(*g4b, "deps", "apply", "--pin", pin.name, "--tree", layout.src, "--series", b.name,
                     "--cache", layout.cache, "--write", layout.deps_file),
            cwd=layout.root, resumable=False))
    return steps


def vllm_steps(
    *, pin: Pin, target: Target, layout: Layout, opts: Options, source: tuple[Step, ...], extra: tuple[Step, ...],
    version: str, pre: tuple[Step, ...] = (), build: Sequence[BuildSeries] = (),
) -> tuple[Step, ...]:
    g4b, py, src, out = opts.g4build, opts.python, layout.src, layout.out
    arch = target.arch.name
    # this build's wheel only: an --out folder may still hold wheels of earlier builds (other series versions)
    wheel = layout.sep.join([out, f"vllm-{version}-*.whl"])
    steps: list[Step] = [
        *pre,
        *source,
        Step(name="patches", title="apply the series", command=(*g4b, "patches", "apply", "--pin", pin.name,
             "--tree", src), cwd=layout.root),
        Step(name="prefetch", title="prefetch CMake dependencies",
             command=(*g4b, "prefetch", "--tree", src, "--cache", layout.cache, "--write", layout.deps_file),
             cwd=layout.root),
        *build_series_steps(pin, build, layout, g4b),
    ]
    # torch before anything that depends on it: the fork's requirements/windows.txt (xformers wants torch >= 2.10)
    # would otherwise pull PyPI's torch, which on Windows is the CPU build
    if opts.torch_index:
        steps.append(Step(name="torch-install", title=f"install torch {pin.torch} for CUDA {target.cuda}",
                          command=(*py, "-m", "pip", "install", f"torch=={pin.torch}", "--index-url",
                                   torch_index_url(opts.torch_index, target.cuda)), cwd=layout.root))
    # the program runs through `g4build build-check`, so the step reads as what it checks (cli/buildcheck.py)
    check = (*g4b, "build-check", "torch", *exe_words(py), "--torch", pin.torch, "--cuda", target.cuda)
    steps.append(Step(name="torch", title=f"check torch {pin.torch} for CUDA {target.cuda}", resumable=False,
                      command=check, cwd=layout.root))
    if opts.existing_torch:  # strips torch from requirements/*.txt, so no requirements below replace it
        steps.append(Step(name="use-existing-torch", title="build against the installed torch",
                          command=(*py, "use_existing_torch.py"), cwd=src))
    steps += extra
    steps.append(Step(name="build-requirements", title="install build requirements",
                      command=(*py, "-m", "pip", "install", "-r", "requirements/build/cuda.txt"), cwd=src))
    steps.append(Step(name="torch-kept", title="check the requirements kept that torch", resumable=False,
                      command=check, cwd=layout.root))
    if orders_units(target, opts):
        steps.append(Step(name="build-order", title="long compile units first", resumable=False,
                          command=(*g4b, "build-order", "--pin", pin.name, "--arch", arch,
                                   "--write", layout.build_order), cwd=layout.root))
    steps.append(wheel_step("vllm", "build the vLLM wheel", opts, src, out))
    if opts.flashinfer and target.os != "windows" and not opts.flashinfer_full:
        steps += flashinfer_aot_steps(pin, target, layout, opts)
    elif opts.flashinfer and target.os != "windows":
        fi = layout.join("flashinfer")
        steps += [
            Step(name="flashinfer-source", title="fetch FlashInfer",
                 command=("git", "clone", "--depth", "1", "--branch", f"v{pin.flashinfer}", "--recurse-submodules",
                          "--shallow-submodules", FLASHINFER_REMOTE, fi), cwd=layout.root, fresh=fi),
            Step(name="flashinfer-build-requirements", title="install FlashInfer's build requirements",
                 command=(*py, "-c", BUILD_REQUIRES), cwd=fi),
            Step(name="flashinfer-python", title="build flashinfer-python",
                 command=(*py, "-m", "build", "--no-isolation", "--wheel", "--outdir", out, "."), cwd=fi),
            Step(name="flashinfer-jit-cache", title=f"build FlashInfer's ahead-of-time kernels for {arch}",
                 command=(*py, "-m", "build", "--no-isolation", "--wheel", "--outdir", out, "."),
                 cwd=layout.sep.join([fi, "flashinfer-jit-cache"])),
        ]
    steps += [
        # the manifest goes into the wheel (and the wheel gets the tags its libraries justify) before validate
        # reads it: validate then sees the series the wheel carries and checks their fingerprints
        Step(name="manifest", title="write build-manifest.json into the wheel, tag it", resumable=False,
             command=(*g4b, "manifest", "--pin", pin.name, "--out", out, "--state", layout.state_file,
                      "--arch", arch, "--os", target.os, "--cuda", target.cuda,
                      "--kernels", opts.kernels, "--flash-attn", opts.flash_attn,
                      *(a for w in opts.flashinfer_wheels for a in ("--flashinfer-wheel", f"{w.filename}={w.sha256}"))),
             cwd=layout.root),
        Step(name="validate", title="validate the wheels", resumable=False,
             command=(*g4b, "validate", wheel, "--arch", arch, "--pin", pin.name),
             cwd=layout.root),
    ]
    shell = "powershell" if target.os == "windows" else "bash"
    steps += [Step(name=f"recipe-{name}", title=f"launch script {name}", resumable=False,
                   command=(*g4b, "recipe", "render", name, "--shell", shell, "--out", out,
                            "--wheel", wheel), cwd=layout.root)
              for name in opts.recipes]
    return tuple(steps)


def exe_words(python: tuple[str, ...]) -> tuple[str, ...]:
    """``--python-exe WORD`` for each word of the interpreter's command (`g4build build-check`)."""
    return tuple(x for word in python for x in ("--python-exe", word))


def torch_index_url(index: str, cuda: str) -> str:
    """A PyTorch package index URL for ``cuda``: ``{cu}`` in it stands for ``cu130``, ``cu129`` ..."""
    return index.replace("{cu}", "cu" + cuda.replace(".", ""))


def wheel_step(name: str, title: str, opts: Options, project: str, out: str) -> Step:
    """``pip wheel`` of a project against the installed build requirements (torch included)."""
    return Step(name=name, title=title, cwd=project,
                command=(*opts.python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-v",
                         "-w", out))


def extension_plan(
    *, target: Target, layout: Layout, opts: Options, project: str, name: str, version: str,
    cuda_home: str | None = None,
) -> BuildPlan:
    """A plan for any CUDA extension project with the environment a vLLM build gets (arch list, jobs,
    version, build type): the same machinery, small enough for CI to run for real."""
    env = {k: v for k, v in build_env(target, None, version, layout, opts).items()
           if k not in ("CMAKE_ARGS", "FETCHCONTENT_BASE_DIR", "VLLM_FLASH_ATTN_SRC_DIR")}
    if opts.launcher:  # the compiler cache without vLLM's dependency cache file
        env["CMAKE_ARGS"] = compiler_cache_env(opts.launcher, layout)["CMAKE_ARGS"].split(" ", 2)[2]
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
    step = wheel_step(name, f"build the {name} wheel", opts, project, layout.out)
    return BuildPlan(target=target, pin=name, version=version, layout=layout, env=env, setup=(), steps=(step,))


def flashinfer_aot_steps(pin: Pin, target: Target, layout: Layout, opts: Options) -> list[Step]:
    """The default FlashInfer route: only the JIT modules the launch recipes load (derived from them for the pin),
    compiled from the pin's flashinfer-python sdist into a jit-cache wheel beside vLLM's, then validated: every
    module with SASS for the arch. vLLM's own requirement brings flashinfer-python from the index."""
    arch_list = flashinfer_arch_list(target.arch, target.cuda)
    work = layout.join("flashinfer-aot")
    wheel = layout.sep.join([layout.out, f"{PACKAGE}-{pin.flashinfer}+g4jit.*.whl"])
    exe = ("--python-exe", opts.python[0]) if len(opts.python) == 1 else ()
    return [
        Step(name="flashinfer-aot", title=f"compile the recipes' FlashInfer modules for {arch_list}",
             command=(*opts.g4build, "flashinfer-aot", "--pin", pin.name, "--arch", arch_list, "--out", layout.out,
                      "--work", work, "--jobs", str(opts.jobs), *exe), cwd=layout.root),
        Step(name="flashinfer-validate", title="validate the FlashInfer jit-cache wheel", resumable=False,
             command=(*opts.g4build, "validate", wheel, "--arch", target.arch.name), cwd=layout.root),
    ]
