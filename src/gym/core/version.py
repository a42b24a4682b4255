"""Gym's version, read by setuptools (pyproject's dynamic version) and written into every manifest."""

__version__ = "0.1.0"
