"""Fixtures for the overlay tests: the small wheels and project of tests.support.wheelsfactory, and a spy on the
per-member verification of a source wheel (how many members each call hashed)."""

from __future__ import annotations

import zipfile

import pytest
from tests.support.wheelsfactory import project, series_specs, small_wheel

from g4build.overlay import sourcecheck
from g4build.wheelfile.safety import Hashed, hash_members

__all__ = ["project", "series_specs", "small_wheel", "spy"]


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many members each per-member verification hashed."""
    calls: list[int] = []
    real = hash_members

    def counting(data: bytes, infos: list[zipfile.ZipInfo], workers: int) -> list[Hashed]:
        calls.append(len(infos))
        return real(data, infos, workers)

    monkeypatch.setattr(sourcecheck, "hash_members", counting)
    return calls
