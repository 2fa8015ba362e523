"""What vLLM's own CMakeLists compiles, per extension target, for an arch list and a kernel profile: its
extension section (from "Define other extension targets" to the end, FlashMLA, DeepGEMM and QuTLASS included)
run by CMake in script mode, with vLLM's utils.cmake and its real Marlin generators. Only what cannot run in
script mode is stubbed: target-level commands record or ignore their arguments, FetchContent hands out empty
folders, and FlashAttention (a build series of its own) and triton_kernels (Python only) are not read.
Machete's generator needs CUTLASS's Python library: its generated units are not listed (``machete_generated``
says where they would be)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

START = "#\n# Define other extension targets\n#\n"
SKIPPED = ("include(cmake/external_projects/vllm_flash_attn.cmake)",
           "include(cmake/external_projects/triton_kernels.cmake)")

_STUBS = r"""
function(define_extension_target NAME)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "WITH_SOABI" "DESTINATION;LANGUAGE;USE_SABI"
                        "SOURCES;ARCHITECTURES;COMPILE_FLAGS;INCLUDE_DIRECTORIES;LIBRARIES")
  foreach(_s IN LISTS ARG_SOURCES)
    message("G4BEVAL|SRC|${NAME}|${_s}")
  endforeach()
endfunction()
function(target_sources NAME)
  foreach(_s IN LISTS ARGN)
    if(NOT _s MATCHES "^(PRIVATE|PUBLIC|INTERFACE)$")
      message("G4BEVAL|SRC|${NAME}|${_s}")
    endif()
  endforeach()
endfunction()
function(target_compile_definitions NAME)
  foreach(_s IN LISTS ARGN)
    if(NOT _s MATCHES "^(PRIVATE|PUBLIC|INTERFACE)$")
      message("G4BEVAL|DEF|${NAME}|${_s}")
    endif()
  endforeach()
endfunction()
function(set_source_files_properties)
endfunction()
function(set_property KIND)
  if(NOT KIND STREQUAL "SOURCE")
    return()
  endif()
  set(_files)
  set(_defs)
  set(_in files)
  foreach(_a IN LISTS ARGN)
    if(_a STREQUAL "APPEND" OR _a STREQUAL "PROPERTY")
      set(_in name)
    elseif(_in STREQUAL "name")
      if(_a STREQUAL "COMPILE_DEFINITIONS")
        set(_in defs)
      else()
        set(_in other)
      endif()
    elseif(_in STREQUAL "files")
      list(APPEND _files "${_a}")
    elseif(_in STREQUAL "defs")
      list(APPEND _defs "${_a}")
    endif()
  endforeach()
  foreach(_f IN LISTS _files)
    foreach(_d IN LISTS _defs)
      message("G4BEVAL|SRCDEF|${_f}|${_d}")
    endforeach()
  endforeach()
endfunction()
function(target_include_directories)
endfunction()
function(target_compile_options)
endfunction()
function(target_link_libraries)
endfunction()
function(install)
endfunction()
function(add_custom_target)
endfunction()
function(add_custom_command)
endfunction()
"""

_FETCHCONTENT = r"""
function(FetchContent_Declare)
endfunction()
macro(FetchContent_MakeAvailable)
  foreach(_fc_name ${ARGN})
    set(${_fc_name}_SOURCE_DIR "${G4BEVAL_FC}/${_fc_name}")
    set(${_fc_name}_POPULATED TRUE)
  endforeach()
endmacro()
macro(FetchContent_Populate _fc_name)
  FetchContent_MakeAvailable(${_fc_name})
