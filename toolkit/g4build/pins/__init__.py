"""Stage 1, pin: the pinned upstream releases (``patches/pins.yaml``), the package index they come from, and
``pins add``."""
