"""`gym tfgrpo train CONFIG` / `gym tfgrpo eval CONFIG [--experiences FILE]`: Training-Free GRPO from YAML.

train: learns the library into output_dir (experiences.json after every batch; steps/step_NNNN.json per
version; tfgrpo_state.json to resume; calls.jsonl, every answer), then prints it with a usage report.
eval: Mean@k and Pass@k on `eval_dataset` (or the `val_size` rows held out of `dataset`, chosen with the
seed as train chose them), without the library (the baseline) and with it, side by side.
Keys: GRPOConfig's and TFGRPOJob's (gym.tfgrpo.config), plus the local model's `gym chat` keys.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from gym.config.files import parse_cli_args
from gym.core.errors import ConfigError
from gym.core.files import CONFIG_FILE, OutputLock, make_folder, temp_path
from gym.core.names import did_you_mean
from gym.tfgrpo.config import GRPOConfig, TFGRPOJob, parse_job
from gym.tfgrpo.library import ExperienceLibrary
from gym.tfgrpo.tasks import Task, split_held_out, tasks_from
from gym.tfgrpo.trainer import LIBRARY_FILE, EvalResult, TrainingFreeGRPO

logger = logging.getLogger(__name__)

USAGE = """usage: gym tfgrpo train CONFIG [key=value ...]
       gym tfgrpo eval CONFIG [--experiences FILE|none] [--eval_samples K] [key=value ...]

Training-Free GRPO: learn a library of lessons in the prompt, no weights change (docs/tfgrpo.md).
Example: gym tfgrpo train examples/tfgrpo_arithmetic.yaml"""

_SECRETS = ("api_key", "updater_api_key")


VERBS = ("train", "eval")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] not in VERBS:
        raise ConfigError(f"unknown tfgrpo command '{argv[0]}'."
                          f"{did_you_mean(argv[0], VERBS, ' Choose train or eval.')} (gym tfgrpo --help)")
    verb, rest = argv[0], argv[1:]
    config, job, local = parse_job(parse_cli_args(rest))
    return train(config, job, local) if verb == "train" else evaluate(config, job, local)


def _split(config: GRPOConfig, job: TFGRPOJob) -> tuple[list[Task], list[Task]]:
    if not job.dataset:
        raise ConfigError("Set `dataset:` (queries with answers: a name in dataset_info.json or a file).")
    tasks = tasks_from(job.dataset, job.dataset_dir, job.max_samples)
    if job.eval_dataset:
        return tasks, tasks_from(job.eval_dataset, job.dataset_dir, job.max_samples)
    return split_held_out(tasks, job.val_size, config.seed)


def _save_config(folder: Path, config: GRPOConfig, job: TFGRPOJob, local: dict[str, Any]) -> None:
    values = {**{k: v for k, v in vars(config).items() if k not in _SECRETS}, **vars(job), **local}
    tmp = temp_path(folder / CONFIG_FILE)
    tmp.write_text(yaml.safe_dump(values, sort_keys=False, allow_unicode=True), encoding="utf-8")
    os.replace(tmp, folder / CONFIG_FILE)


def train(config: GRPOConfig, job: TFGRPOJob, local: dict[str, Any]) -> int:
    tasks, held_out = _split(config, job)
    out = Path(job.output_dir)
    with OutputLock(out, what="gym tfgrpo train"):
        _save_config(out, config, job, local)
        trainer = TrainingFreeGRPO(job.model, config, local=local)
        try:
            library = trainer.train(tasks, job.reward_funcs, reward_weights=job.reward_weights, output_dir=out,
                                    overwrite=job.overwrite_output_dir)
        finally:
            trainer.close()
        (out / "usage.json").write_text(json.dumps(trainer.usage.to_json(), indent=1) + "\n", encoding="utf-8")
    held = f"; {len(held_out)} queries held out for `gym tfgrpo eval`" if held_out else ""
    print(f"Library after step {library.step} ({len(library)} experiences), trained on {len(tasks)} queries{held}:")
    print(library.render() or _why_empty(trainer))
    print(f"\nUsage (this process):\n{trainer.usage.report(config.prices)}")
    print(f"\nSaved {out / LIBRARY_FILE}")
    return 0


def _why_empty(trainer: TrainingFreeGRPO) -> str:
    if not any(step.partial_groups for step in trainer.history):
        return "(empty: in every group all rollouts scored the same, so there was nothing to compare)"
    return ("(empty: the updater proposed no change that could be read; see the warnings above, or use a stronger "
            "updater_model)")


def _library(job: TFGRPOJob) -> ExperienceLibrary | None:
    if job.experiences is not None and job.experiences.lower() == "none":
        return None
    path = Path(job.experiences) if job.experiences else Path(job.output_dir) / LIBRARY_FILE
    if job.experiences is None and not path.is_file():
        logger.info("No library at %s: evaluating the baseline only.", path)
        return None
    return ExperienceLibrary.load(path)


def _row(name: str, result: EvalResult) -> str:
    return f"{name:<22}{result.mean_at_k:>10.3f}{result.pass_at_k:>10.3f}"


def evaluate(config: GRPOConfig, job: TFGRPOJob, local: dict[str, Any]) -> int:
    _, tasks = _split(config, job)
    if not tasks:
        raise ConfigError("Nothing to evaluate on: set `eval_dataset`, or `val_size` to hold rows of `dataset` out.")
    library = _library(job)
    trainer = TrainingFreeGRPO(job.model, config, local=local)
    try:
        results = {"baseline": trainer.evaluate(tasks, ExperienceLibrary(), job.reward_funcs,
                                                reward_weights=job.reward_weights)}
        if library is not None and len(library):
            results["with experiences"] = trainer.evaluate(tasks, library, job.reward_funcs,
                                                           reward_weights=job.reward_weights)
    finally:
        trainer.close()
    k = config.eval_samples
    print(f"{len(tasks)} queries, k = {k} samples each at temperature {config.temperature_eval}")
    print(f"{'':<22}{f'Mean@{k}':>10}{f'Pass@{k}':>10}")
    for name, result in results.items():
        print(_row(name, result))
    print(f"\nUsage:\n{trainer.usage.report(config.prices)}")
    out = Path(job.output_dir)
    make_folder(out)
    report: dict[str, Any] = {name: r.as_json() for name, r in results.items()}
    report["library"] = None if library is None else {"size": len(library), "step": library.step}
    report["usage"] = trainer.usage.to_json()
    tmp = temp_path(out / "eval_results.json")
    tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / "eval_results.json")
    print(f"Saved {out / 'eval_results.json'}")
    return 0
