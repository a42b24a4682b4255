"""Training-Free GRPO (Cai et al., 2025, arXiv 2510.08191): learn a library of lessons in context, no weights change.

For each epoch (queries shuffled with the seed), for each batch of queries:
1. G rollouts per query, with the current library in the system prompt, at `temperature_train`;
2. the verifier scores each rollout in [0, 1]; a group whose scores are all equal has no advantage and
   is skipped (no LLM calls);
3. for each remaining group: one summary per rollout (G calls), one call that extracts the group's
   semantic advantage (at most K lessons), one call that turns those lessons into operations on the
   library (ADD/UPDATE/DELETE/NONE);
4. one batch-level call merges every group's operations; gym.tfgrpo.library applies them under fixed rules.
So a step with p groups of mixed scores makes p·(G+2)+1 update calls besides its rollouts (none when p = 0,
or when no group proposes a change). The library, the position in the data and the history are saved after
every batch (temp + rename), and every answer is recorded (gym.tfgrpo.llm.CallCache): a killed run resumes
at the batch it was in and ends with the library an uninterrupted run would have.

Where we depart from the authors' code (youtu-agent: `training_free_GRPO` branch and utu/practice/ on main):
- the library goes in the system prompt, in training as in serving (`gym api --experiences`); they append
  it to the user's problem while practising and move it to the agent's instructions when exporting;
- operations are applied by code under stated conflict rules (DELETE beats UPDATE, duplicate ADDs merge,
  each lesson cut to `max_words`) rather than left to the batch LLM alone; a DELETE needs no content
  (theirs drops a DELETE without text);
- ids are plain numbers `[i]` (theirs `[G3]`), renumbered after every step, as theirs are;
- the last, smaller batch of an epoch is used (theirs is dropped);
- a malformed answer is asked again with the parse error, then skipped with a logged reason;
- all calls are recorded, so resuming mid-batch replays instead of sampling anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gym.core.errors import ConfigError, DataError, OutputError
from gym.core.files import temp_path
from gym.tfgrpo import prompts
from gym.tfgrpo.config import GRPOConfig
from gym.tfgrpo.library import ExperienceLibrary, Operation, with_experiences
from gym.tfgrpo.llm import LLM, CachedLLM, CallCache, Completion, LocalLLM, OpenAIEndpoint, Usage
from gym.tfgrpo.tasks import RewardSource, Scorer, Task, build_scorer, tasks_from

logger = logging.getLogger(__name__)

T = TypeVar("T")
STATE_FILE, LIBRARY_FILE, CALLS_FILE = "tfgrpo_state.json", "experiences.json", "calls.jsonl"


@dataclass
class StepReport:
    step: int
    epoch: int
    batch: int
    queries: int
    partial_groups: int
    update_calls: int
    mean_reward: float
    operations: dict[str, int]
    size: int


@dataclass
class EvalResult:
    """Mean@k: the mean score over queries and their k samples; Pass@k: the share of queries with a sample scoring 1."""

    k: int
    mean_at_k: float
    pass_at_k: float
    scores: list[list[float]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"k": self.k, "mean_at_k": self.mean_at_k, "pass_at_k": self.pass_at_k, "queries": len(self.scores)}


def _seed(*parts: object) -> int:
    """A sampling seed for one call, fixed by where it is in the run (so resuming or batching cannot change it)."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest(), "big") >> 1


def resolve_model(model: Any, config: GRPOConfig, local: dict[str, Any] | None = None,
                  endpoint: tuple[str | None, str | None] | None = None) -> LLM:
    """A model as given: an LLM object as is, a ChatModel on its engine, a name on the endpoint `base_url`, else
    a Gym model loaded on the local engine (None: the embedded default)."""
    base_url, api_key = endpoint if endpoint is not None else (config.base_url, config.api_key)
    if isinstance(model, LLM):
        return model
    if type(model).__name__ == "ChatModel":
        return LocalLLM(model)
    if base_url:
        if not model:
            raise ConfigError("With base_url, name the endpoint's model: `model: <name>` (e.g. gpt-4o-mini).")
        return OpenAIEndpoint(base_url, str(model), api_key, timeout=config.timeout, max_retries=config.max_retries,
                              retry_delay=config.retry_delay)
    keys = dict(local or {})
    if model:
        keys["model_name_or_path"] = str(model)
    return LocalLLM.load(keys, max_batch_size=config.max_concurrency)


