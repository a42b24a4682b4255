"""Multiple choice in MMLU's layout, scored by log-likelihood.

Rows hold a question, its choices (a `choices` list, or columns A, B, C, D...), the answer (a letter or a
0-based index) and a subject (a column, else the file's name: MMLU ships one file per subject). Two scores:

    acc       the choice whose letter is likeliest after the question with its lettered choices and
              "Answer:" (MMLU's prompt, as lm-eval's `mmlu` and LLaMA-Factory's evaluator score it)
    acc_norm  the choice whose text is likeliest after the question alone, its log-likelihood divided by
              the text's length in bytes (lm-eval's acc_norm), so long choices are not penalised

n-shot examples are the first n rows of the same subject in the dev set (`<dataset>_dev` in
dataset_info.json, or `dev:`), else other rows of the test set. Prompts are plain text, or the model's
chat format with the shots as earlier turns (`eval_template`); the result says which.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.core.errors import DataError
from gym.core.stats import mean_and_stderr
from gym.data.loader import raw_rows
from gym.data.registry import get_dataset_attrs, read_dataset_info
from gym.eval.loglik import LoglikScorer, split_encode
from gym.eval.model import EvalModel

logger = logging.getLogger(__name__)

# A choice is named by its letter in the prompt, so a question has at most 26 (MMLU has 4, MMLU-Pro 10).
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class MCItem:
    subject: str
    question: str
    choices: tuple[str, ...]
    answer: int
    source: str


def _subject_from_file(file: str) -> str:
    stem = Path(file).stem
    return re.sub(r"_(test|dev|val|validation|train)$", "", stem)


def _answer_index(value: Any, n: int, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):  # true is not choice 1
        index = value
    elif isinstance(value, str) and value.strip().isdigit():
        index = int(value)
    elif isinstance(value, str) and len(value.strip()) == 1 and value.strip().upper() in LETTERS:
        index = LETTERS.index(value.strip().upper())
    else:
        raise DataError(f"{where}, field 'answer': expected a letter ({LETTERS[0]}-{LETTERS[n - 1]}) or a 0-based "
                        f"index (0-{n - 1}), got {value!r} ({type(value).__name__}).")
    if not 0 <= index < n:
        raise DataError(f"{where}, field 'answer': {value!r} names no choice; the row has {n} choices.")
    return index


def _item(row: Any, source: Any, columns: dict[str, str | None]) -> MCItem:
    where = str(source)
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with question, choices and answer, got {type(row).__name__}.")
    question_key = columns.get("question") or "question"
    question = row.get(question_key)
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}, field '{question_key}': a multiple-choice row needs a question.")
    choices_key = columns.get("choices") or "choices"
    if choices_key in row:
        choices = row[choices_key]
        if not isinstance(choices, (list, tuple)) or len(choices) < 2:
            raise DataError(f"{where}, field '{choices_key}': expected a list of at least 2 choices.")
        _check_choices(choices, f"{where}, field '{choices_key}'")
    else:  # columns A, B, C, ... as far as they go without a gap
        choices = [row[letter] for letter in itertools.takewhile(lambda letter: letter in row, LETTERS)]
        if len(choices) < 2:
            raise DataError(f"{where}: no choices; give a '{choices_key}' list or columns A, B, C, D.")
        # A, B, D without C was scored as a two-choice question, D dropped without a word
        beyond = [letter for letter in LETTERS[len(choices) + 1:] if letter in row]
        if beyond:
            raise DataError(f"{where}: column {LETTERS[len(choices)]} is missing but {beyond[0]} is there; the "
                            "choices are columns A, B, C, ... without a gap.")
        _check_choices(choices, f"{where}, columns A-{LETTERS[len(choices) - 1]}")
    answer_key = columns.get("answer") or "answer"
    if answer_key not in row:
        raise DataError(f"{where}: no field '{answer_key}' (the right choice: a letter or a 0-based index).")
    subject_key = columns.get("subject") or "subject"
    subject = str(row.get(subject_key) or _subject_from_file(source.file))
    return MCItem(subject, question.strip(), tuple(str(c).strip() for c in choices),
                  _answer_index(row[answer_key], len(choices), where), where)


def _check_choices(choices: list[Any] | tuple[Any, ...], where: str) -> None:
    """Each choice is text with something in it (its likelihood is what is scored), and each has a letter."""
    if len(choices) > len(LETTERS):
        raise DataError(f"{where}: {len(choices)} choices; at most {len(LETTERS)} ({LETTERS[0]}-{LETTERS[-1]}), "
                        "one letter each.")
    for i, choice in enumerate(choices):
        if isinstance(choice, (dict, list, tuple)) or choice is None or not str(choice).strip():
            raise DataError(f"{where}: choice {LETTERS[i]} is {'empty' if choice in ('', None) else repr(choice)}; "
                            "each choice is a non-empty text.")


def read_items(dataset: str, dataset_dir: str) -> list[MCItem]:
    items = []
    for attr in get_dataset_attrs(dataset, dataset_dir):
        columns = {k: v for k, v in attr.columns.items() if k in ("question", "choices", "answer", "subject")}
        items += [_item(row, source, columns) for source, row in raw_rows(attr)]
    if not items:
        raise DataError(f"Dataset '{dataset}' has no questions.")
    return items


def dev_dataset(dataset: str, dataset_dir: str) -> str | None:
    """`<name>_dev` when dataset_info.json has it (MMLU's layout: dev holds the few-shot examples)."""
    candidate = f"{dataset}_dev"
    return candidate if candidate in read_dataset_info(dataset_dir) else None


def heading(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}."


def letter_prompt(item: MCItem) -> str:
    lines = [item.question] + [f"{LETTERS[i]}. {c}" for i, c in enumerate(item.choices)]
    return "\n".join(lines) + "\nAnswer:"


def cloze_prompt(item: MCItem) -> str:
    return f"{item.question}\nAnswer:"


@dataclass
class MCSettings:
    n_shot: int = 5
    chat: bool = False
    limit: int | None = None
    log_samples: bool = False


class MCTask:
    """One multiple-choice task: its items, and the dev items its shots come from."""

    def __init__(self, name: str, items: list[MCItem], dev: list[MCItem] | None = None) -> None:
        self.name, self.items, self.dev = name, items, dev

    def shots(self, item: MCItem, n: int) -> list[MCItem]:
        pool = self.dev if self.dev is not None else self.items
        same = [d for d in pool if d.subject == item.subject and d is not item]
        return same[:n]

    def _context(self, model: EvalModel, item: MCItem, shots: list[MCItem], cloze: bool, chat: bool) -> str:
        prompt = cloze_prompt if cloze else letter_prompt
        title = heading(item.subject).replace("multiple choice ", "") if cloze else heading(item.subject)

        def target(d: MCItem) -> str:
            return d.choices[d.answer] if cloze else LETTERS[d.answer]

        if chat:
            assert model.chat_format is not None
            messages: list[dict[str, str]] = []
            for d in shots:
                messages += [{"role": "user", "content": prompt(d)}, {"role": "assistant", "content": target(d)}]
            messages.append({"role": "user", "content": prompt(item)})
            messages[0]["content"] = f"{title}\n\n{messages[0]['content']}"
            return model.chat_format.render_prompt(messages)
        blocks = [f"{prompt(d)} {target(d)}" for d in shots] + [prompt(item)]
        return f"{title}\n\n" + "\n\n".join(blocks)

    def _encode(self, model: EvalModel, context: str, continuation: str, chat: bool) -> tuple[list[int], list[int]]:
        if chat:  # the template's own whitespace stays in the prompt, as training tokenized it
            tokenizer = model.tokenizer
            return (list(tokenizer(context, add_special_tokens=False)["input_ids"]),
                    list(tokenizer(continuation, add_special_tokens=False)["input_ids"]))
        return split_encode(model.tokenizer, context, " " + continuation, add_special_tokens=True)

    def run(self, model: EvalModel, settings: MCSettings, scorer: LoglikScorer) -> dict[str, Any]:
        chat = settings.chat
        if chat and model.chat_format is None:
            raise DataError("eval_template: chat needs a model with a chat template; this one has none.")
        items = _limited(self.items, settings.limit)
        requests: list[tuple[list[int], list[int]]] = []
        spans: list[tuple[int, int, int]] = []  # per item: first letter request, first cloze request, choices
        shown = 0
        for item in items:
            shots = self.shots(item, settings.n_shot)
            shown = max(shown, len(shots))
            letter_context = self._context(model, item, shots, cloze=False, chat=chat)
            cloze_context = self._context(model, item, shots, cloze=True, chat=chat)
            first_letter = len(requests)
            requests += [self._encode(model, letter_context, LETTERS[i], chat) for i in range(len(item.choices))]
            first_cloze = len(requests)
            requests += [self._encode(model, cloze_context, c, chat) for c in item.choices]
            spans.append((first_letter, first_cloze, len(item.choices)))
        scores = scorer.score(requests)
        samples = []
        for item, (first_letter, first_cloze, n) in zip(items, spans):
            letters = [scores[first_letter + i].logprob for i in range(n)]
            texts = [scores[first_cloze + i].logprob for i in range(n)]
            normed = [t / max(1, len(c.encode("utf-8"))) for t, c in zip(texts, item.choices)]
            pred, pred_norm = _argmax(letters), _argmax(normed)
            samples.append({"source": item.source, "subject": item.subject, "answer": LETTERS[item.answer],
                            "pred": LETTERS[pred], "pred_norm": LETTERS[pred_norm],
                            "acc": float(pred == item.answer), "acc_norm": float(pred_norm == item.answer),
                            "letter_logprobs": letters, "choice_logprobs": texts})
        result = summarize(samples)
        if shown < settings.n_shot:  # the report said "1000-shot" where each subject had a few examples to show
            logger.warning("%s: n_shot %d asked, but at most %d examples of a subject were there to show.", self.name,
                           settings.n_shot, shown)
        result.update({"kind": "multiple_choice", "prompt": "chat" if chat else "plain", "n_shot": shown,
                       "shots_from": "dev" if self.dev is not None else "test"})
        if settings.log_samples:
            result["samples"] = samples
        return result


def _limited(items: list[MCItem], limit: int | None) -> list[MCItem]:
    """The first `limit` items of every subject (MMLU's files are one subject each, so a plain head would keep
    only the first subject)."""
    if not limit:
        return items
    seen: dict[str, int] = defaultdict(int)
    kept = []
    for item in items:
        if seen[item.subject] < limit:
            seen[item.subject] += 1
            kept.append(item)
    return kept


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall accuracy over every question, and per subject."""
    metrics: dict[str, float] = {}
    for key in ("acc", "acc_norm"):
        metrics[key], metrics[f"{key}_stderr"] = mean_and_stderr([s[key] for s in samples])
    by_subject: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_subject[s["subject"]].append(s)
    subjects = {}
    for subject, rows in sorted(by_subject.items()):
        acc, acc_err = mean_and_stderr([r["acc"] for r in rows])
        acc_norm, norm_err = mean_and_stderr([r["acc_norm"] for r in rows])
        subjects[subject] = {"acc": acc, "acc_stderr": acc_err, "acc_norm": acc_norm, "acc_norm_stderr": norm_err,
                             "items": len(rows)}
    metrics["acc_macro"] = sum(s["acc"] for s in subjects.values()) / len(subjects)
    chance = sum(1 / len(s["letter_logprobs"]) for s in samples) / len(samples)
    return {"items": len(samples), "metrics": metrics, "chance": chance, "subjects": subjects}
