"""Names of the files Gym writes next to a model, and the atomic way to write them.

Every artefact (a trained output, a checkpoint, a delta, a converted model) is written under a
temporary name in its final folder and renamed into place, so a crash never leaves half a file
where a finished one is expected.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_FILE = "gym_config.yaml"  # the resolved config a run was made with
MANIFEST_FILE = "gym_manifest.json"  # present only in a finished output: what it is, from which base
LOG_FILE = "trainer_log.jsonl"  # one JSON object per logged step
FORMAT_VERSION = 1


def temp_path(final: str | os.PathLike[str], tag: str = "tmp") -> Path:
    """A hidden sibling of `final`, unique to this process, for writing before the rename."""
    final = Path(final)
    return final.with_name(f".{final.name}.{tag}-{os.getpid()}")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file and a rename: readers see the old or the new file."""
    path = Path(path)
    tmp = temp_path(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