class TrainingFreeGRPO:
    """`TrainingFreeGRPO(model, GRPOConfig(...)).train(dataset, reward_fn)` -> the experience library.

    `model`: a Gym model name or folder (local engine), a model name on `config.base_url`, a ChatModel, or any
    object with `complete(messages, temperature=, max_tokens=, seed=)`. `updater`: the model for summaries,
    advantages and updates (default: `config.updater_model`, else the same model)."""

    def __init__(self, model: Any = None, config: GRPOConfig | None = None, *, updater: Any = None,
                 local: dict[str, Any] | None = None) -> None:
        self.config = config or GRPOConfig()
        self.model = resolve_model(model, self.config, local)
        if updater is None and (self.config.updater_model or self.config.updater_base_url):
            endpoint = (self.config.updater_base_url or self.config.base_url,
                        self.config.updater_api_key or self.config.api_key)
            updater = resolve_model(self.config.updater_model or model, self.config, local, endpoint)
        self.updater = self.model if updater is None else resolve_model(updater, self.config, local)
        self.library = ExperienceLibrary()
        self.usage = Usage()
        self.history: list[StepReport] = []
        self._rollout_llm: LLM = self.model
        self._update_llm: LLM = self.updater

    # ------------------------------------------------------------ calls

    def _map(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
        """fn over items, up to max_concurrency at once; results in the items' order."""
        if len(items) <= 1:
            return [fn(item) for item in items]
        pool = ThreadPoolExecutor(min(self.config.max_concurrency, len(items)))
        try:
            results = list(pool.map(fn, items))
        except BaseException:
            # After a failure (an endpoint that stopped answering) the error is shown now: the calls still queued
            # are dropped, and those in flight are not waited for (close() abandons them), rather than each
            # waiting out its own timeout and retries first.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results

    def _ask(self, role: str, llm: LLM, messages: list[dict[str, str]], temperature: float, max_tokens: int,
             seed: int | None = None) -> Completion:
        answer = llm.complete(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.usage.add(role, answer)
        return answer

    def _ask_parsed(self, role: str, messages: list[dict[str, str]], parse: Callable[[str], T]) -> T | None:
        """An update call whose answer must parse; asked again with the error, then skipped (None), logged."""
        conversation = list(messages)
        for _ in range(self.config.max_parse_retries + 1):
            answer = self._ask(role, self._update_llm, conversation, self.config.temperature_update,
                               self.config.update_max_tokens)
            try:
                return parse(answer.text)
            except ValueError as exc:
                error = str(exc)
                conversation = [*conversation, {"role": "assistant", "content": answer.text},
                                prompts.correction(error)]
        logger.warning("Skipped the %s answer after %d tries: %s (last answer: %r)", role,
                       self.config.max_parse_retries + 1, error, answer.text[:200])
        return None

    def judge(self, task: Task, attempt: str) -> float:
        """The `judge` reward: the updater grades `attempt` against the reference (0 when it cannot be read)."""
        score = self._ask_parsed("judge", prompts.judge_messages(task.text, attempt, task.answer), prompts.parse_score)
        return 0.0 if score is None else score

    def rollout_messages(self, task: Task, library: ExperienceLibrary | None) -> list[dict[str, str]]:
        """The rollout prompt; with an empty library it is exactly the query (and its system prompt, if any)."""
        system = with_experiences(self.config.system_prompt or task.system, library)
        return ([{"role": "system", "content": system}] if system else []) + task.messages

    # ------------------------------------------------------------ one step

    def step(self, tasks: list[Task], library: ExperienceLibrary, scorer: Scorer, seed: int = 0,
             where: tuple[int, int] = (0, 0)) -> ExperienceLibrary:
        """One batch: rollouts, scores, and the library they lead to."""
        cfg = self.config
        calls_before = self.usage.calls() - self.usage.calls("rollout")
        jobs = [(t, g) for t in range(len(tasks)) for g in range(cfg.group_size)]
        answers = self._map(lambda job: self._ask(
            "rollout", self._rollout_llm, self.rollout_messages(tasks[job[0]], library), cfg.temperature_train,
            cfg.max_tokens, seed=_seed(seed, job[0], job[1])).text, jobs)
        scores = scorer([tasks[t] for t, _ in jobs], answers)
        groups = [(tasks[t], answers[t * cfg.group_size:(t + 1) * cfg.group_size],
                   scores[t * cfg.group_size:(t + 1) * cfg.group_size]) for t in range(len(tasks))]
        partial = [g for g in groups if max(g[2]) - min(g[2]) > 1e-9]
        proposals = self._propose(partial, library)
        operations: list[Operation] = []
        if proposals:
            merged = self._ask_parsed("batch_update",
                                      prompts.batch_update_messages(library, proposals, cfg.max_words),
                                      prompts.parse_operations)
            operations = merged or []
        new = library.apply(operations, cfg.max_words)
        counts = {op: sum(o.op == op for o in operations) for op in ("ADD", "UPDATE", "DELETE", "NONE")}
        report = StepReport(new.step, where[0], where[1], len(tasks), len(partial),
                            self.usage.calls() - self.usage.calls("rollout") - calls_before,
                            sum(scores) / len(scores), counts, len(new))
        self.history.append(report)
        logger.info("step %d (epoch %d, batch %d): reward %.3f, %d/%d groups with an advantage, %d update calls, "
                    "library %d -> %d", report.step, where[0] + 1, where[1] + 1, report.mean_reward, len(partial),
                    len(tasks), report.update_calls, len(library), len(new))
        return new

    def _propose(self, groups: list[tuple[Task, list[str], list[float]]],
                 library: ExperienceLibrary) -> list[Operation]:
        """Summaries, then each group's lessons, then each group's operations (stage by stage, all groups at once)."""
        cfg = self.config
        if not groups:
            return []
        flat = [(task, answer, reward) for task, answers, rewards in groups for answer, reward in zip(answers, rewards)]
        summaries = self._map(lambda item: self._ask(
            "summary", self._update_llm, prompts.summary_messages(item[0].text, item[1], item[2], item[0].answer,
                                                                  library),
            cfg.temperature_update, cfg.update_max_tokens).text, flat)
        per_group = [summaries[i * cfg.group_size:(i + 1) * cfg.group_size] for i in range(len(groups))]
        lessons = self._map(lambda i: self._ask_parsed(
            "advantage", prompts.advantage_messages(groups[i][0].text, per_group[i], groups[i][2], groups[i][0].answer,
                                                    library, cfg.max_lessons, cfg.max_words),
            lambda text: prompts.parse_lessons(text, cfg.max_lessons)), list(range(len(groups))))
        with_lessons = [found for found in lessons if found]
        operations = self._map(lambda found: self._ask_parsed(
            "group_update", prompts.group_update_messages(library, found, cfg.max_words), prompts.parse_operations),
            with_lessons)
        return [op for ops in operations if ops for op in ops if op.op != "NONE"]

    # ------------------------------------------------------------ training

    def train(self, dataset: Any, reward_fn: RewardSource = None, *, reward_weights: Sequence[float] | None = None,
              output_dir: str | os.PathLike[str] | None = None, dataset_dir: str = "data",
              overwrite: bool = False) -> ExperienceLibrary:
        """Learn the library over `max_epochs` epochs; with `output_dir`, saved after every batch and resumable."""
        cfg = self.config
        tasks = tasks_from(dataset, dataset_dir)
        scorer = build_scorer(reward_fn, reward_weights, judge=self.judge)
        run = _RunFolder(Path(output_dir), cfg, _digest(tasks), overwrite) if output_dir is not None else None
        if run is not None and cfg.cache_calls:
            cache = CallCache(run.root / CALLS_FILE)
            self._rollout_llm, self._update_llm = CachedLLM(self.model, cache), CachedLLM(self.updater, cache)
        library, position = (run.resume() if run else (ExperienceLibrary(), (0, 0)))
        started = time.perf_counter()
        try:
            for epoch in range(position[0], cfg.max_epochs):
                order = list(range(len(tasks)))
                if cfg.shuffle:
                    random.Random(_seed(cfg.seed, "epoch", epoch)).shuffle(order)
                batches = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
                first = position[1] if epoch == position[0] else 0
                for b in range(first, len(batches)):
                    batch = [tasks[i] for i in batches[b]]
                    library = self.step(batch, library, scorer, seed=_seed(cfg.seed, epoch, *batches[b]),
                                        where=(epoch, b))
                    self.library = library
                    if run is not None:
                        run.save(library, (epoch, b + 1) if b + 1 < len(batches) else (epoch + 1, 0), self.history[-1])
        finally:
            self.usage.seconds += time.perf_counter() - started
            self._rollout_llm, self._update_llm = self.model, self.updater
        self.library = library
        return library

    # ------------------------------------------------------------ using the library

    def infer(self, query: str | list[dict[str, str]] | Task, experiences: ExperienceLibrary | None = None,
              *, temperature: float | None = None, max_tokens: int | None = None, seed: int | None = None) -> str:
        """The model's answer to `query` with the library (`experiences`, else the one trained last) in its prompt."""
        if isinstance(query, Task):
            task = query
        elif isinstance(query, str):
            task = Task([{"role": "user", "content": query}])
        else:
            task = Task(list(query))
        library = self.library if experiences is None else experiences
        temperature = self.config.temperature_eval if temperature is None else temperature
        return self._ask("infer", self.model, self.rollout_messages(task, library), temperature,
                         max_tokens or self.config.max_tokens, seed=seed).text

    def evaluate(self, dataset: Any, experiences: ExperienceLibrary | None = None, reward_fn: RewardSource = None,
                 *, reward_weights: Sequence[float] | None = None, k: int | None = None,
                 dataset_dir: str = "data") -> EvalResult:
        """Mean@k and Pass@k of the model with `experiences` (an empty library: the baseline) on `dataset`."""
        cfg = self.config
        k = k or cfg.eval_samples
        tasks = tasks_from(dataset, dataset_dir)
        scorer = build_scorer(reward_fn, reward_weights, judge=self.judge)
        library = experiences if experiences is not None else ExperienceLibrary()
        jobs = [(t, s) for t in range(len(tasks)) for s in range(k)]
        started = time.perf_counter()
        answers = self._map(lambda job: self._ask(
            "eval", self.model, self.rollout_messages(tasks[job[0]], library), cfg.temperature_eval, cfg.max_tokens,
            seed=_seed(cfg.seed, "eval", *job)).text, jobs)
        self.usage.seconds += time.perf_counter() - started
        scores = scorer([tasks[t] for t, _ in jobs], answers)
        per_task = [scores[t * k:(t + 1) * k] for t in range(len(tasks))]
        return EvalResult(k, sum(scores) / len(scores), sum(max(s) >= 1.0 - 1e-9 for s in per_task) / len(tasks),
                          per_task)

    def close(self) -> None:
        for llm in {id(self.model): self.model, id(self.updater): self.updater}.values():
            close = getattr(llm, "close", None)
            if callable(close):
                close()


def _digest(tasks: list[Task]) -> str:
    """Which queries a run learns from (a resumed run must see the same ones, in the same order)."""
    blob = json.dumps([[t.messages, t.answer, t.system] for t in tasks], ensure_ascii=False, sort_keys=True)
    return f"{len(tasks)}:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


class _RunFolder:
    """output_dir of a run: the state (library, next batch, history) after every batch, and each step's library."""

    def __init__(self, root: Path, config: GRPOConfig, queries: str, overwrite: bool) -> None:
        self.root, self.config, self.queries = root, config, queries
        self.state_path = root / STATE_FILE
        if overwrite and root.is_dir():
            for name in (STATE_FILE, LIBRARY_FILE, CALLS_FILE):
                (root / name).unlink(missing_ok=True)
            shutil.rmtree(root / "steps", ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        self.history: list[dict[str, Any]] = []

    def resume(self) -> tuple[ExperienceLibrary, tuple[int, int]]:
        if not self.state_path.is_file():
            return ExperienceLibrary(), (0, 0)
        state = self._read_state()
        if state["config"] != self.config.fingerprint() or state.get("queries") != self.queries:
            raise OutputError(f"{self.root} holds a TF-GRPO run with other settings or data; resume it with the "
                              "same config, or set overwrite_output_dir: true to start again.")
        self.history = list(state.get("history", []))
        epoch, batch = state["next"]
        try:
            library = ExperienceLibrary.from_json(state["library"], str(self.state_path))
        except DataError as exc:
            raise OutputError(f"{exc} {self._start_again}") from None
        if epoch < self.config.max_epochs:
            logger.info("Resuming %s at epoch %d, batch %d (library of %d, step %d).", self.root, epoch + 1,
                        batch + 1, len(library), library.step)
        return library, (epoch, batch)

    @property
    def _start_again(self) -> str:
        return ("Set overwrite_output_dir: true to start the run again (the file is left as it is), or put back "
                "the file the run wrote.")

    def _read_state(self) -> dict[str, Any]:
        """The state file as this module writes it, or an OutputError naming it (it is never changed here: it is
        written whole under a temporary name, so a broken one was edited or damaged, and the user decides)."""
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
        except ValueError as exc:  # not JSON, not UTF-8, or a number of more digits than Python reads
            raise OutputError(f"{self.state_path} is not valid JSON ({exc}). {self._start_again}") from None
        next_ = state.get("next") if isinstance(state, dict) else None
        if not (isinstance(state, dict) and isinstance(state.get("config"), dict)
                and isinstance(state.get("history", []), list) and isinstance(state.get("library"), dict)
                and isinstance(next_, list) and len(next_) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in next_)):
            raise OutputError(f"{self.state_path} is not a TF-GRPO state this version wrote (config, next: "
                              f"[epoch, batch], library, history). {self._start_again}")
        return state

    def save(self, library: ExperienceLibrary, next_position: tuple[int, int], report: StepReport) -> None:
        self.history.append(vars(report).copy())
        library.save(self.root / "steps" / f"step_{library.step:04d}.json")
        state = {"config": self.config.fingerprint(), "queries": self.queries, "next": list(next_position),
                 "library": library.to_json(), "history": self.history}
        tmp = temp_path(self.state_path)
        tmp.write_text(json.dumps(state, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.state_path)  # the commit point: the batch is done
        library.save(self.root / LIBRARY_FILE)
