"""Rule-based rewards that check an answer's text: `accuracy` (against the row's reference answer),
`format` (the <think>...</think> layout, or any regex) and `length` (close to a target word count).

Each factory takes the argument after the colon in `reward_funcs` (`length:80`) and returns a
callable with TRL's reward signature, `fn(prompts, completions, **columns) -> list[float | None]`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from gym.core.errors import ConfigError

RewardFunc = Callable[..., list[float | None]]


def as_text(item: Any) -> str:
    """A completion (or prompt) as plain text: strings pass through, chat messages give their contents."""
    if item is None:
        return ""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        content = item.get("content", "")
        if isinstance(content, list):  # multimodal parts: keep the text ones
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return "" if content is None else str(content)
    if isinstance(item, (list, tuple)):
        return "\n".join(as_text(message) for message in item)
    return str(item)


# ---------------------------------------------------------------- accuracy

# A minus sign counts only when it is not a hyphen between numbers ("pages 10-12" ends in 12, not -12).
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, with nested braces (`\\boxed{\\frac{1}{2}}`) kept whole."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0 or text[start + len("\\boxed"):open_at].strip():
        return None
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    return None  # unbalanced: the model stopped mid-answer


def _to_number(text: str) -> float | None:
    s = text.strip().replace("$", "").replace(" ", "").rstrip(".").removesuffix("%")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if m := _FRAC.fullmatch(s):
        return (-1 if m[1] else 1) * int(m[2]) / int(m[3]) if int(m[3]) else None
    if m := re.fullmatch(r"(-?\d+)/(\d+)", s):
        return int(m[1]) / int(m[2]) if int(m[2]) else None
    # Gate float() so words like "nan" or "inf" never count as numbers.
    return float(s) if re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", s) else None


def _normalise(text: str) -> str:
    text = _last_boxed(text) or text
    return " ".join(text.replace("$", "").strip().rstrip(".").lower().split())


def _answer_value(answer: Any) -> str | None:
    text = "" if answer is None else str(answer).strip()
    if "####" in text:  # GSM8K keeps its worked solution before "#### 42"
        text = text.rsplit("####", 1)[1].strip()
    return text or None


def _is_correct(completion: str, answer: str) -> bool:
    target = _to_number(_normalise(answer))
    boxed = _last_boxed(completion)
    if target is not None:
        # A boxed answer may carry units or words ("\boxed{42 apples}"): its last number is the prediction.
        pool = boxed if boxed is not None else completion
        guess = _to_number(pool)
        if guess is None and (numbers := _NUMBER.findall(pool)):
            guess = _to_number(numbers[-1])
        return guess is not None and abs(guess - target) <= 1e-6
    text = boxed if boxed is not None else completion.rsplit("</think>", 1)[-1]
    return _normalise(text) == _normalise(answer)


def accuracy_reward(arg: str | None) -> RewardFunc:
    _no_argument("accuracy", arg)

    def accuracy(prompts: list[Any], completions: list[Any], answer: list[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        if answer is None:
            raise ConfigError(
                "The `accuracy` reward needs an `answer` column in the dataset: map it in dataset_info.json, "
                'e.g. "columns": {"prompt": "question", "answer": "solution"}.'
            )
        rewards: list[float | None] = []
        for completion, raw in zip(completions, answer, strict=True):
            target = _answer_value(raw)
            rewards.append(None if target is None else float(_is_correct(as_text(completion), target)))
        return rewards

    return accuracy


def exact_reward(arg: str | None) -> RewardFunc:
    """1 when the whole answer (after a thought, or inside \\boxed{}) equals the reference, compared without case,
    surrounding spaces, dollar signs or a final full stop."""
    _no_argument("exact", arg)

    def exact(prompts: list[Any], completions: list[Any], answer: list[Any] | None = None,
              **kwargs: Any) -> list[float | None]:
        if answer is None:
            raise ConfigError("The `exact` reward needs an `answer` column in the dataset.")
        rewards: list[float | None] = []
        for completion, raw in zip(completions, answer, strict=True):
            target = _answer_value(raw)
            text = as_text(completion)
            text = _last_boxed(text) or text.rsplit("</think>", 1)[-1]
            rewards.append(None if target is None else float(_normalise(text) == _normalise(target)))
        return rewards

    return exact


def regex_reward(arg: str | None) -> RewardFunc:
    """1 when the pattern's first group (the whole match without one) at its last match equals the reference:
    `regex:The answer is (\\w+)`."""
    try:
        pattern = re.compile(arg or "", re.DOTALL)
    except re.error as exc:
        raise ConfigError(f"reward `regex:{arg}`: not a valid regular expression ({exc}).") from None
    if not arg:
        raise ConfigError("reward `regex` needs a pattern whose first group is the answer: regex:Answer: (\\S+)")

    def regex(prompts: list[Any], completions: list[Any], answer: list[Any] | None = None,
              **kwargs: Any) -> list[float | None]:
        if answer is None:
            raise ConfigError("The `regex` reward needs an `answer` column in the dataset.")
        rewards: list[float | None] = []
        for completion, raw in zip(completions, answer, strict=True):
            target = _answer_value(raw)
            matches = list(pattern.finditer(as_text(completion)))
            found = (matches[-1].group(1) if pattern.groups else matches[-1].group(0)) if matches else None
            rewards.append(None if target is None else float(found is not None and
                                                             _normalise(found) == _normalise(target)))
        return rewards

    return regex


# ---------------------------------------------------------------- format and length

_THINK_FORMAT = re.compile(r"^\s*<think>.+?</think>\s*\S", re.DOTALL)


def _think_format_score(text: str) -> float:
    if _THINK_FORMAT.search(text):
        return 1.0
    # Partial credit: a small model that only opens its thought still gets a gradient towards the format.
    opens, closes = text.find("<think>"), text.rfind("</think>")
    return 0.25 * ((opens >= 0) + (closes >= 0) + (0 <= opens < closes))


def format_reward(arg: str | None) -> RewardFunc:
    score: Callable[[str], float] = _think_format_score
    if arg is not None:
        try:
            pattern = re.compile(arg, re.DOTALL)
        except re.error as exc:
            raise ConfigError(f"reward `format:{arg}`: not a valid regular expression ({exc}).") from None

        def score(text: str) -> float:
            return 1.0 if pattern.search(text) else 0.0

    def format(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [score(as_text(c)) for c in completions]

    return format


def length_reward(arg: str | None) -> RewardFunc:
    try:
        target = float(arg) if arg is not None else 50.0
    except ValueError:
        target = math.nan
    if not target > 0 or math.isinf(target):
        raise ConfigError(f"reward `length:{arg}`: the target must be a positive number of words, e.g. length:50.")

    def length(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [1.0 - min(1.0, abs(len(as_text(c).split()) - target) / target) for c in completions]

    return length


def _no_argument(name: str, arg: str | None) -> None:
    if arg is not None:
        raise ConfigError(f"reward `{name}:{arg}`: `{name}` takes no argument; write just `{name}`.")
