"""Queries for Training-Free GRPO, and the verifier that scores an answer to one in [0, 1].

Queries come from a dataset Gym knows (a name in dataset_info.json, with its column mapping, as the GRPO
stage reads it), a file, or Python: a list of dicts, a dict of lists (`hf_dataset[:100]`),
or a `datasets.Dataset`, whose rows hold the query under prompt/question/query/problem/instruction and
the reference under answer/solution/ground_truth.

Rewards are the online stages' (gym.rewards.functions: accuracy, format, length, python:module:function),
`judge` (an LLM grades the answer against the reference; gym.tfgrpo.trainer asks it), or a Python
callable. Several are combined as their weighted mean, so the score stays in [0, 1].
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, DataError

PROMPT_KEYS = ("prompt", "question", "query", "problem", "instruction")
ANSWER_KEYS = ("answer", "solution", "ground_truth", "reference")


@dataclass
class Task:
    """One query: its conversation (ending with the user's turn), the reference answer and the row's other columns."""

    messages: list[dict[str, str]]
    answer: str | None = None
    system: str | None = None
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The query as the updater sees it."""
        return "\n\n".join(m["content"] for m in self.messages if m["role"] == "user")


def _from_row(row: Any, where: str) -> Task:
    if isinstance(row, str):
        return Task([{"role": "user", "content": row}])
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected a dict with a query and an answer, got {type(row).__name__}.")
    key = next((k for k in PROMPT_KEYS if row.get(k)), None)
    if key is None:
        raise DataError(f"{where}: no query; put it under one of: {', '.join(PROMPT_KEYS)}.")
    query = str(row[key])
    if key == "instruction" and row.get("input"):
        query = f"{query}\n\n{row['input']}"
    answer_key = next((k for k in ANSWER_KEYS if row.get(k) is not None), None)
    answer = None if answer_key is None else str(row[answer_key])
    columns = {k: v for k, v in row.items() if k not in (key, answer_key)}
    return Task([{"role": "user", "content": query}], answer, row.get("system"), columns)


def tasks_from(data: Any, dataset_dir: str = "data", max_samples: int | None = None) -> list[Task]:
    """Tasks from a dataset name/file, rows in Python, a dict of columns, or a datasets.Dataset."""
    if isinstance(data, str):
        tasks = _named_dataset(data, dataset_dir, max_samples)
    else:
        if isinstance(data, Mapping):  # columns, as `hf_dataset[:100]` gives them
            lengths = {len(v) for v in data.values() if isinstance(v, Sequence) and not isinstance(v, str)}
            if len(lengths) != 1:
                raise DataError("A dict of columns needs lists of one length (as dataset[:100] returns).")
            n = lengths.pop()
            data = [{k: v[i] for k, v in data.items()} for i in range(n)]
        if isinstance(data, Task):
            data = [data]
        tasks = [row if isinstance(row, Task) else _from_row(row, f"row {i}") for i, row in enumerate(data)]
        tasks = tasks[:max_samples] if max_samples else tasks
    if not tasks:  # train and evaluate both read queries here: say which data is empty, not what it was for
        what = f"{data} holds" if isinstance(data, str) else "The dataset given holds"
        raise DataError(f"{what} no queries: the dataset is empty.")
    return tasks


def _named_dataset(name: str, dataset_dir: str, max_samples: int | None) -> list[Task]:
    """A file is read with its columns recognised by name (question/answer, ...); a name goes through
    dataset_info.json and its column mapping, as every other stage reads it."""
    from gym.core.kinds import DataKind
    from gym.data.loader import load_examples
    from gym.data.readers import read_rows
    from gym.data.registry import get_dataset_attrs, read_dataset_info

    if Path(name).is_file() and name not in read_dataset_info(dataset_dir):
        rows = [_from_row(row, str(source)) for source, row in read_rows(name)]
        return rows[:max_samples] if max_samples else rows
    tasks = []
    for attr in get_dataset_attrs(name, dataset_dir):
        for example in load_examples(attr, DataKind.PROMPT, max_samples):
            tasks.append(Task(example.messages, example.answer, example.system))
    return tasks


def split_held_out(tasks: list[Task], val_size: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, held out): `val_size` rows (a fraction when below 1) chosen with the seed, order kept."""
    import random

    # A negative fraction held one row out, and 2.5 rows two: both silently.
    if isinstance(val_size, bool) or not isinstance(val_size, (int, float)) or not 0 <= val_size < math.inf \
            or (val_size >= 1 and val_size != int(val_size)):
        raise ConfigError(f"'val_size' is a fraction in [0, 1) or a whole number of rows, got {val_size!r}.")
    if not val_size:
        return tasks, []
    n = int(val_size) if val_size >= 1 else max(1, round(len(tasks) * val_size))
    if n >= len(tasks):
        raise DataError(f"val_size={val_size} leaves no training rows out of {len(tasks)}.")
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    held = set(order[:n])
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


# ---------------------------------------------------------------- scoring

Judge = Callable[[Task, str], float]
Scorer = Callable[[list[Task], list[str]], list[float]]
PartScorer = Callable[[list[Task], list[str]], list[float | None]]
RewardSource = str | Sequence[str] | Callable[..., Any] | None


def _call_user_reward(fn: Callable[..., Any]) -> PartScorer:
    """A user's function: TRL's batch signature when it takes `completions`, else fn(completion, answer) or
    fn(prompt, completion, answer) per answer."""
    params = inspect.signature(fn).parameters
    if "completions" in params:
        def batch(tasks: list[Task], answers: list[str]) -> list[float | None]:
            columns = {k: [t.columns.get(k) for t in tasks] for k in {k for t in tasks for k in t.columns}}
            out = fn(prompts=[t.messages for t in tasks], completions=answers, answer=[t.answer for t in tasks],
                     **columns)
            return list(out)
        return batch
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 3:
        return lambda tasks, answers: [fn(t.text, a, t.answer) for t, a in zip(tasks, answers)]
    return lambda tasks, answers: [fn(a, t.answer) for t, a in zip(tasks, answers)]


def _judged(judge: Judge) -> PartScorer:
    return lambda tasks, answers: [judge(t, a) for t, a in zip(tasks, answers)]


def _registered(spec: str) -> PartScorer:
    from gym.rewards.functions import get_reward_funcs

    (fn,), _ = get_reward_funcs([spec])
    return lambda tasks, answers: fn(prompts=[t.messages for t in tasks], completions=answers,
                                     answer=[t.answer for t in tasks])


def build_scorer(rewards: RewardSource, weights: Sequence[float] | None = None, judge: Judge | None = None) -> Scorer:
    """One scorer for the rewards asked for: their weighted mean per answer, in [0, 1] (None/NaN count as 0)."""
    specs: list[Any] = [rewards] if rewards is None or isinstance(rewards, str) or callable(rewards) else list(rewards)
    if isinstance(rewards, str):
        specs = [s.strip() for s in rewards.split(",") if s.strip()]
    if rewards is None or not specs:
        specs = ["accuracy"]
    weights = list(weights) if weights is not None else [1.0] * len(specs)
    if len(weights) != len(specs) or any(w < 0 for w in weights) or not sum(weights) > 0:
        raise ConfigError(f"reward_weights: give {len(specs)} non-negative weights, not all 0 (got {weights}).")
    parts: list[PartScorer] = []
    for spec in specs:
        if callable(spec):
            parts.append(_call_user_reward(spec))
        elif spec == "judge":
            if judge is None:
                raise ConfigError("reward `judge` needs an updater model to ask.")
            parts.append(_judged(judge))
        else:
            parts.append(_registered(spec))
    total = sum(weights)

    def score(tasks: list[Task], answers: list[str]) -> list[float]:
        sums = [0.0] * len(answers)
        for weight, part in zip(weights, parts):
            values = part(tasks, answers)
            if len(values) != len(answers):
                raise ConfigError(f"A reward returned {len(values)} scores for {len(answers)} answers.")
            for i, value in enumerate(values):
                if value is not None and not math.isnan(float(value)):
                    sums[i] += weight * float(value)
        return [min(1.0, max(0.0, s / total)) for s in sums]

    return score
