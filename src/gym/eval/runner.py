"""`run_eval`: load the model once, run every task on it, return (and write) the report."""

from __future__ import annotations

import datetime
import logging
import random
from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ConfigError, OutputError
from gym.core.files import refuse_output_over_input, refuse_overwrite
from gym.core.names import split_names
from gym.data.registry import get_dataset_attrs
from gym.eval.config import EvalArguments, parse_eval
from gym.eval.generation import GenSettings, generate_task
from gym.eval.loglik import LoglikScorer
from gym.eval.mc import MCSettings, MCTask, dev_dataset, read_items
from gym.eval.model import EvalModel, load_eval_model
from gym.eval.perplexity import perplexity
from gym.eval.results import check_writable, versions, write_report
from gym.eval.safety import DEFAULT_MAX_NEW_TOKENS as SAFETY_MAX_NEW_TOKENS
from gym.eval.safety import SafetySettings, safety_task
from gym.eval.toolcall import ToolCallSettings, toolcall_task

logger = logging.getLogger(__name__)


def _check_datasets(args: EvalArguments) -> None:
    """Unknown dataset names fail before the model loads (reading the rows waits for the task); so does a missing
    or damaged --delta (its header alone is read here), which failed only after the base model had loaded."""
    if args.delta is not None:
        from gym.delta.format import read_header

        read_header(args.delta)
    for task in args.parsed_tasks():
        if task.kind != "lm_eval":
            get_dataset_attrs(task.target, args.dataset_dir)
    if any(t.kind == "safety" for t in args.parsed_tasks()):
        from gym.safety.evaluation import check_judge

        check_judge(args.safety_judge)  # a bad spec or keyword list fails before the model loads
    lm_eval_names = [n for t in args.parsed_tasks() if t.kind == "lm_eval" for n in t.target.split(",")]
    if lm_eval_names:
        from gym.eval.lm_eval_bridge import check_task_names

        check_task_names(lm_eval_names, args.dataset_dir, args.lm_eval_include)


def _refuse_output_over_inputs(args: EvalArguments, model_config: dict[str, Any]) -> None:
    """`-o` is never a task's data file or the delta, and never replaces a file of the model's folders (its
    config.json, weights, tokenizer), `--overwrite` or not: only an earlier gym eval report there."""
    assert args.output is not None
    data = [attr.path for task in args.parsed_tasks() if task.kind != "lm_eval"
            for attr in get_dataset_attrs(task.target, args.dataset_dir) if attr.load_from == "file"]
    adapters = model_config.get("adapter_name_or_path")
    folders = [str(model_config.get("model_name_or_path") or ""),
               *(split_names(adapters) if isinstance(adapters, str) else [str(a) for a in adapters or []])]
    refuse_output_over_input(args.output, [*data, args.delta, *folders], how="--overwrite")
    out = Path(args.output).expanduser().resolve()
    for folder in folders:
        if folder and Path(folder).expanduser().is_dir() and Path(folder).expanduser().resolve() in out.parents \
                and out.is_file() and not _is_report(out):
            raise OutputError(f"{args.output} is a file of the model folder {folder}, not a gym eval report: "
                              "--overwrite would replace it. Write the results elsewhere.")


def _is_report(path: Path) -> bool:
    """Whether `path` is a report write_report wrote (it opens with made_by); only its start is read."""
    with path.open("rb") as handle:
        return b'"made_by": "gym eval"' in handle.read(200)


def evaluate_tasks(model: EvalModel, args: EvalArguments) -> dict[str, Any]:
    """{task name: its result} for every task of `args`, on an already loaded model."""
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    chat = args.eval_template == "chat" or (args.eval_template == "auto" and model.chat_format is not None)
    scorer = LoglikScorer(model.model, args.eval_batch_size, pad_id=model.pad_id)
    results: dict[str, Any] = {}
    for task in args.parsed_tasks():
        logger.info("Evaluating %s", task.name)
        if task.kind == "mc":
            dev = dev_dataset(task.target, args.dataset_dir)
            mc = MCTask(task.name, read_items(task.target, args.dataset_dir),
                        read_items(dev, args.dataset_dir) if dev else None)
            settings = MCSettings(n_shot=5 if args.n_shot is None else args.n_shot, chat=chat, limit=args.limit,
                                  log_samples=args.log_samples)
            results[task.name] = mc.run(model, settings, scorer)
        elif task.kind == "ppl":
            results[task.name] = perplexity(model, task.target, args.dataset_dir, cutoff_len=args.cutoff_len,
                                            limit=args.limit, batch_size=args.eval_batch_size,
                                            log_samples=args.log_samples)
        elif task.kind == "gen":
            settings_gen = GenSettings(rewards=args.verifier, n_shot=args.n_shot or 0, chat=chat, limit=args.limit,
                                       num_samples=args.num_samples, temperature=args.temperature,
                                       max_new_tokens=args.max_new_tokens or 256, seed=args.seed,
                                       log_samples=args.log_samples)
            results[task.name] = generate_task(model, task.target, args.dataset_dir, settings_gen)
        elif task.kind == "toolcall":
            settings_tool = ToolCallSettings(chat=chat, limit=args.limit, max_new_tokens=args.max_new_tokens or 256,
                                             log_samples=args.log_samples)
            results[task.name] = toolcall_task(model, task.target, args.dataset_dir, settings_tool, task.name)
        elif task.kind == "safety":
            settings_safety = SafetySettings(judge=args.safety_judge, chat=chat, limit=args.limit,
                                             max_new_tokens=args.max_new_tokens or SAFETY_MAX_NEW_TOKENS,
                                             log_samples=args.log_samples)
            results[task.name] = safety_task(model, task.target, args.dataset_dir, settings_safety, task.name)
        else:
            from gym.eval.lm_eval_bridge import run_lm_eval

            results.update(run_lm_eval(model, [n.strip() for n in task.target.split(",") if n.strip()],
                                       n_shot=args.n_shot, limit=args.limit, batch_size=args.eval_batch_size,
                                       dataset_dir=args.dataset_dir, include=args.lm_eval_include, chat=chat,
                                       seed=args.seed, log_samples=args.log_samples))
    return results


def make_report(model: EvalModel, args: EvalArguments, results: dict[str, Any]) -> dict[str, Any]:
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "overwrite")}
    return {"made_by": "gym eval", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "model": {**model.description, "fingerprint": model.fingerprint}, "seed": args.seed,
            "settings": settings, "versions": versions(), "results": results}


def run_eval(config: dict[str, Any]) -> dict[str, Any]:
    """Evaluate what `config` names (the model keys of `gym chat` plus the eval keys); the report."""
    args, model_config = parse_eval(config)
    if not args.tasks:
        raise ConfigError("No tasks to run: give --task (e.g. --task mc_demo --task arithmetic), or eval_tasks: "
                          "in the config.")
    if args.output:
        refuse_overwrite(args.output, args.overwrite)
    _check_datasets(args)
    if args.output:
        _refuse_output_over_inputs(args, model_config)
        check_writable(args.output)
    model = load_eval_model(model_config, delta=args.delta, variant=args.variant, batch_size=args.eval_batch_size)
    try:
        report = make_report(model, args, evaluate_tasks(model, args))
    finally:
        model.close()
    if args.output:
        write_report(args.output, report)
    return report