endmacro()
macro(FetchContent_GetProperties _fc_name)
endmacro()
"""


@dataclass
class Evaluated:
    """Sources per extension target (paths relative to the tree; fetched projects as ``<name>/...``), the
    compile definitions given to targets and to single sources, the kernel profile's record (G4B_LEFT_OUT,
    G4B_DEFS), and what the CMake log printed."""

    sources: dict[str, list[str]] = field(default_factory=dict)
    definitions: dict[str, list[str]] = field(default_factory=dict)
    source_definitions: dict[str, list[str]] = field(default_factory=dict)  # set_property(SOURCE ...)
    left_out: list[str] = field(default_factory=list)
    g4b_defs: list[str] = field(default_factory=list)
    log: str = ""

    def units(self, target: str | None = None) -> list[str]:
        """Compiled units (each .cu/.cpp a target lists, once), for one target or all."""
        names = [target] if target else sorted(self.sources)
        return [s for n in names for s in self.sources.get(n, []) if s.endswith((".cu", ".cpp"))]

    @property
    def machete_generated(self) -> bool:
        return "csrc/quantization/machete/machete_pytorch.cu" in self.units("_C")


def evaluation_tree(source: Path, dest: Path) -> Path:
    """A writable copy of what the evaluation reads (the generators write into csrc/)."""
    dest.mkdir(parents=True)
    shutil.copy2(source / "CMakeLists.txt", dest / "CMakeLists.txt")
    shutil.copytree(source / "cmake", dest / "cmake")
    shutil.copytree(source / "csrc", dest / "csrc")
    (dest / "vllm").mkdir()
    return dest


def evaluate(tree: Path, archs: str, work: Path, profile: str | None = None, cmake: str = "cmake") -> Evaluated:
    """Run the tree's extension section for CUDA 13.0 and ``archs``; ``profile`` None leaves
    G4B_KERNEL_PROFILE unset (the default a plain build gets)."""
    work.mkdir(parents=True, exist_ok=True)
    text = (tree / "CMakeLists.txt").read_text(encoding="utf-8")
    body = text[text.index(START):]
    for line in SKIPPED:
        assert body.count(line) == 1, line
        body = body.replace(line, "")
    modules = work / "modules"
    modules.mkdir(exist_ok=True)
    (modules / "FetchContent.cmake").write_text(_FETCHCONTENT, encoding="utf-8")
    fetched = work / "fc"
    (fetched / "flashmla" / "flash_mla").mkdir(parents=True, exist_ok=True)
    (fetched / "flashmla" / "flash_mla" / "flash_mla_interface.py").write_text("", encoding="utf-8")
    (fetched / "cutlass" / "include" / "cutlass").mkdir(parents=True, exist_ok=True)
    (fetched / "cutlass" / "include" / "cutlass" / "cutlass.h").write_text("", encoding="utf-8")
    machete = hashlib.md5((tree / "csrc/quantization/machete/generate.py").read_bytes()).hexdigest()
    lines = [
        "cmake_minimum_required(VERSION 3.26)",
        f'list(PREPEND CMAKE_MODULE_PATH "{modules.as_posix()}")',
        f'set(G4BEVAL_FC "{fetched.as_posix()}")',
        f'set(CUTLASS_INCLUDE_DIR "{(fetched / "cutlass" / "include").as_posix()}")',
        f'set(CMAKE_CURRENT_BINARY_DIR "{work.as_posix()}")',
        f'set(CMAKE_BINARY_DIR "{work.as_posix()}")',
        "set(CMAKE_CUDA_COMPILER_VERSION 13.0)",
        "set(VLLM_GPU_LANG CUDA)",
        f'set(CUDA_ARCHS "{archs}")',
        f'set(Python_EXECUTABLE "{Path(sys.executable).as_posix()}")',
        # Machete's generator needs CUTLASS's Python library: mark it as already run
        f'set(MACHETE_GEN_SCRIPT_HASH "{machete}" CACHE STRING "")',
        'include("cmake/utils.cmake")',
        "include(FetchContent)",
        _STUBS,
    ]
    if profile is not None:
        lines.append(f'set(G4B_KERNEL_PROFILE "{profile}" CACHE STRING "")')
    (work / "body.cmake").write_text(body, encoding="utf-8")
    lines += [f'include("{(work / "body.cmake").as_posix()}")',
              'message("G4BEVAL|VAR|G4B_LEFT_OUT|${G4B_LEFT_OUT}")', 'message("G4BEVAL|VAR|G4B_DEFS|${G4B_DEFS}")']
    script = work / "evaluate.cmake"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.run([cmake, "-P", str(script)], cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cmake -P failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = Evaluated(log=proc.stdout + proc.stderr)
    root, fc = tree.resolve().as_posix() + "/", fetched.resolve().as_posix() + "/"
    for line in proc.stderr.splitlines():
        if not line.startswith("G4BEVAL|"):
            continue
        _, kind, target, value = line.split("|", 3)
        if kind == "SRC":
            rel = value.removeprefix(root).removeprefix(fc)
            listed = out.sources.setdefault(target, [])
            if rel not in listed:  # CMake lists a source once per target
                listed.append(rel)
        elif kind == "DEF":
            out.definitions.setdefault(target, []).append(value)
        elif kind == "SRCDEF":
            out.source_definitions.setdefault(target.removeprefix(root), []).append(value)
        elif target == "G4B_LEFT_OUT":
            out.left_out = [v for v in value.split(";") if v]
        else:
            out.g4b_defs = [v for v in value.split(";") if v]
    return out
