"""Running `gym ...` from a test: in this process, or as a process of its own.

In this process is the default: a `gym` process spends ~6 s importing torch and the model stack before it does
anything (15 s on a loaded CI worker), and most tests only need the exit status and the message. A test keeps a
real process where the process itself is under test: its exit status as the shell sees it, a crash past Python,
what a fresh interpreter imports, signals.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def gym_here(*args: object, capfd: pytest.CaptureFixture[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gym ARGS` through gym.cli.main in this process, as a CompletedProcess (exit status, stdout, stderr).

    With `capfd`, the output is read at the file descriptors, so what a library writes there past Python (a C
    extension's warning, a child's output) is seen as a process's would be; without it, at sys.stdout/stderr.
    """
    from gym.cli import main

    argv = [str(a) for a in args]
    if capfd is not None:
        capfd.readouterr()  # what came before is not this command's
        code = _exit_status(main, argv)
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["gym", *argv], code, out, err)
    out_buffer, err_buffer = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_buffer), contextlib.redirect_stderr(err_buffer):
        code = _exit_status(main, argv)
    return subprocess.CompletedProcess(["gym", *argv], code, out_buffer.getvalue(), err_buffer.getvalue())


def gym_process(*args: object, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`gym ARGS` as a process of its own (`python -m gym.cli`, the interpreter running the tests)."""
    return subprocess.run([sys.executable, "-m", "gym.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, input=stdin, timeout=timeout)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Gym's contract for bad input and known failures: exit status 2, one `gym: error:` message holding every
    fragment, and no traceback."""
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count("gym: error:") == 1, done.stderr[-2000:]
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr[-2000:]


def assert_only_an_error_line(stderr: str, *fragments: str) -> None:
    """Stricter, for commands that print nothing else before they fail (a server refusing to start): stderr is the
    one `gym: error:` line, holding every fragment."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("gym: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr


def _exit_status(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return int(main(argv))
    except SystemExit as exit_:  # argparse's usage errors and --help leave through SystemExit, as from a process
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        return 1  # sys.exit("message"), as Python's own exit status for it
