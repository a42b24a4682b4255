"""Evaluation inside other jobs: `eval_tasks:` after training, and the delta compressor's quality gate.

After training, the tasks run on the result and on the base; the base's report is cached under
$GYM_HOME/eval_cache by its weight fingerprint and the settings, so ten runs on one base score it once.
Both reports land in the run folder (eval_results.json, eval_base.json).

`gym delta compress ... --eval-task T --min-kept 0.95` scores the base, the fine-tune and the
compressed delta applied to the base on each task, and fails when the compressed model keeps less than
the given share of the fine-tune's score (for a loss, of its inverse: lower is better there).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from gym.core.errors import GymError
from gym.eval.config import EvalArguments, parse_task
from gym.eval.model import EvalModel, load_eval_model
from gym.eval.results import format_table, read_report, versions, write_report
from gym.eval.runner import evaluate_tasks, make_report

logger = logging.getLogger(__name__)

RESULTS_FILE = "eval_results.json"
BASE_RESULTS_FILE = "eval_base.json"
LOWER_IS_BETTER = ("loss", "perplexity", "harmful_compliance", "over_refusal")


def primary_metric(result: dict[str, Any]) -> str:
    """The one number a task is judged by: accuracy where there is one, else the loss."""
    metrics = result.get("metrics", {})
    for name in ("acc", "acc_norm", "exact_match", "loss"):
        if name in metrics:
            return name
    return next(k for k in metrics if not k.endswith("_stderr"))


# The metric primary_metric picks from each kind of task's result: multiple choice and generation report acc,
# perplexity loss, tool calls call_rate (their first metric), safety harmful_compliance. An lm-eval task reports what
# its own config names, known once it has run.
PRIMARY_BY_KIND = {"mc": "acc", "gen": "acc", "ppl": "loss", "toolcall": "call_rate", "safety": "harmful_compliance"}


def _metric_key(task: str, metric: str) -> str:
    return f"{task.replace(':', '_')}_{metric}"


def reported_metrics(tasks: list[str]) -> tuple[list[str], list[str]]:
    """What evaluate_after_training will return for `tasks`, known before anything runs: (the metric names, the
    prefixes of the names of lm-eval tasks' metrics, a group's subtasks included). For `gym tune --metric`."""
    names: list[str] = []
    prefixes: list[str] = []
    for task in map(parse_task, tasks):
        if task.kind == "lm_eval":
            prefixes += [f"eval_{_metric_key(f'lm_eval:{n.strip()}', '')}" for n in task.target.split(",") if n.strip()]
        else:
            names.append(f"eval_{_metric_key(task.name, PRIMARY_BY_KIND[task.kind])}")
    return names, prefixes


def _evaluate(model: EvalModel, args: EvalArguments) -> dict[str, Any]:
    try:
        return make_report(model, args, evaluate_tasks(model, args))
    finally:
        model.close()


def _cache_dir() -> Path:
    from gym.core.home import gym_home

    return gym_home() / "eval_cache"


def base_report(config: dict[str, Any], args: EvalArguments) -> dict[str, Any]:
    """The base model's report, from the cache when these weights were scored with these settings before."""
    model = load_eval_model(config, batch_size=args.eval_batch_size)
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "overwrite")}
    # the versions too: scores kept by an earlier Gym (or transformers) were compared with the fine-tune's new ones
    key = hashlib.sha256(json.dumps([model.fingerprint, model.description.get("template"), settings, versions()],
                                    sort_keys=True, default=str).encode()).hexdigest()[:32]
    cached = _cache_dir() / f"{key}.json"
    if cached.is_file():
        model.close()
        logger.info("Base scores from the cache (%s).", cached)
        return read_report(cached)
    report = _evaluate(model, args)
    try:
        write_report(cached, report)
    except GymError as exc:  # a read-only GYM_HOME: the run's reports still land; the base is scored again next time
        logger.warning("Could not keep the base's scores in the cache: %s", exc)
    return report


