"""The package's version: one place, read by both sides (hello) and by the build (pyproject)."""

__version__ = "0.1.0"
