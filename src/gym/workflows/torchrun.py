"""`python -m gym.workflows.torchrun ARGS`: PyTorch's torchrun with the same ARGS, where a failed rank ends in one
line naming it and its exit code instead of the launcher's own traceback and failure table.

The rank's own message (one line for Gym's errors, a traceback for a crash) is already printed above it by the
rank; torchrun's report after it only repeats where that happened, and a first-time user reads its traceback as
the cause. The exit code is the first failed rank's, so a config error found inside the ranks is still exit 2.
`GYM_DEBUG=1` (or `--debug` in the command the ranks run) keeps torchrun's report.
"""

from __future__ import annotations

import logging
import os
import signal
import sys


def failure_line(rank: int, exitcode: int) -> tuple[str, int]:
    """The one line that ends a run in which rank `rank` failed first, and the exit code to leave with: the
    rank's own, or 128 + the signal that killed it, as a shell reports a killed command."""
    where = f"rank {rank}"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (SIGKILL is often the out-of-memory killer)" if -exitcode == signal.SIGKILL else ""
        return f"gym: the run stopped: {where} was killed by {name}{hint}.", 128 - exitcode
    return (f"gym: the run stopped: {where} exited with code {exitcode}; its message is above.",
            exitcode if exitcode > 0 else 1)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("GYM_DEBUG", "").lower() in ("1", "true", "yes", "on")
    if not debug:  # the agent's own log of the failure ("failed (exitcode: 1) local_rank: 0 ...") repeats ours
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as failed:
        if debug:
            raise
        rank, failure = failed.get_first_failure()
        line, code = failure_line(rank, failure.exitcode)
        print(line, file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