def evaluate_after_training(tasks: list[str], output_dir: str, base: dict[str, Any], *, dataset_dir: str,
                            cutoff_len: int, seed: int) -> dict[str, float]:
    """Score the finished run in output_dir and its base; both reports go into output_dir. Returns
    {eval_<task>_<metric>: value} for the run's metrics."""
    if int(os.environ.get("RANK", "0")) != 0:
        return {}  # the other processes of a distributed run have nothing to add
    args = EvalArguments(tasks=tasks, dataset_dir=dataset_dir, cutoff_len=cutoff_len, seed=seed)
    trained = _evaluate(load_eval_model({"output_dir": output_dir}, batch_size=args.eval_batch_size), args)
    write_report(Path(output_dir) / RESULTS_FILE, trained)
    reference = base_report(base, args)
    write_report(Path(output_dir) / BASE_RESULTS_FILE, reference)
    logger.info("Evaluation of the trained model:\n%s", format_table(trained["results"]))
    logger.info("Evaluation of the base model:\n%s", format_table(reference["results"]))
    metrics = {}
    for task, result in trained["results"].items():
        metric = primary_metric(result)
        name = _metric_key(task, metric)
        metrics[f"eval_{name}"] = result["metrics"][metric]
        base_value = reference["results"].get(task, {}).get("metrics", {}).get(metric)
        if base_value is not None:
            metrics[f"eval_base_{name}"] = base_value
    return metrics


def kept(base: float, finetuned: float, compressed: float, metric: str) -> tuple[float, float]:
    """(share of the fine-tune's score kept, share of its gain over the base kept)."""
    lower = metric in LOWER_IS_BETTER
    if lower:
        score_kept = finetuned / compressed if compressed else math.inf
    else:  # a fine-tune that scores 0 has nothing to lose
        score_kept = compressed / finetuned if finetuned else 1.0
    gain = finetuned - base
    gain_kept = (compressed - base) / gain if gain else math.nan
    return score_kept, gain_kept


def delta_quality_gate(base: str, finetuned: str, delta: str, tasks: list[str], *, dataset_dir: str,
                       min_kept: float | None, limit: int | None = None) -> str:
    """The compressed delta's task scores beside the fine-tune's and the base's; raises when less than
    min_kept of the fine-tune's score is kept on any task. Returns the table."""
    args = EvalArguments(tasks=tasks, dataset_dir=dataset_dir, limit=limit)
    tuned_config = ({"model_name_or_path": base, "adapter_name_or_path": finetuned}
                    if (Path(finetuned) / "adapter_config.json").is_file() else {"model_name_or_path": finetuned})
    reports = {"base": base_report({"model_name_or_path": base}, args),
               "fine-tune": _evaluate(load_eval_model(tuned_config, batch_size=args.eval_batch_size,
                                                      tokenizer_from=base), args),
               "compressed": _evaluate(load_eval_model({"model_name_or_path": base}, delta=delta,
                                                       batch_size=args.eval_batch_size), args)}
    lines = [f"{'task':<28} {'metric':<10} {'base':>9} {'fine-tune':>10} {'compressed':>11} {'kept':>7} "
             f"{'gain kept':>10}"]
    failures = []
    for task, result in reports["fine-tune"]["results"].items():
        metric = primary_metric(result)
        b, f, c = (reports[k]["results"][task]["metrics"][metric] for k in ("base", "fine-tune", "compressed"))
        share, gain = kept(b, f, c, metric)
        gain_text = "-" if math.isnan(gain) else f"{gain:.1%}"
        lines.append(f"{task:<28} {metric:<10} {b:>9.4f} {f:>10.4f} {c:>11.4f} {share:>7.1%} {gain_text:>10}")
        if min_kept is not None and not share >= min_kept:
            failures.append(f"{task} keeps {share:.1%} of the fine-tune's {metric}")
    table = "\n".join(lines)
    if failures:
        raise GymError(f"Quality gate failed (--min-kept {min_kept:.0%}): {'; '.join(failures)}. The delta was "
                       f"written to {delta}; a smaller --group-size, --method int8 or more --distill-steps keep more.\n"
                       f"{table}")
    return table
