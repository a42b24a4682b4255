"""What every guard answers: is the message flagged, in which categories, with which scores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
"""{"role": "user" | "assistant" | "system", "content": str}: a guard judges the last message of a list of them."""


@dataclass(frozen=True)
class Verdict:
    flagged: bool
    categories: dict[str, bool] = field(default_factory=dict)
    """Each category the guard knows, and whether this message falls in it."""
    scores: dict[str, float] = field(default_factory=dict)
    """Each category's score in [0, 1] (a probability for model guards; 1.0 or 0.0 for keyword lists)."""

    @property
    def flagged_categories(self) -> list[str]:
        return [name for name, hit in self.categories.items() if hit]

    @property
    def score(self) -> float:
        """The highest category score: how sure the guard is that something is wrong."""
        return max(self.scores.values(), default=1.0 if self.flagged else 0.0)


def last_text(conversation: list[Message]) -> str:
    """The judged message's text (content parts joined, images and other media left out)."""
    if not conversation:
        return ""
    content = conversation[-1].get("content") or ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
