"""User-facing failures.

Anything a user can cause (a bad config key, a malformed dataset row, a model that is not on disk)
raises a `GymError`; the CLI prints its message and exits with status 2. Bugs stay ordinary
exceptions so they keep their tracebacks.
"""

from __future__ import annotations


class GymError(Exception):
    """An error the user can fix; the message says how."""


class ConfigError(GymError):
    """An unknown key, a value of the wrong type, or an impossible combination of options."""


class DataError(GymError):
    """A dataset that is missing, malformed, or empty after filtering."""


class ModelError(GymError):
    """A model that cannot be found or loaded."""
