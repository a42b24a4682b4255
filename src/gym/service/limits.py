"""The limits on uploaded files and fine-tuning jobs, apart from the modules that use them so that `gym api`'s
flags read their defaults without importing the database."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileLimits:
    """What one upload and one user may store. Defaults: 64 MiB a file, 4 MiB a line (a 128k-token conversation
    is ~0.5 MB), a million rows, 1 GiB per user."""

    max_bytes: int = 64 << 20
    max_line_bytes: int = 4 << 20
    max_rows: int = 1_000_000
    quota_bytes: int = 1 << 30


@dataclass(frozen=True)
class JobLimits:
    """Each user's fine-tuning jobs: at most `max_queued` waiting (a creation past it is refused), at most
    `max_running` trained at once (the others wait their turn, whatever the number of workers)."""

    max_queued: int = 8
    max_running: int = 1
