"""The one interface host probing (builder.host, and doctor above it) uses to look at the machine: run a command,
read a file, ask the host.

``SystemProbe`` is the real machine. Tests use a recorder that answers from recorded tool outputs, so every
check runs against the real formats of nvidia-smi, nvcc, vswhere and friends without those tools.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str = ""


class Probe(Protocol):
    """What host probing may ask. Each method answers None when the thing is absent or cannot be read."""

    system: str  # "linux", "windows" or "darwin"

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult | None: ...

    def read_text(self, path: str) -> str | None: ...

    def env(self, name: str) -> str | None: ...

    def cpu_count(self) -> int | None: ...

    def memory_bytes(self) -> int | None: ...

    def free_disk_bytes(self, path: str) -> int | None: ...

    def registry_dword(self, key: str, name: str) -> int | None: ...

    def docker_ping(self, timeout: float) -> str: ...


def _system() -> str:
    if sys.platform.startswith("win"):
        return "windows"
    return "darwin" if sys.platform == "darwin" else "linux"


class SystemProbe:
    """The real machine."""

    def __init__(self) -> None:
        self.system = _system()

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult | None:
        exe = shutil.which(argv[0]) or (argv[0] if os.path.isfile(argv[0]) else None)
        if exe is None:
            return None
        try:
            proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                                  encoding="utf-8", errors="replace", check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return CommandResult(returncode=-1, stdout="", stderr=f"{type(exc).__name__}: {exc}")
        return CommandResult(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)

    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return None

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def cpu_count(self) -> int | None:
        return os.cpu_count()

    def memory_bytes(self) -> int | None:
        if self.system == "windows":
            return _windows_memory()
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None

    def free_disk_bytes(self, path: str) -> int | None:
        probe = os.path.abspath(path)
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        try:
            return shutil.disk_usage(probe).free
        except OSError:
            return None

    def registry_dword(self, key: str, name: str) -> int | None:
        return _registry_dword(key, name)

    def docker_ping(self, timeout: float) -> str:
        """The engine's version when it answers; raises with the reason when it does not."""
        import docker

        client = docker.from_env(timeout=int(max(1, timeout)))
        try:
            client.ping()
            return str(client.version().get("Version", "unknown"))
        finally:
            client.close()


class MemoryStatusEx(ctypes.Structure):
    """Win32 MEMORYSTATUSEX, as GlobalMemoryStatusEx fills it (64 bytes; DWORD is 32 bits on every Windows, so
    c_uint32, not c_ulong, keeps the layout right when decoded on another OS)."""

    _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32),
                ("ullTotalPhys", ctypes.c_uint64), ("ullAvailPhys", ctypes.c_uint64),
                ("ullTotalPageFile", ctypes.c_uint64), ("ullAvailPageFile", ctypes.c_uint64),
                ("ullTotalVirtual", ctypes.c_uint64), ("ullAvailVirtual", ctypes.c_uint64),
                ("ullAvailExtendedVirtual", ctypes.c_uint64)]


def total_physical(raw: bytes) -> int | None:
    """Installed RAM from the bytes of a filled MEMORYSTATUSEX; None when they are not one."""
    if len(raw) != ctypes.sizeof(MemoryStatusEx):
        return None
    status = MemoryStatusEx.from_buffer_copy(raw)
    if status.dwLength != ctypes.sizeof(MemoryStatusEx) or not status.ullTotalPhys:
        return None
    return int(status.ullTotalPhys)


if sys.platform == "win32":  # type checkers skip this block elsewhere, and so does Python
    import winreg

    def _registry_dword(key: str, name: str) -> int | None:
        hive, _, sub = key.partition("\\")
        root = {"HKLM": winreg.HKEY_LOCAL_MACHINE, "HKCU": winreg.HKEY_CURRENT_USER}[hive]
        try:
            with winreg.OpenKey(root, sub) as handle:
                value, _kind = winreg.QueryValueEx(handle, name)
        except OSError:
            return None
        return int(value)

    def _windows_memory() -> int | None:
        status = MemoryStatusEx()
        status.dwLength = ctypes.sizeof(MemoryStatusEx)
        if not ctypes.WinDLL("kernel32").GlobalMemoryStatusEx(ctypes.byref(status)):
            return None
        return total_physical(bytes(status))

else:

    def _registry_dword(key: str, name: str) -> int | None:
        return None

    def _windows_memory() -> int | None:
        return None
