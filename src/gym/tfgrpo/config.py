"""Training-Free GRPO settings: `GRPOConfig` (the algorithm, as documented) and `TFGRPOJob` (what
`gym tfgrpo` reads from YAML: the model, the data, the rewards and where to write).

Defaults are the authors' (youtu-agent, utu/config/practice_config.py and configs/practice/): 3 epochs,
groups of 5, rollouts at temperature 0.7, at most 2 lessons per group (their math config uses 1), lessons
of at most 32 words, batches of 64 queries; the updater answers at temperature 0 (their branch's LLM
default), evaluation at 0.3 with 32 samples per query (their math evaluation, Mean@32).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from gym.config.coerce import coerce
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean
from gym.core.options import check_bool, check_number, check_whole, strict_fields


@strict_fields
@dataclass
class GRPOConfig:
    """How Training-Free GRPO learns. Every field is also a key of `gym tfgrpo` YAML."""

    # --- the loop
    group_size: int = 5
    """Rollouts per query (G)."""
    max_epochs: int = 3
    batch_size: int = 64
    """Queries per step; the library is updated (and saved) once per batch. The last batch may be smaller."""
    temperature_train: float = 0.7
    """Rollout temperature."""
    temperature_update: float = 0.0
    """Temperature of the summary, advantage and update calls (and the LLM judge)."""
    temperature_eval: float = 0.3
    eval_samples: int = 32
    """k of Mean@k / Pass@k in evaluation."""
    max_lessons: int = 2
    """K: at most this many lessons extracted per group."""
    max_words: int = 32
    """Each experience is cut to this many words."""
    max_tokens: int = 1024
    """Rollout (and evaluation) answer length."""
    update_max_tokens: int = 1024
    """Answer length of the summary/advantage/update/judge calls."""
    system_prompt: str | None = None
    """Shown before the lessons in every rollout (the lessons alone when unset; nothing when both are empty)."""
    seed: int = 42
    shuffle: bool = True

    # --- calls
    max_concurrency: int = 16
    """Calls in flight at once (the local engine batches them)."""
    max_parse_retries: int = 2
    """An answer that is not the JSON asked for is asked again this many times, then skipped with a logged reason."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint for the model (unset: the model is a Gym model on the local engine)."""
    api_key: str | None = None
    """The endpoint's key (default: $OPENAI_API_KEY). Never written to the saved config."""
    updater_model: str | None = None
    """A different model for the summary/advantage/update/judge calls (default: the rollout model)."""
    updater_base_url: str | None = None
    updater_api_key: str | None = None
    max_retries: int = 6
    """Retries of an endpoint call on 429/5xx/timeouts, with exponential backoff."""
    retry_delay: float = 1.0
    """Seconds before the first retry; doubled each time, at most 60."""
    timeout: float = 600.0
    """Seconds one endpoint call may take in all, from the request to the last byte of the answer (then retried)."""
    prices: dict[str, list[float]] | None = None
    """Dollars per million [prompt, completion] tokens by role or by "rollout"/"updater", for the usage report."""
    cache_calls: bool = True
    """Record every answer in output_dir/calls.jsonl, so a resumed or repeated run replays instead of calling."""

    def __post_init__(self) -> None:
        positive = ("group_size", "max_epochs", "batch_size", "eval_samples", "max_lessons", "max_words",
                    "max_tokens", "update_max_tokens", "max_concurrency")
        for name in positive:
            check_whole(name, getattr(self, name), 1)
        if self.group_size < 2:
            raise ConfigError("'group_size' must be at least 2: lessons come from comparing rollouts of one query.")
        for name in ("temperature_train", "temperature_update", "temperature_eval"):
            check_number(name, getattr(self, name), 0, 2)
        check_whole("max_parse_retries", self.max_parse_retries, 0)
        check_whole("max_retries", self.max_retries, 0)
        check_number("retry_delay", self.retry_delay, 0)  # NaN is refused too: it would reach time.sleep
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0 and math.isfinite(self.timeout)):
            raise ConfigError(f"'timeout' must be a number of seconds above 0, got {self.timeout!r}: it is the most a "
                              "call to the endpoint may take, from the request to the last byte of the answer.")
        for name in ("shuffle", "cache_calls"):
            check_bool(name, getattr(self, name))
        for name in ("system_prompt", "base_url", "api_key", "updater_model", "updater_base_url", "updater_api_key"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(f"'{name}' must be a string or None, got {type(getattr(self, name)).__name__}.")
        for name in ("base_url", "updater_base_url"):
            url = getattr(self, name)
            # Anything else fails only as a connection error, after every retry (a minute with the defaults).
            if url is not None and not url.lower().startswith(("http://", "https://")):
                raise ConfigError(f"'{name}' must be an http:// or https:// address of an OpenAI-compatible "
                                  f"endpoint (e.g. http://127.0.0.1:8000/v1), got {url!r}.")
        if self.prices is not None and not isinstance(self.prices, dict):
            raise ConfigError("'prices' maps a role (rollout, updater, ...) to [dollars per 1M prompt tokens, per 1M "
                              f"completion tokens], got {self.prices!r}.")
        for role, price in (self.prices or {}).items():
            if not (isinstance(price, (list, tuple)) and len(price) == 2 and all(
                    isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p < math.inf for p in price)):
                raise ConfigError(f"prices.{role}: give [dollars per 1M prompt tokens, per 1M completion tokens], two "
                                  f"numbers >= 0; got {price!r}.")

    def fingerprint(self) -> dict[str, Any]:
        """What decides the library a run learns (not how fast or through which connection it is learned)."""
        skip = {"max_concurrency", "api_key", "updater_api_key", "max_retries", "retry_delay", "timeout", "prices",
                "cache_calls", "temperature_eval", "eval_samples"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass
class TFGRPOJob:
    """The rest of a `gym tfgrpo` YAML."""

    model: str | None = None
    """A Gym model (the embedded default, a folder, a hub id) or, with base_url, the endpoint's model name."""
    dataset: str | None = None
    """Queries with reference answers: a name in dataset_info.json or a file (prompt + answer columns)."""
    eval_dataset: str | None = None
    val_size: float = 0.0
    """Hold out this many rows (a fraction below 1) of `dataset` for `gym tfgrpo eval`, chosen with the seed."""
    dataset_dir: str = "data"
    max_samples: int | None = None
    reward_funcs: list[str] = field(default_factory=lambda: ["accuracy"])
    """accuracy, format[:regex], length:N, python:module:function, judge (an LLM grades against the answer)."""
    reward_weights: list[float] | None = None
    output_dir: str = "saves/tfgrpo"
    overwrite_output_dir: bool = False
    experiences: str | None = None
    """For eval: a library file (default: output_dir/experiences.json when it exists)."""

    def __post_init__(self) -> None:
        # 0 read as "no limit" (every row), where gym train refuses it.
        check_whole("max_samples", self.max_samples, 1, optional=True)


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def parse_job(config: dict[str, Any]) -> tuple[GRPOConfig, TFGRPOJob, dict[str, Any]]:
    """A flat YAML dict -> (algorithm, job, the local model's inference keys). Unknown keys get "did you mean"."""
    from gym.config.aliases import KEY_ALIASES
    from gym.config.parser import known_keys

    algorithm_fields, job_fields = _fields(GRPOConfig), _fields(TFGRPOJob)
    infer_keys = known_keys()
    algorithm: dict[str, Any] = {}
    job: dict[str, Any] = {}
    local: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = str(raw_key).replace("-", "_")
        if key == "model_name_or_path":
            key = "model"
        if key in algorithm_fields:
            algorithm[key] = coerce(key, value, algorithm_fields[key])
        elif key in job_fields:
            job[key] = coerce(key, value, job_fields[key])
        elif key in infer_keys or key in KEY_ALIASES:
            local[key] = value
        else:
            known = [*algorithm_fields, *job_fields, "model_name_or_path", "template", "infer_backend", "infer_dtype"]
            raise ConfigError(f"Unknown tfgrpo key '{key}'.{did_you_mean(key, known, '')} TF-GRPO keys: "
                              f"{', '.join(sorted([*algorithm_fields, *job_fields]))}; plus the model keys of "
                              "`gym chat` (template, infer_backend, ...).")
    if isinstance(job.get("reward_funcs"), str):
        job["reward_funcs"] = [s.strip() for s in job["reward_funcs"].split(",") if s.strip()]
    return GRPOConfig(**algorithm), TFGRPOJob(**job), local
