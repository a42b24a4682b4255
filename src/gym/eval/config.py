"""What `gym eval` reads besides the model keys: which tasks, and how to run them.

Tasks (`--task`, repeatable; `eval_tasks:` in a YAML):

    mc_demo             Gym's own multiple-choice demo (5 subjects, 300 questions, dev shots)
    mmlu                MMLU from the hub (cais/mmlu, 57 subjects; needs the network once)
    arithmetic          word problems with a checkable number (arithmetic_demo), generated and verified
    gsm8k               GSM8K's test set from the hub (openai/gsm8k)
    mc:<dataset>        any multiple-choice dataset (dataset_info.json name, or a file)
    ppl:<dataset>       perplexity and loss on any dataset (answers of conversations, or plain text)
    gen:<dataset>       generation scored by `verifier` (accuracy, exact, regex:<p>, python:module:fn)
    toolcall_demo       tool calling on held-out conversations (toolcall_eval_demo): names and arguments right?
    toolcall:<dataset>  tool calling on any conversations with tools and calls (function_call / tool_calls turns)
    safety_demo         harmful compliance and over-refusal on Gym's own demo set (30 harmful, 30 benign requests)
    advbench, harmbench, xstest   the public safety sets from the hub (walledai/...; need the network once)
    safety:<dataset>    any safety set: rows with a prompt and a label (harmful/unsafe, benign/safe); judged by
                        `safety_judge` (refusal, or a guard spec such as keywords:FILE)
    lm_eval:<a>,<b>     lm-evaluation-harness tasks, in-process on the same model
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from gym.config.coerce import split_keys
from gym.config.parser import check_keys
from gym.config.rewards import check_reward_specs
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean
from gym.core.options import check_number

BUILTIN_TASKS: dict[str, tuple[str, str]] = {
    "mc_demo": ("mc", "mc_demo"), "mmlu": ("mc", "mmlu"),
    "arithmetic": ("gen", "arithmetic_demo"), "gsm8k": ("gen", "gsm8k"),
    "toolcall_demo": ("toolcall", "toolcall_eval_demo"),
    "safety_demo": ("safety", "safety_demo"), "advbench": ("safety", "advbench"),
    "harmbench": ("safety", "harmbench"), "xstest": ("safety", "xstest"),
}
logger = logging.getLogger(__name__)

KINDS = ("mc", "ppl", "gen", "toolcall", "safety", "lm_eval")
TEMPLATES = ("auto", "chat", "plain")
ALIASES = {"task": "tasks", "eval_tasks": "tasks", "batch_size": "eval_batch_size", "o": "output",
           "reward_funcs": "verifier", "template_mode": "eval_template"}


@dataclass
class EvalTask:
    kind: str
    target: str  # a dataset for mc/ppl/gen/toolcall; comma-separated task names for lm_eval

    @property
    def name(self) -> str:
        for name, (kind, target) in BUILTIN_TASKS.items():
            if (kind, target) == (self.kind, self.target):
                return name
        return f"{self.kind}:{self.target}"


def parse_task(spec: str) -> EvalTask:
    spec = spec.strip()
    if spec in BUILTIN_TASKS:
        return EvalTask(*BUILTIN_TASKS[spec])
    kind, colon, target = spec.partition(":")
    if kind == "lm_eval":  # `lm_eval:,` named no task, and lm-eval answered that with a ValueError traceback
        target = ",".join(dict.fromkeys(name.strip() for name in target.split(",") if name.strip()))
    if colon and kind in KINDS and target.strip():
        return EvalTask(kind, target.strip())
    if colon and kind in KINDS:
        what = "lm-eval task names (lm_eval:hellaswag,arc_easy)" if kind == "lm_eval" else "a dataset name or file"
        raise ConfigError(f"Eval task {spec!r} names nothing after '{kind}:': give {what}.")
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if len(parts) > 1 and all(_parses(part) for part in parts):
        raise ConfigError(f"Eval task {spec!r} names {len(parts)} tasks in one: give each its own --task (a list in "
                          "a config: eval_tasks: [" + ", ".join(parts) + "]).")
    # `MMLU`, `Mc_Demo`: difflib compares case, so the task the user meant was not suggested
    hint = did_you_mean(spec.lower(), [*BUILTIN_TASKS, *KINDS])
    raise ConfigError(f"Unknown eval task {spec!r}.{hint} Give a built-in "
                      f"task ({', '.join(BUILTIN_TASKS)}) or kind:dataset with kind one of {', '.join(KINDS)}.")


def _parses(spec: str) -> bool:
    try:
        parse_task(spec)
    except ConfigError:
        return False
    return True


@dataclass
class EvalArguments:
    tasks: list[str] = field(default_factory=list)
    n_shot: int | None = None
    """Examples shown before each question (default: 5 for multiple choice, 0 for generation, the task's own for
    lm_eval)."""
    eval_batch_size: int = 8
    limit: int | None = None
    """Score at most this many items per task (per subject for multiple choice)."""
    output: str | None = None
    log_samples: bool = False
    seed: int = 42
    eval_template: str = "auto"
    """chat: prompts in the model's chat format; plain: plain text; auto: chat when the model has a template."""
    num_samples: int = 1
    temperature: float = 0.0
    max_new_tokens: int | None = None
    """Tokens per generated answer (default: 256 for generation and tool calls, 128 for safety tasks)."""
    verifier: list[str] = field(default_factory=lambda: ["accuracy"])
    safety_judge: str = "refusal"
    """Safety tasks: who judges that an answer to a harmful request complied: `refusal` (a string match on the
    answer's first sentences, gym.safety.refusal) or a guard spec (keywords:FILE, llama-guard:PATH, ...)."""
    cutoff_len: int = 2048
    dataset_dir: str = "data"
    delta: str | None = None
    variant: str | None = None
    lm_eval_include: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.eval_template not in TEMPLATES:
            raise ConfigError(f"eval_template must be one of {', '.join(TEMPLATES)}, got {self.eval_template!r}."
                              f"{did_you_mean(str(self.eval_template), TEMPLATES)}")
        for key in ("eval_batch_size", "num_samples", "max_new_tokens", "cutoff_len"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1, got {getattr(self, key)}.")
        # NaN passed every comparison and reached the sampler; a negative one failed only after the model loaded.
        check_number("temperature", self.temperature, 0)
        if self.n_shot is not None and self.n_shot < 0:
            raise ConfigError(f"n_shot must be 0 or more, got {self.n_shot}.")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be at least 1, got {self.limit}.")
        if self.variant is not None and (self.delta or ":" not in self.variant):
            raise ConfigError("variant: write STORE:USER (a `gym variants` store and a user in it), without delta.")
        if not isinstance(self.safety_judge, str) or not self.safety_judge.strip():
            raise ConfigError("safety_judge: give `refusal` or a guard spec (keywords:FILE, llama-guard:PATH, ...).")
        self.tasks = _unique_tasks(self.tasks)
        tasks = self.parsed_tasks()  # a bad task name fails before any model loads
        if any(t.kind == "gen" for t in tasks):
            check_reward_specs(self.verifier, None)  # a misspelt verifier, named before the model loads too
        if self.num_samples > 1 and self.temperature == 0 and any(t.kind == "gen" for t in tasks):
            raise ConfigError(f"num_samples: {self.num_samples} answers per item need sampling: set temperature > 0 "
                              "(greedy decoding gives the same answer every time).")

    def parsed_tasks(self) -> list[EvalTask]:
        return [parse_task(t) for t in self.tasks]


def _unique_tasks(specs: list[str]) -> list[str]:
    """Each task once, as first spelt (`mc_demo` and `mc:mc_demo` are one task): a repeated task was run again, at
    its full cost, and its second result replaced the first under the same name."""
    unique: dict[str, str] = {}
    for spec in specs:
        unique.setdefault(parse_task(spec).name, spec)
    if len(unique) < len(specs):
        logger.warning("Tasks named more than once run once: %s.", ", ".join(unique))
    return list(unique.values())


def check_tasks(tasks: list[str], dataset_dir: str) -> None:
    """A training config's `eval_tasks`, checked before training: a misspelt task or dataset failed only once the
    run had trained, which may be hours."""
    from gym.data.registry import get_dataset_attrs

    for task in EvalArguments(tasks=list(tasks), dataset_dir=dataset_dir).parsed_tasks():
        if task.kind != "lm_eval":
            get_dataset_attrs(task.target, dataset_dir)


def parse_eval(config: dict[str, Any]) -> tuple[EvalArguments, dict[str, Any]]:
    """(the eval keys, the rest: the model keys of `gym chat`). A training YAML's `eval_tasks` are its tasks."""
    def as_list(key: Any, value: Any) -> Any:  # one --task is a list of one
        name = str(key).replace("-", "_")
        return [value] if ALIASES.get(name, name) == "tasks" and isinstance(value, str) else value

    tasks = {k: as_list(k, v) for k, v in config.items()}
    values, rest = split_keys(tasks, EvalArguments, ALIASES)
    # a misspelt eval option (--limt) is named against the eval's own keys, before the model loads
    check_keys(rest, [f"--{name}" for name in (*EvalArguments.__dataclass_fields__, *ALIASES) if len(name) > 1])
    if "dataset_dir" in values:  # the model config's data keys read it too (a dataset's template, ...)
        rest["dataset_dir"] = values["dataset_dir"]
    return EvalArguments(**values), rest
