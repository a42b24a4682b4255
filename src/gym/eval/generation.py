"""Generation tasks with verifiable answers: the model answers, a verifier from the reward registry scores it.

Verifiers are the online RL stages' rewards (gym.rewards.functions): `accuracy` (the final number, or a
\\boxed{} answer, or the normalised text equals the reference; GSM8K's "#### 42" is understood), `exact`
(the whole answer equals the reference, normalised), `regex:<pattern>` (the pattern's first group, at its
last match, equals the reference), `python:module:function`. Several are combined as their weighted mean.
A sample is correct when its score is 1 (full marks).

Greedy decoding scores one answer per item (acc). With temperature > 0 and num_samples k, every item is
answered k times with seeds fixed by its place in the run: `pass@k` (at least one of the k is correct) and
`mean@k` (the share of correct answers, the accuracy of one sample: Training-Free GRPO's Mean@k). Every
request goes to the same engine as chat and the API, so items decode in batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gym.core.errors import ConfigError, DataError
from gym.core.stats import mean_and_stderr
from gym.eval.model import EvalModel
from gym.infer.batch import final_text, load_rows
from gym.infer.requests import Request
from gym.rewards.functions import combined_reward, get_reward_funcs


@dataclass
class GenSettings:
    rewards: list[str]
    n_shot: int = 0
    chat: bool = True
    limit: int | None = None
    num_samples: int = 1
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 42
    log_samples: bool = False


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. (2021) from n samples with `correct` right: 1 - C(n-c, k) / C(n, k)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def _plain_prompt(messages: list[dict[str, str]]) -> str:
    question = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
    return f"Question: {question}\nAnswer:"


def generate_task(model: EvalModel, dataset: str, dataset_dir: str, settings: GenSettings) -> dict[str, Any]:
    if settings.num_samples < 1:
        raise ConfigError(f"num_samples must be at least 1, got {settings.num_samples}.")
    if settings.num_samples > 1 and settings.temperature <= 0:
        raise ConfigError(f"num_samples: {settings.num_samples} answers per item need sampling: set temperature > 0 "
                          "(greedy decoding gives the same answer every time).")
    if settings.chat and model.chat_format is None:
        raise ConfigError("eval_template: chat needs a model with a chat template; this one has none.")
    funcs, weights = get_reward_funcs(settings.rewards)
    rows = load_rows(dataset, dataset_dir, None)
    shots, rows = rows[:settings.n_shot], rows[settings.n_shot:]
    rows = rows[:settings.limit] if settings.limit else rows
    if not rows:
        raise DataError(f"Dataset '{dataset}' has no rows left to score after {settings.n_shot} shots.")
    if any(r["reference"] is None for r in rows + shots):
        raise DataError(f"Dataset '{dataset}': a generation task needs a reference answer per row (an `answer` "
                        "column or the conversation's last assistant turn).")
    history: list[dict[str, str]] = []
    for shot in shots:
        history += shot["messages"] + [{"role": "assistant", "content": str(shot["reference"])}]
    plain_shots = [f"{_plain_prompt(shot['messages'])} {shot['reference']}" for shot in shots]
    k = settings.num_samples
    requests: list[Request] = []
    prompts: list[str] = []
    for i, row in enumerate(rows):
        if settings.chat:
            assert model.chat_format is not None
            prompt = model.chat_format.render_prompt(history + row["messages"], row["system"])
            ids = list(model.tokenizer.encode(prompt, add_special_tokens=False))
            stop: list[str] = []
        else:
            prompt = "\n\n".join(plain_shots + [_plain_prompt(row["messages"])])
            ids = list(model.tokenizer(prompt)["input_ids"])
            stop = ["\nQuestion:", "\n\n"]
        prompts.append(prompt)
        for j in range(k):
            params = model.sampling_params(do_sample=settings.temperature > 0, temperature=settings.temperature,
                                           max_new_tokens=settings.max_new_tokens, seed=settings.seed + i * k + j)
            params.stop = stop
            requests.append(model.engine.submit(ids, params))
    answers = [final_text(r).strip() for r in requests]
    references = [str(row["reference"]) for row in rows for _ in range(k)]
    totals = combined_reward(funcs, weights, [p for p in prompts for _ in range(k)], answers, answer=references)
    combined = [t / sum(weights) for t in totals]  # the weighted mean: full marks stay 1
    samples: list[dict[str, Any]] = []
    per_item: list[float] = []
    item_scores: list[float] = []
    right: list[int] = []
    for i, row in enumerate(rows):
        scores = combined[i * k:(i + 1) * k]
        correct = [s >= 1.0 - 1e-9 for s in scores]
        right.append(sum(correct))
        per_item.append(sum(correct) / k)
        item_scores.append(sum(scores) / k)
        samples.append({"row": i, "prompt": prompts[i], "reference": str(row["reference"]),
                        "answers": answers[i * k:(i + 1) * k], "scores": scores, "correct": sum(correct),
                        "acc": per_item[-1]})
    metrics: dict[str, float] = {}
    metrics["acc"], metrics["acc_stderr"] = mean_and_stderr(per_item)
    metrics["mean_score"] = sum(item_scores) / len(item_scores)
    if k > 1:
        metrics[f"mean@{k}"] = metrics["acc"]
        metrics[f"pass@{k}"] = sum(pass_at_k(k, c, k) for c in right) / len(right)
    result: dict[str, Any] = {"kind": "generation", "prompt": "chat" if settings.chat else "plain",
                              "n_shot": settings.n_shot, "items": len(rows), "samples_per_item": k,
                              "temperature": settings.temperature, "verifier": settings.rewards, "metrics": metrics}
    if settings.log_samples:
        result["samples"] = samples
    return result

