"""`python -m gym.webui.supervise JOB_FOLDER`: run a web UI job's command and record how it ended.

It leads the job's process group, so Stop's SIGINT reaches the command directly; the supervisor itself
only waits (it ignores SIGINT and SIGTERM through a Python handler, which the child does not inherit) and
then writes `exit_code` under a temporary name and renames it, so the page never reads half a number.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from gym.core.files import temp_path
from gym.webui.jobs import EXIT_FILE, JOB_FILE


def _wait_quietly(signum: int, frame: FrameType | None) -> None:
    """The signal was for the command (same process group); the supervisor waits for it to end."""


def main(folder: str) -> int:
    job = json.loads((Path(folder) / JOB_FILE).read_text(encoding="utf-8"))
    signal.signal(signal.SIGINT, _wait_quietly)
    signal.signal(signal.SIGTERM, _wait_quietly)
    try:
        code = subprocess.call(job["argv"], stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"gym webui: could not start {job['argv'][0]}: {exc}", flush=True)
        code = 127
    exit_file = Path(folder) / EXIT_FILE
    tmp = temp_path(exit_file)
    tmp.write_text(f"{code}\n")
    os.replace(tmp, exit_file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
