"""The interface every guard offers (gym.safety.guard reads specs into guards)."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from gym.safety.verdict import Message, Verdict


class Guard(abc.ABC):
    """Judges conversations; thread-safe (the server calls it from many requests at once)."""

    spec: str
    categories: tuple[str, ...]

    def check(self, conversation: list[Message]) -> Verdict:
        return self.check_batch([conversation])[0]

    @abc.abstractmethod
    def check_batch(self, conversations: Sequence[list[Message]]) -> list[Verdict]:
        """One verdict per conversation, for its last message."""

    def close(self) -> None:  # noqa: B027 - most guards hold nothing to free
        """Free what the guard holds (a model's memory)."""
