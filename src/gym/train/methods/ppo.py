"""PPO (Schulman et al., 2017) for language models, as in RLHF (Ziegler et al., 2019; Ouyang et al., 2022).

stage: ppo reads prompt-only data (`data_kind="prompt"`). Each step samples completions from the policy,
scores them with reward functions and/or a reward model (`stage: rm` output), turns the score into
per-token rewards minus a KL penalty to the reference model, estimates advantages with GAE, and
takes `ppo_epochs` passes of clipped policy and value updates over the rollout. Launch:
`gym train examples/ppo_lora.yaml`.

Models: the policy is the causal LM (LoRA adapter or full/freeze weights). The value function is a
linear head on the policy's final hidden state (a shared backbone, like TRL's classic value head),
saved as `value_head.safetensors` next to the adapter. The reference is the same model with the
adapter disabled under LoRA (no second copy in memory), a frozen copy otherwise.

Where we depart from the paper / classic TRL:
- The KL penalty uses the k1 estimate (logp_policy - logp_ref per sampled token), as TRL did.
- Log-probabilities use temperature-scaled logits (like TRL) but ignore top_p truncation.
- Dropout is switched off so that the first-epoch probability ratio is exactly 1 (TRL does the same).
- The learning-rate schedule advances once per PPO step, not per optimiser step (like LLaMA-Factory).
- Under LoRA the reference is the model *without the trained adapter*: with `adapter_name_or_path`
  the earlier adapters are merged in (part of the reference), the last one is trained (not part of it).
- Checkpoints (`save_strategy: steps`, `save_steps`) hold the trainable weights, the value head, the
  optimizer, scheduler, KL controller and random states; `resume_from_checkpoint: true` continues the
  same run (gym.train.checkpoints).
- `report_to` trackers get what a Trainer's run gives them (config, each step's stats, the closing summary)
  through the same transformers callbacks (gym.train.tracking.LoopReporter).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from gym.config.args import TrainArgs
from gym.config.stages.ppo import PPOOptions
from gym.core import heap
from gym.core.kinds import DataKind
from gym.core.results import RunResult
from gym.train import ranks
from gym.train.checkpoints import load_checkpoint, save_checkpoint, save_every
from gym.train.harness import Progress, RunLog, finish_run
from gym.train.ppo_loop import build_loop, collect_rollout, optimise, prompt_batches
from gym.train.stopping import stop_on_interrupt, stopped
from gym.train.tracking import LoopReporter
from gym.train.workflow import prepare

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"


def _save_value_head(value_head: torch.nn.Linear, folder: Path) -> None:
    save_file({name: p.detach().cpu().contiguous() for name, p in value_head.state_dict().items()},
              str(folder / VALUE_HEAD_FILE), metadata={"format": "pt", "what": "gym-ppo-value-head"})


def run(args: TrainArgs[PPOOptions]) -> RunResult:
    opts = args.options
    setup = prepare(args, DataKind.PROMPT)
    training = setup.training  # the run's arguments: the config's keys with bf16, the device and the rest decided
    if setup.data.eval is not None:
        logger.warning("stage: ppo does not evaluate: val_size / eval_dataset are ignored.")

    rollout_size = training.per_device_train_batch_size * training.gradient_accumulation_steps * opts.ppo_buffer_size
    max_steps = training.max_steps if training.max_steps > 0 else max(
        1, math.ceil(training.num_train_epochs * len(setup.data.train) / rollout_size))
    gpu = torch.cuda.is_available() and not training.use_cpu
    device = torch.device("cuda", training.local_process_index) if gpu else torch.device("cpu")
    torch.manual_seed(training.seed)
    loop = build_loop(args, setup, device, max_steps)
    generator = torch.Generator().manual_seed(training.seed)
    # Several processes: the rollout is global (per_device x processes), each process generating for its own share.
    world, me, main = ranks.world_size(), ranks.rank(), ranks.is_main_process()
    prompts = (batch[me::world] for batch in prompt_batches(setup.data.train, rollout_size * world, training.seed))
    logger.info("PPO: %d steps of %d rollouts, %d epochs each.", max_steps, rollout_size * world, opts.ppo_epochs)

    modules = {"model": loop.model, "value_head": loop.value_head}
    first_step, tokens = 1, 0
    if setup.resume is not None:
        state = load_checkpoint(setup.resume, modules, loop.optimizer, loop.scheduler, generator)
        first_step, tokens = state["global_step"] + 1, state["tokens"]
        loop.kl_ctl.value = state["kl_coef"]
        loop.score_moments.mean, loop.score_moments.var, loop.score_moments.count = state["score_moments"]
        for _ in range(state["global_step"]):  # the prompts already trained on, in the same order
            next(prompts)
        logger.info("Resumed from %s at step %d.", setup.resume, first_step)
    heap.work_begins()  # as every Trainer-based run does when its loop starts (HarnessCallback)
    log = RunLog(args.output_dir)
    if main:
        log.start(first_step - 1)
    progress = Progress(max_steps, first_step - 1, desc="ppo", enabled=main and not training.disable_tqdm)
    save_steps = save_every(training.save_strategy, training.save_steps, max_steps)

    # report_to: the Trainer's tracker callbacks, driven by this loop (rank 0 logs, as under a Trainer).
    reporter = LoopReporter(args, training, loop.model, setup.tokenizer, setup.model_path, max_steps=max_steps,
                            done_steps=first_step - 1, enabled=main)

    started, entry = time.perf_counter(), {}
    with stop_on_interrupt() as stop, reporter:
        for step in range(first_step, max_steps + 1):
            learning_rate = loop.scheduler.get_last_lr()[0]
            kl_coef = loop.kl_ctl.value
            rollout = collect_rollout(loop, next(prompts), device)
            losses = ranks.mean_across(optimise(loop, rollout, generator))
            loop.scheduler.step()
            tokens += int(ranks.sum_across(torch.tensor(rollout.stats.pop("tokens"))).item())
            stats = ranks.mean_across(rollout.stats)  # the same numbers on every process, for the KL controller
            loop.kl_ctl.update(stats["kl"], rollout_size * world)
            values = {**losses, **stats, "kl_coef": kl_coef, "learning_rate": learning_rate}
            entry = log.write(step, max_steps, values) if main else values
            reporter.log(step, values)
            if main:
                progress.advance_to(step)
                progress.show(step, {k: entry[k] for k in ("reward", "kl", "loss")})
            asked_to_stop = ranks.any_across(stop.requested) and step < max_steps
            if (save_steps and step % save_steps == 0 and step < max_steps) or asked_to_stop:
                moments = loop.score_moments
                if main:  # the weights are the same on every process; the random state of sampling is not kept
                    save_checkpoint(args.output_dir, step, modules, loop.optimizer, loop.scheduler, generator,
                                    {"tokens": tokens, "kl_coef": loop.kl_ctl.value,
                                     "score_moments": [moments.mean, moments.var, moments.count]},
                                    training.save_total_limit)
                ranks.wait_for_everyone()
            if asked_to_stop:
                progress.close()
                raise stopped(args.output_dir, step, max_steps)
        reporter.end()
    progress.close()
    seconds = time.perf_counter() - started
    ranks.check_in_step([p for group in loop.optimizer.param_groups for p in group["params"]])
    return finish_run(
        loop.model, setup.tokenizer, args, model_path=setup.model_path, global_step=max_steps, seconds=seconds,
        tokens_seen=tokens, tokens_per_second=tokens / max(seconds, 1e-9), final_loss=entry.get("loss"),
        metrics={k: entry[k] for k in ("reward", "kl", "kl_coef", "entropy", "response_length") if k in entry},
        pissa_init_dir=setup.pissa_init_dir, extra=lambda folder: _save_value_head(loop.value_head, folder))
