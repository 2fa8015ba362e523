"""Fixtures for the wheels tests (defined in wheelsfactory, shared with the integration tests)."""

from tests.unit.wheels.wheelsfactory import project, series_specs, small_wheel

__all__ = ["project", "series_specs", "small_wheel"]
