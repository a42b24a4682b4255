"""The limits on uploaded files, apart from the files module so that `gym api`'s flags read their defaults without
importing the database."""

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
