"""User-facing failures.

Anything a user can cause (a bad config key, a malformed dataset row, a model that is not on disk)
raises a `GymError`; the CLI prints its message and exits with status 2. Bugs stay ordinary
exceptions so they keep their tracebacks.
"""

from __future__ import annotations

from collections.abc import Iterator


class GymError(Exception):
    """An error the user can fix; the message says how."""


class ConfigError(GymError):
    """An unknown key, a value of the wrong type, or an impossible combination of options."""


class IncompleteConfig(ConfigError):
    """A config right as far as it goes that lacks what its run needs (e.g. GRPO's reward). The Python door's
    TrainingConfig accepts one, to be completed when training starts; everywhere else it is a ConfigError."""


class UnknownField(ConfigError, TypeError):
    """A keyword a Python options class (BitDeltaConfig, ...) does not have, with the closest one. Also a TypeError,
    what Python raises for an unexpected keyword, so code that catches that keeps working."""


class DataError(GymError):
    """A dataset that is missing, malformed, or empty after filtering."""


class ModelError(GymError):
    """A model that cannot be found or loaded."""


class OutputError(GymError):
    """An output that cannot be written: no space, no permission, or a path that is in the way."""


class RunStopped(GymError):
    """A run that stopped when asked (Ctrl-C, the web UI's Stop) after saving a checkpoint to resume from.
    The CLI exits with 130, as for an interrupt, so scripts can tell it from a failure and from a finished run."""


_NO_SPACE = {28, 122}  # ENOSPC, EDQUOT
_NO_ACCESS = {1, 13, 30}  # EPERM, EACCES, EROFS
# How the system's out-of-space errors read when a library re-raises them as its own exception (tokenizers' Rust
# error: "No space left on device (os error 28)").
_NO_SPACE_WORDS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """The exception and what caused it, or was being handled when it was raised, in turn (each once)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_out_of_space(exc: BaseException | None) -> bool:
    """Whether a write failed for want of space: an OSError saying so, or a library's exception carrying the
    system's words, anywhere in the chain of causes."""
    return any((isinstance(e, OSError) and e.errno in _NO_SPACE) or any(words in str(e) for words in _NO_SPACE_WORDS)
               for e in _chain(exc))


def caused_by_interrupt(exc: BaseException | None) -> bool:
    """Whether Ctrl-C is what this exception reports: an import cut short by it surfaces as ImportError (scipy's,
    under transformers' lazy modules), with the KeyboardInterrupt as its cause or context."""
    return any(isinstance(e, KeyboardInterrupt) for e in _chain(exc))


def as_gym_error(exc: BaseException) -> GymError | None:
    """A known failure of the machine or of a library, as the one-line error a user can act on; None for
    anything else (a bug keeps its traceback). The doors (CLI, HTTP) call this at their boundary."""
    if isinstance(exc, GymError):
        return exc
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    if is_out_of_space(exc):
        return OutputError(f"No space left on the device{where}. Free some space or write elsewhere.")
    if isinstance(exc, OSError) and exc.errno in _NO_ACCESS:
        return OutputError(f"Permission denied{where}: {exc.strerror}. Choose a writable location.")
    name = type(exc).__name__
    if name == "SafetensorError":  # safetensors' Rust error: a truncated file or a broken header
        return ModelError(f"A safetensors file could not be read ({exc}): it is truncated or not safetensors.")
    if name == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return GymError("Out of memory. Lower per_device_train_batch_size or cutoff_len, or turn on "
                        "gradient_checkpointing.")
    return None
