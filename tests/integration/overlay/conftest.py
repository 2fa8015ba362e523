"""Fixtures for the overlay tests: the small wheels and project of tests.support.wheelsfactory."""

from tests.support.wheelsfactory import project, series_specs, small_wheel

__all__ = ["project", "series_specs", "small_wheel"]
