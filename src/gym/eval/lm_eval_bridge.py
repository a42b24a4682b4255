"""`--task lm_eval:<names>`: EleutherAI's lm-evaluation-harness, in-process, on the model Gym already loaded.

lm-eval's HFLM wraps our model object and tokenizer (no second load), so every lm-eval task runs on
exactly what the other tasks scored: adapters merged, a delta or variant applied. Names are lm-eval's
registered tasks (most download their data: they need the network once), tasks in YAML files under
`lm_eval_include`, or a Gym multiple-choice dataset with local files (`lm_eval:mc_demo`), which is given
to lm-eval as MMLU's task definition over our files: the same prompt Gym's own `mc` scoring builds, so
the two `acc` agree item by item.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean
from gym.data.registry import get_dataset_attrs, read_dataset_info
from gym.eval.mc import LETTERS, read_items
from gym.eval.model import EvalModel

logger = logging.getLogger(__name__)


def require_lm_eval() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise ConfigError("lm_eval: tasks need lm-evaluation-harness: pip install 'zoo-gym[eval]'.")


@functools.lru_cache(maxsize=4)
def _task_manager(include: str | None) -> Any:
    """lm-eval's index of its tasks (seconds to build), built once for the check before the model loads and the run."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include) if include else TaskManager()


def check_task_names(names: list[str], dataset_dir: str, include: str | None) -> None:
    """Every name is an lm-eval task or a Gym dataset, checked before the model loads: a misspelt one failed only
    when its turn came, after the model loaded and the tasks before it ran, and a misspelt Gym dataset (mc_dmeo) was
    offered lm-eval's names only."""
    require_lm_eval()
    manager = _task_manager(include)
    local = read_dataset_info(dataset_dir)
    for name in names:
        if name not in manager.all_tasks and name not in local:
            raise ConfigError(f"lm_eval: unknown task {name!r}.{did_you_mean(name, [*manager.all_tasks, *local])} "
                              "Give an lm-eval task name, a task under lm_eval_include, or a Gym multiple-choice "
                              "dataset.")


def gym_mc_task(dataset: str, dataset_dir: str) -> dict[str, Any]:
    """lm-eval's config for a Gym multiple-choice dataset in local files (MMLU's prompt, letters A-D)."""
    attr = next(iter(get_dataset_attrs(dataset, dataset_dir)))
    if attr.load_from != "file" or not Path(attr.path).is_file():
        raise ConfigError(f"lm_eval:{dataset}: Gym hands lm-eval a multiple-choice dataset as one local file; "
                          f"{attr.path} is not one.")
    n = max(len(item.choices) for item in read_items(dataset, dataset_dir))
    letters = list(LETTERS[:n])
    choices = "".join(f"\n{letter}. {{{{{letter}}}}}" for letter in letters)
    files = {"test": str(Path(attr.path).resolve())}
    dev = f"{dataset}_dev"
    if dev in read_dataset_info(dataset_dir):
        files["dev"] = str(Path(next(iter(get_dataset_attrs(dev, dataset_dir))).path).resolve())
    config: dict[str, Any] = {
        "task": f"gym_{dataset}", "dataset_path": "json", "dataset_kwargs": {"data_files": files},
        "test_split": "test", "output_type": "multiple_choice",
        "description": "The following are multiple choice questions (with answers) about "
                       "{{subject.replace('_', ' ')}}.\n\n",
        "doc_to_text": "{{question.strip()}}" + choices + "\nAnswer:",
        "doc_to_choice": letters, "doc_to_target": "{{" + str(letters) + ".index(answer)}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    if "dev" in files:
        config.update({"fewshot_split": "dev", "fewshot_config": {"sampler": "first_n"}})
    return config


def run_lm_eval(model: EvalModel, names: list[str], *, n_shot: int | None, limit: int | None, batch_size: int,
                dataset_dir: str, include: str | None, chat: bool, seed: int, log_samples: bool
                ) -> dict[str, Any]:
    check_task_names(names, dataset_dir, include)
    from lm_eval import evaluator
    from lm_eval.models.huggingface import HFLM

    manager = _task_manager(include)
    tasks = [name if name in manager.all_tasks else gym_mc_task(name, dataset_dir) for name in names]
    device = str(next(model.model.parameters()).device)
    lm = HFLM(pretrained=model.model, tokenizer=model.tokenizer, batch_size=batch_size, device=device)
    output = evaluator.simple_evaluate(
        model=lm, tasks=tasks, num_fewshot=n_shot, limit=limit, task_manager=manager, log_samples=log_samples,
        apply_chat_template=chat, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed, bootstrap_iters=1000)
    if output is None:  # simple_evaluate answers only on rank 0 of a distributed run
        raise ConfigError("lm-eval returned no results (not the main process of a distributed run?).")
    results: dict[str, Any] = {}
    for task, values in output["results"].items():
        metrics = {}
        for key, value in values.items():
            # "sample_len" is lm-eval's count of a task's items (reported as `items`), not a score
            if key in ("alias", "sample_len") or not isinstance(value, (int, float)):
                continue
            metric, _, _ = key.partition(",")  # lm-eval names metrics "acc,none" (metric, filter)
            metrics[metric] = float(value)
        entry: dict[str, Any] = {"kind": "lm_eval", "metrics": metrics,
                                 "n_shot": output.get("n-shot", {}).get(task),
                                 "items": (output.get("n-samples", {}).get(task) or {}).get("effective")}
        if log_samples and "samples" in output and task in output["samples"]:
            entry["samples"] = [{"doc_id": s.get("doc_id"), "target": s.get("target"), "logprobs": _logprobs(s),
                                 **{k: s.get(k) for k in metrics if k in s}} for s in output["samples"][task]]
        results[f"lm_eval:{task}"] = entry
    return results


def _logprobs(sample: dict[str, Any]) -> list[float] | None:
    """A multiple-choice sample's log-likelihood per choice ([(loglik, is_greedy), ...] in lm-eval)."""
    try:
        return [float(r[0]) for r in sample["filtered_resps"]]
    except (KeyError, TypeError, IndexError, ValueError):
        return None
