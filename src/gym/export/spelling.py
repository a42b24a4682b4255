"""How the caller's door names the export's options, for the errors that name one: the CLI's flags (`--format hf`),
or Trainer.export's keywords (`format='hf'`). The door sets it (run_export); the writers, far below it, ask `option`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Spelling:
    """How a door writes the export's options, so that an error names one as its caller gives it: the CLI's flags
    (`--format hf`), or Trainer.export's keywords (`format='hf'`)."""

    flags: bool
    names: Mapping[str, str] = field(default_factory=dict)
    """ExportArguments field -> the door's name for it (a field not here is named as itself)."""
    untrained: str = "train it first"
    """What the door's caller does with a run not trained yet, in its words: the refusal to export one says it."""

    def option(self, key: str, value: object = None) -> str:
        name = self.names.get(key, key)
        if self.flags:
            return f"--{name}" if value is None or value is True else f"--{name} {value}"
        return name if value is None else f"{name}={value!r}"

    def own_keys(self, keys: Iterable[str]) -> list[str]:
        """`keys` (the export's own, every spelling) as the door writes them, for a "Did you mean"."""
        return [f"--{key}" if self.flags else key for key in keys]


CLI = Spelling(flags=True, names={"export_format": "format", "export_type": "type", "export_dtype": "dtype",
                                  "export_overwrite": "overwrite"},
               untrained="train it first (gym train CONFIG), or export the base itself with --model_name_or_path "
                         "(and no config)")
# Trainer.export's keywords. It exports its own config's run, so the way on is training it: a model_name_or_path=
# beside that run's output_dir would still find no run there.
PYTHON = Spelling(flags=False, names={"export_format": "format", "export_dir": "path"},
                  untrained="train it first (Trainer.train()): Trainer.export exports what training writes there")

# The spelling of the export running now. The writers' errors (an architecture GGUF cannot hold, a tokenizer Ollama
# cannot template) are raised far below the door, which alone knows how its caller named the options.
_SPELLING: ContextVar[Spelling] = ContextVar("export_spelling", default=CLI)


@contextmanager
def spelled(spelling: Spelling) -> Iterator[None]:
    """Name the export's options as `spelling` does in every error raised inside."""
    token = _SPELLING.set(spelling)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def current_spelling() -> Spelling:
    return _SPELLING.get()


def option(key: str, value: object = None) -> str:
    """The export option `key` (an ExportArguments field), with `value`, as the caller's door writes it:
    `--format hf` from the CLI, `format='hf'` from Trainer.export."""
    return _SPELLING.get().option(key, value)
