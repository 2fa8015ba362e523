"""doctor's Docker engine check: whether one answers, and when not, why in one line."""

from __future__ import annotations

from g4build.builder.probe import Probe
from g4build.doctor.checks import Finding


def docker_reason(exc: BaseException) -> str:
    """Why the Docker engine did not answer, in one line: the SDK's own message nests the socket library's
    exceptions (``('Connection aborted.', FileNotFoundError(2, ...))``), which says nothing to a user."""
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in seen:
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(e) for e in seen)
    kinds = {type(e).__name__ for e in seen}
    if ("FileNotFoundError" in kinds or "FileNotFoundError" in text or "No such file" in text
            or "cannot find the file" in text):  # Windows: CreateFile on the engine's named pipe
        return "no Docker engine socket or pipe here (Docker is not installed or not started)"
    if "ConnectionRefusedError" in kinds or "Connection refused" in text:
        return "the Docker engine refused the connection (it is not running)"
    if "PermissionError" in kinds or "Permission denied" in text:
        return "permission denied on the Docker socket (this user may not use the engine)"
    if "timed out" in text.lower() or "Timeout" in " ".join(kinds):
        return "the Docker engine did not answer in time"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"the engine did not answer ({type(exc).__name__}: {first[:120]})"


def check_docker(probe: Probe, timeout: float = 3.0) -> list[Finding]:
    try:
        version = probe.docker_ping(timeout)
    except Exception as exc:  # the SDK raises many kinds; any means "not reachable"
        reason = docker_reason(exc)
        fix = "needed only for --executor docker and image references; start Docker (Desktop) or dockerd"
        if reason.startswith("permission"):
            fix = "needed only for --executor docker and image references; add this user to the docker group"
        return [Finding(check="docker", status="warn", summary=f"Docker engine not reachable: {reason}", fix=fix)]
    return [Finding(check="docker", status="ok", summary=f"Docker engine {version} answers")]
