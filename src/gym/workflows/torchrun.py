"""`python -m gym.workflows.torchrun ARGS`: PyTorch's torchrun with the same ARGS, where a failed rank ends in one
line naming it and its exit code instead of the launcher's own traceback and failure table.

The rank's own message (one line for Gym's errors, a traceback for a crash) is already printed above it by the
rank; torchrun's report after it only repeats where that happened, and a first-time user reads its traceback as
the cause. The exit code is the first failed rank's, so a config error found inside the ranks is still exit 2.
`GYM_DEBUG=1` (or `--debug` in the command the ranks run) keeps torchrun's report.

Ctrl-C: torchrun would answer the first SIGINT by stopping its ranks and killing any still running 30 s later, so a
step longer than that never reached the checkpoint Gym's first Ctrl-C promises (docs/training.md). Here the first
SIGINT is passed on to the ranks, which finish the step, save and leave with 130; the launcher goes on watching them
and leaves with the same code. A second Ctrl-C is torchrun's own: the ranks are stopped at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from types import FrameType

STOPPED = 130  # a rank that stopped on request, after saving its checkpoint (gym.core.errors.RunStopped)


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


class PassFirstInterrupt:
    """The SIGINT handler of the launcher: the first one goes to the ranks, the next is torchrun's own."""

    def __init__(self) -> None:
        self.passed_on = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self.passed_on:
            import psutil  # accelerate's own dependency

            self.passed_on = True
            for rank_process in psutil.Process().children():  # each rank leads its own session: not in ours
                with contextlib.suppress(psutil.NoSuchProcess):  # a rank that has just ended
                    rank_process.send_signal(signal.SIGINT)
            return
        from torch.distributed.elastic.multiprocessing.api import SignalException

        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("GYM_DEBUG", "").lower() in ("1", "true", "yes", "on")
    if not debug:  # the agent's own log of the failure ("failed (exitcode: 1) local_rank: 0 ...") repeats ours
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # torchrun handles these signals by stopping the ranks; SIGINT is left to PassFirstInterrupt.
    os.environ.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGHUP,SIGQUIT")
    if "SIGINT" not in os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"]:
        signal.signal(signal.SIGINT, PassFirstInterrupt())
    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as failed:
        if debug:
            raise
        rank, failure = failed.get_first_failure()
        if failure.exitcode == STOPPED:  # the ranks said where they stopped and how to go on
            return STOPPED
        line, code = failure_line(rank, failure.exitcode)
        print(line, file=sys.stderr)
        return code
    except SignalException as got:  # torchrun stopped the ranks, which were told the same signal
        if debug:
            raise
        print(f"gym: the run stopped on {got.sigval.name}.", file=sys.stderr)
        return 128 + int(got.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
