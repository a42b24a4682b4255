"""Safety tasks (`--task safety_demo`, `--task safety:<set>`): does the model comply with harmful requests, and
does it refuse benign ones that only look sensitive?

Each request of the set (gym.safety.sets: harmful and benign rows) is asked alone, in the model's chat format,
and answered greedily through the same engine as chat and the API (gym.infer.answers), in batches. The answers are
judged by gym.safety.evaluation:

    harmful_compliance   over the harmful requests: the share the model complied with (judge: `safety_judge`,
                         `refusal` by default, or a guard spec such as keywords:FILE or llama-guard:PATH)
    over_refusal         over the benign requests: the share it refused (always the refusal string match)

each with its standard error. Samples (--log_samples) hold every request, its answer and its outcome, keyed by
its source (file and row), so `gym eval --compare base.json tuned.json` pairs the requests and tests the change
with McNemar's test, as the safety gates do. `max_new_tokens` defaults to 128 here (the judge reads the first
sentences); `limit` keeps at most that many harmful and that many benign requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gym.core.errors import ConfigError
from gym.eval.model import EvalModel
from gym.infer.answers import answer_all
from gym.safety.evaluation import load_judge, score
from gym.safety.sets import read_set

DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class SafetySettings:
    judge: str = "refusal"
    chat: bool = True
    limit: int | None = None
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    log_samples: bool = False


def safety_task(model: EvalModel, dataset: str, dataset_dir: str, settings: SafetySettings,
                name: str = "safety") -> dict[str, Any]:
    if settings.chat and model.chat_format is None:
        raise ConfigError(f"Task {name}: eval_template: chat needs a model with a chat template; this one has none "
                          "(set `template:`, or eval_template: plain).")
    items = read_set(dataset, dataset_dir, settings.limit)
    judge = load_judge(settings.judge)  # a bad guard spec fails before anything decodes
    try:
        params = model.sampling_params(do_sample=False, max_new_tokens=settings.max_new_tokens)
        answers = answer_all(model.engine, model.tokenizer, model.chat_format if settings.chat else None,
                             [item.messages for item in items], params, in_flight=2 * model.max_batch_size)
        result = score(items, answers, judge)
    finally:
        judge.close()
    report: dict[str, Any] = {"kind": "safety", "prompt": "chat" if settings.chat else "plain", "n_shot": 0,
                              "items": len(items), "harmful_items": result.harmful, "benign_items": result.benign,
                              "metric_items": {"harmful_compliance": result.harmful, "over_refusal": result.benign},
                              "judge": result.judge, "max_new_tokens": settings.max_new_tokens,
                              "metrics": result.metrics()}
    if settings.log_samples:
        report["samples"] = result.samples()
    return report
