"""What Training-Free GRPO asks its models, and how their answers are read.

Five kinds of call (the roles in the usage report):
- rollout: the task, with the library in the system prompt (gym.tfgrpo.library.with_experiences);
- summary: one attempt, its reward and the reference answer -> a step-by-step account of what it did;
- advantage: a group's summaries with their rewards -> at most K lessons that separate the better
  attempts from the worse (the "semantic advantage"), as a JSON list of strings;
- group_update: the library and one group's lessons -> operations (ADD/UPDATE/DELETE/NONE) on ids;
- batch_update: the library and every group's operations -> one merged list of operations.
Plus `judge` when the reward is an LLM's grade.

Our own wording, written after reading the authors' prompts (youtu-agent, utu/prompts/practice/): the
same steps and constraints (lessons start with their situation, are strategic, avoid specifics, at most
`max_words` words each), shorter, and asking for JSON only where code reads the answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gym.tfgrpo.library import ExperienceLibrary, Operation

SUMMARY_SYSTEM = ("You review one attempt at a task. Describe, step by step, what the attempt did and why, "
                  "where it went wrong or took a detour, and which of the listed lessons (if any) it used. "
                  "Keep every step that decided the outcome. Answer with the numbered steps only.")

ADVANTAGE_SYSTEM = (
    "You compare several attempts at the same task, each with its reward (higher is better), to find what "
    "the better attempts did that the worse ones did not. Write at most {k} lesson(s) that would help on "
    "similar tasks in future. Each lesson: one sentence of at most {words} words that starts with the kind "
    "of situation it applies to (\"When ...\"), states a strategy, not a calculation, and names no numbers "
    "or entities specific to this task. Answer with a JSON list of strings, and nothing else, e.g.\n"
    "[\"When a problem has several steps, write down each intermediate result before using it.\"]")

GROUP_UPDATE_SYSTEM = (
    "You maintain a numbered library of lessons for solving tasks. Given the library and new lessons, "
    "decide for each new lesson one operation:\n"
    "- ADD: it is new (the id is assigned for you; give \"id\": null);\n"
    "- UPDATE: it refines an existing lesson; give that lesson's id and the improved full text;\n"
    "- DELETE: an existing lesson is wrong or contradicted; give its id;\n"
    "- NONE: the library already covers it.\n"
    "Each lesson text is at most {words} words. Answer with a JSON list of objects "
    "{{\"operation\": \"ADD|UPDATE|DELETE|NONE\", \"id\": <number or null>, \"content\": \"<text or null>\"}}, "
    "and nothing else, e.g.\n"
    "[{{\"operation\": \"UPDATE\", \"id\": 2, \"content\": \"When ..., ...\"}}, "
    "{{\"operation\": \"ADD\", \"id\": null, \"content\": \"When ..., ...\"}}]")

BATCH_UPDATE_SYSTEM = (
    "You maintain a numbered library of lessons for solving tasks. Reviewers proposed the operations below, "
    "grouped by the lesson they touch. Merge them into one final list: merge several UPDATEs of one lesson "
    "into one; a DELETE wins over an UPDATE of the same lesson; merge ADDs that say the same thing; drop "
    "operations that repeat a lesson already in the library; keep every lesson general and at most "
    "{words} words. Answer with a JSON list of objects "
    "{{\"operation\": \"ADD|UPDATE|DELETE\", \"id\": <number or null>, \"content\": \"<text or null>\"}}, "
    "and nothing else.")

JUDGE_SYSTEM = ("You grade an answer to a task against the reference answer. Judge only whether the final answer "
                "is correct and complete. End with a line `SCORE: <number from 0 to 1>`.")


def _library_block(library: ExperienceLibrary) -> str:
    return library.render() or "(empty)"


def _reference(answer: str | None) -> str:
    return answer if answer is not None else "(not given)"


def summary_messages(task: str, attempt: str, reward: float, answer: str | None,
                     library: ExperienceLibrary) -> list[dict[str, str]]:
    user = (f"Task:\n{task}\n\nLessons the attempt was shown:\n{_library_block(library)}\n\n"
            f"Attempt (reward {reward:.2f}):\n{attempt}\n\nReference answer: {_reference(answer)}")
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]


def advantage_messages(task: str, summaries: list[str], rewards: list[float], answer: str | None,
                       library: ExperienceLibrary, k: int, words: int) -> list[dict[str, str]]:
    attempts = "\n\n".join(f"Attempt {i + 1} (reward {reward:.2f}):\n{summary}"
                           for i, (summary, reward) in enumerate(zip(summaries, rewards)))
    user = (f"Task:\n{task}\n\nReference answer: {_reference(answer)}\n\nCurrent lessons:\n{_library_block(library)}"
            f"\n\n{attempts}")
    return [{"role": "system", "content": ADVANTAGE_SYSTEM.format(k=k, words=words)},
            {"role": "user", "content": user}]


def group_update_messages(library: ExperienceLibrary, lessons: list[str], words: int) -> list[dict[str, str]]:
    new = "\n".join(f"- {lesson}" for lesson in lessons)
    user = f"Library:\n{_library_block(library)}\n\nNew lessons:\n{new}"
    return [{"role": "system", "content": GROUP_UPDATE_SYSTEM.format(words=words)},
            {"role": "user", "content": user}]


def batch_update_messages(library: ExperienceLibrary, proposals: list[Operation], words: int) -> list[dict[str, str]]:
    """The proposals grouped by the lesson they touch, then those without an id (ADDs), as the authors do."""
    parts = []
    for i, text in enumerate(library):
        touching = [json.dumps(p.as_json(), ensure_ascii=False) for p in proposals if p.id == i and p.op != "ADD"]
        parts.append(f"Lesson [{i}]: {text}\nProposed: " + ("\n  ".join(touching) if touching else "nothing"))
    unattached = [json.dumps(p.as_json(), ensure_ascii=False) for p in proposals
                  if p.op == "ADD" or p.id is None or not 0 <= p.id < len(library)]
    parts.append("New lessons proposed:\n" + ("\n".join(unattached) if unattached else "none"))
    return [{"role": "system", "content": BATCH_UPDATE_SYSTEM.format(words=words)},
            {"role": "user", "content": "\n\n".join(parts)}]


def judge_messages(task: str, attempt: str, answer: str | None) -> list[dict[str, str]]:
    user = f"Task:\n{task}\n\nReference answer: {_reference(answer)}\n\nAnswer to grade:\n{attempt}"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


# ---------------------------------------------------------------- reading the answers

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON in an answer: the last ```json fence, else the span from the first [ or { to the last ] or }.
    Raises ValueError saying what was wrong."""
    fences = _FENCE.findall(text)
    candidate = fences[-1] if fences else text
    starts = [i for i in (candidate.find("["), candidate.find("{")) if i >= 0]
    if not starts:
        raise ValueError("no JSON list or object in the answer")
    start = min(starts)
    end = candidate.rfind("]" if candidate[start] == "[" else "}")
    if end < start:
        raise ValueError("the JSON is not closed")
    try:
        return json.loads(candidate[start:end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at character {exc.pos})") from None


def parse_lessons(text: str, k: int) -> list[str]:
    data = extract_json(text)
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of lesson strings")
    texts = [str(item.get("content") or item.get("experience") or "") if isinstance(item, dict) else str(item)
             for item in data if item is not None]
    return [text.strip() for text in texts if text.strip()][:k]


def parse_operations(text: str) -> list[Operation]:
    data = extract_json(text)
    if isinstance(data, dict):  # one operation, or {"operations": [...]}
        data = data.get("operations", [data])
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of operations")
    return [Operation.parse(item) for item in data]


_SCORE = re.compile(r"SCORE:\s*([01](?:\.\d+)?|\.\d+)", re.IGNORECASE)


def parse_score(text: str) -> float:
    found = _SCORE.findall(text)
    if not found:
        raise ValueError("no `SCORE: <0..1>` line")
    return min(1.0, max(0.0, float(found[-1])))


def correction(error: str) -> dict[str, str]:
    """The follow-up turn after an answer that could not be read."""
    return {"role": "user", "content": f"Your answer could not be read: {error}. Answer again in the required "
                                       "format, and nothing else."}
