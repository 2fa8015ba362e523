"""One check's verdict: what wheel validation (``wheel``) and the smoke test (``smoke``) both report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    ok: bool
    detail: str
