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
  same run (gym.train.loop_checkpoint).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gym.config.parser import TrainArgs
from gym.errors import ConfigError
from gym.train.generation import merged_lora
from gym.train.loop_checkpoint import load_checkpoint, save_checkpoint, save_every
from gym.train.method import Method, RunResult
from gym.train.ppo_math import (AdaptiveKLController, RunningMoments, completion_mask, compute_gae, masked_mean,
                                policy_loss, value_loss, whiten)
from gym.train.rewards import RewardChoice, rewards_of

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
LOG_FILE = "trainer_log.jsonl"


@dataclass
class PPOOptions(RewardChoice):
    """Options of stage: ppo. Names and defaults follow LLaMA-Factory where it has them."""

    ppo_buffer_size: int = field(default=1, metadata={"help": "Batches of rollouts per optimisation phase."})
    ppo_epochs: int = field(default=4, metadata={"help": "Optimisation passes over each rollout."})
    ppo_score_norm: bool = field(default=False, metadata={"help": "Normalise scores by their running mean and std."})
    ppo_score_clip: float | None = field(default=None, metadata={"help": "Clip scores to [-x, x] (after norm)."})
    ppo_whiten_rewards: bool = field(default=False, metadata={"help": "Whiten per-token rewards (scale only)."})
    ppo_target: float | None = field(default=6.0, metadata={
        "help": "Target KL of the adaptive KL controller; null = a fixed coefficient."})
    ppo_horizon: int = field(default=10000, metadata={"help": "Horizon of the adaptive KL controller."})
    ppo_init_kl_coef: float = field(default=0.2, metadata={"help": "Initial KL penalty coefficient."})
    ppo_gamma: float = field(default=1.0, metadata={"help": "Discount factor for GAE."})
    ppo_lam: float = field(default=0.95, metadata={"help": "Lambda for GAE."})
    ppo_cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy probability ratio."})
    ppo_cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value update."})
    ppo_vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    max_completion_length: int = field(default=64, metadata={"help": "Most new tokens sampled per completion."})
    temperature: float = field(default=0.9, metadata={"help": "Sampling temperature for rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold for rollouts."})

    def __post_init__(self) -> None:
        # The parser turns ValueError into a ConfigError naming this dataclass.
        for name in ("ppo_buffer_size", "ppo_epochs", "ppo_horizon", "max_completion_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"'{name}' must be at least 1, got {getattr(self, name)}.")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError("'temperature' must be > 0 and 'top_p' in (0, 1].")
        if self.ppo_target is not None and self.ppo_target <= 0:
            raise ValueError(f"'ppo_target' must be positive (null = a fixed KL coefficient), got {self.ppo_target}.")


# --- Models: one forward pass gives log-probabilities (and values) of the completion tokens.


def forward(model: Any, value_head: torch.nn.Module | None, input_ids: torch.Tensor,
            attention_mask: torch.Tensor, n_prompt: int, temperature: float, bf16: bool,
            with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (log-probs of completion tokens, values of the states before them, per-token entropy)."""
    # Positions count real tokens only, as generate() does with left padding.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    n_completion = input_ids.shape[1] - n_prompt
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=False, output_hidden_states=value_head is not None,
                    logits_to_keep=n_completion + 1)
        values = None
        if value_head is not None:
            values = value_head(out.hidden_states[-1][:, n_prompt - 1 : -1]).squeeze(-1).float()
    log_probs = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)
    logprobs = log_probs.gather(-1, input_ids[:, n_prompt:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None
    return logprobs, values, entropy


@dataclass
class Rollout:
    """One optimisation phase's data; every tensor is [n, completion_len] unless noted."""

    input_ids: torch.Tensor  # [n, prompt_len + completion_len]: left-padded prompt, then completion
    attention_mask: torch.Tensor  # [n, prompt_len + completion_len]
    n_prompt: int
    mask: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    stats: dict[str, float]


@dataclass
class PPOLoop:
    """Everything one PPO step touches, built once by run()."""

    model: Any
    value_head: torch.nn.Linear
    ref_model: Any | None  # None under LoRA: the reference is `model` with the adapter disabled
    tokenizer: Any
    stop_ids: list[int]
    reward_funcs: list[Any]
    reward_weights: list[float]
    options: PPOOptions
    batch_size: int
    grad_accum: int
    bf16: bool
    max_grad_norm: float
    optimizer: torch.optim.Optimizer
    scheduler: Any
    kl_ctl: AdaptiveKLController
    score_moments: RunningMoments = field(default_factory=RunningMoments)

    def chunks(self, n: int) -> Iterator[slice]:
        return (slice(i, i + self.batch_size) for i in range(0, n, self.batch_size))

    def score(self, rows: list[dict[str, Any]], completions: list[str]) -> torch.Tensor:
        from gym.train.rewards import combined_reward

        # Extra dataset columns (e.g. answer) go to the reward functions by name, as TRL passes them.
        names = sorted({k for row in rows for k in row} - {"prompt", "prompt_ids"})
        columns = {k: [row.get(k) for row in rows] for k in names}
        # None (a reward that does not apply to a row) counts as 0 there.
        return torch.tensor(combined_reward(self.reward_funcs, self.reward_weights, [r["prompt"] for r in rows],
                                            completions, **columns), dtype=torch.float32)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_id] * (longest - len(s)) + list(s) for s in sequences])
    mask = torch.tensor([[0] * (longest - len(s)) + [1] * len(s) for s in sequences])
    return ids, mask


def generate(loop: PPOLoop, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """Sampled completions [n, longest completion], padded after each row's stop token."""
    from transformers import GenerationConfig

    opts, pad_id = loop.options, loop.tokenizer.pad_token_id
    # A full config, so a model's shipped generation_config (top_k, repetition penalty) cannot skew
    # the samples away from the distribution whose log-probabilities we train on.
    config = GenerationConfig(do_sample=True, temperature=opts.temperature, top_p=opts.top_p, top_k=0,
                              max_new_tokens=opts.max_completion_length, eos_token_id=loop.stop_ids,
                              pad_token_id=pad_id)
    pieces = []
    # LoRA folded into the weights while sampling: a third faster on CPU, the same distribution.
    with merged_lora(loop.model), torch.autocast(prompt_ids.device.type, dtype=torch.bfloat16, enabled=loop.bf16):
        for part in loop.chunks(prompt_ids.shape[0]):
            out = loop.model.generate(input_ids=prompt_ids[part], attention_mask=prompt_mask[part],
                                      generation_config=config)
            pieces.append(out[:, prompt_ids.shape[1] :])
    longest = max(p.shape[1] for p in pieces)
    return torch.cat([torch.nn.functional.pad(p, (0, longest - p.shape[1]), value=pad_id) for p in pieces])


@torch.no_grad()
def collect_rollout(loop: PPOLoop, rows: list[dict[str, Any]], device: torch.device) -> Rollout:
    """Sample, score, and turn scores into advantages with the parameters as they are now."""
    opts = loop.options
    loop.model.eval()
    prompt_ids, prompt_mask = (t.to(device) for t in left_pad([r["prompt_ids"] for r in rows],
                                                               loop.tokenizer.pad_token_id))
    completions = generate(loop, prompt_ids, prompt_mask)
    mask = completion_mask(completions, loop.stop_ids)
    input_ids = torch.cat([prompt_ids, completions], dim=1)
    attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)
    n_prompt = prompt_ids.shape[1]

    logprobs, ref_logprobs, values, entropy = [], [], [], []
    for part in loop.chunks(len(rows)):
        args = (input_ids[part], attention_mask[part], n_prompt, opts.temperature, loop.bf16)
        policy_logprobs, policy_values, policy_entropy = forward(loop.model, loop.value_head, *args, with_entropy=True)
        logprobs.append(policy_logprobs)
        values.append(policy_values)
        entropy.append(policy_entropy)
        if loop.ref_model is None:  # LoRA: the reference is the same weights without the adapter
            with loop.model.disable_adapter():
                ref_logprobs.append(forward(loop.model, None, *args)[0])
        else:
            ref_logprobs.append(forward(loop.ref_model, None, *args)[0])
    logprobs, ref_logprobs, values = torch.cat(logprobs), torch.cat(ref_logprobs), torch.cat(values) * mask

    texts = loop.tokenizer.batch_decode(completions.masked_fill(mask == 0, loop.tokenizer.pad_token_id),
                                        skip_special_tokens=True)
    raw_scores = loop.score(rows, texts).to(device)
    scores = raw_scores
    if opts.ppo_score_norm:
        loop.score_moments.update(raw_scores)
        scores = (raw_scores - loop.score_moments.mean) / loop.score_moments.std
    if opts.ppo_score_clip is not None:
        scores = scores.clamp(-opts.ppo_score_clip, opts.ppo_score_clip)

    kl = (logprobs - ref_logprobs) * mask
    rewards = -loop.kl_ctl.value * kl
    last = mask.sum(1).long() - 1  # every row has at least one token: the stop token or a sampled one
    rewards[torch.arange(len(rows), device=device), last] += scores
    if opts.ppo_whiten_rewards:
        rewards = whiten(rewards, mask, shift_mean=False)
    advantages, returns = compute_gae(rewards, values, mask, opts.ppo_gamma, opts.ppo_lam)
    stats = {"reward": raw_scores.mean().item(), "kl": kl.sum(1).mean().item(),
             "entropy": masked_mean(torch.cat(entropy), mask).item(), "response_length": mask.sum(1).mean().item(),
             "tokens": float(attention_mask.sum().item())}
    return Rollout(input_ids, attention_mask, n_prompt, mask, logprobs, values, whiten(advantages, mask),
                   returns, stats)


def optimise(loop: PPOLoop, rollout: Rollout, generator: torch.Generator) -> dict[str, float]:
    """`ppo_epochs` shuffled passes over the rollout in minibatches; returns mean losses and clip fractions."""
    opts, n = loop.options, rollout.input_ids.shape[0]
    params = [p for group in loop.optimizer.param_groups for p in group["params"]]
    sums: dict[str, float] = defaultdict(float)
    updates = 0
    loop.model.train()  # dropout is off; train mode only lets gradient checkpointing act
    for _ in range(opts.ppo_epochs):
        order = torch.randperm(n, generator=generator).to(rollout.input_ids.device)
        for i, part in enumerate(loop.chunks(n)):
            idx = order[part]
            logprobs, values, _ = forward(loop.model, loop.value_head, rollout.input_ids[idx],
                                          rollout.attention_mask[idx], rollout.n_prompt, opts.temperature, loop.bf16)
            mask = rollout.mask[idx]
            pg_loss, clipfrac = policy_loss(logprobs, rollout.logprobs[idx], rollout.advantages[idx], mask,
                                            opts.ppo_cliprange)
            vf_loss, vf_clipfrac = value_loss(values, rollout.values[idx], rollout.returns[idx], mask,
                                              opts.ppo_cliprange_value)
            loss = pg_loss + opts.ppo_vf_coef * vf_loss
            (loss / loop.grad_accum).backward()
            if (i + 1) % loop.grad_accum == 0 or part.stop >= n:
                torch.nn.utils.clip_grad_norm_(params, loop.max_grad_norm)
                loop.optimizer.step()
                loop.optimizer.zero_grad(set_to_none=True)
            for key, value in (("loss", loss), ("loss/policy", pg_loss), ("loss/value", vf_loss),
                               ("clipfrac", clipfrac), ("value_clipfrac", vf_clipfrac)):
                sums[key] += value.item()
            updates += 1
    loop.model.eval()
    return {key: total / updates for key, total in sums.items()}


# --- The run: setup -> (rollout -> optimise -> log) x max_steps -> save.


def _check_unsupported(args: TrainArgs) -> None:
    if args.finetuning.finetuning_type == "lora" and args.finetuning.pissa_init:
        # PiSSA moves the principal components out of the base weights, so the model with its adapter
        # disabled is not the starting model and cannot serve as the KL reference.
        raise ConfigError("stage: ppo does not support `pissa_init`: the KL reference is the model with the "
                          "adapter disabled, which under PiSSA is not the starting model. Use plain LoRA.")


def _disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _make_optimizer(args: TrainArgs, model: Any, value_head: torch.nn.Module) -> torch.optim.Optimizer:
    training, finetuning = args.training, args.finetuning
    kwargs = {"betas": (training.adam_beta1, training.adam_beta2), "eps": training.adam_epsilon,
              "weight_decay": training.weight_decay}
    if finetuning.finetuning_type == "lora" and finetuning.loraplus_lr_ratio is not None:
        from peft.optimizers import create_loraplus_optimizer

        optimizer = create_loraplus_optimizer(model=model, optimizer_cls=torch.optim.AdamW, lr=training.learning_rate,
                                              loraplus_lr_ratio=finetuning.loraplus_lr_ratio,
                                              loraplus_lr_embedding=finetuning.loraplus_lr_embedding, **kwargs)
    else:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=training.learning_rate, **kwargs)
    optimizer.add_param_group({"params": list(value_head.parameters()), "lr": training.learning_rate})
    return optimizer


def _prompt_batches(rows: list[dict[str, Any]], n: int, seed: int) -> Iterator[list[dict[str, Any]]]:
    """Endless batches of n prompts: a fresh shuffle of the dataset per epoch."""
    rng, order = random.Random(seed), []
    while True:
        while len(order) < n:
            epoch = list(range(len(rows)))
            rng.shuffle(epoch)
            order += epoch
        batch, order = order[:n], order[n:]
        yield [rows[i] for i in batch]


def _build_loop(args: TrainArgs, setup: Any, device: torch.device, max_steps: int) -> PPOLoop:
    from transformers import get_scheduler

    opts, training = args.finetuning.method_options, args.training
    funcs, weights = rewards_of(opts)
    model = setup.model.to(device)
    _disable_dropout(model)
    ref_model = None
    if args.finetuning.finetuning_type != "lora":
        ref_model = copy.deepcopy(model).requires_grad_(False).eval()
    if training.gradient_checkpointing:  # None (auto) means off for ppo: rollouts are short
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if args.finetuning.finetuning_type != "full":
            model.enable_input_require_grads()
    # Zero init: the first values are 0 everywhere and the value loss sends no gradient into the
    # shared backbone until the head has learned something.
    value_head = torch.nn.Linear(model.config.get_text_config().hidden_size, 1).to(device)
    torch.nn.init.zeros_(value_head.weight)
    torch.nn.init.zeros_(value_head.bias)
    optimizer = _make_optimizer(args, model, value_head)
    scheduler = get_scheduler(training.lr_scheduler_type, optimizer,
                              num_warmup_steps=training.get_warmup_steps(max_steps), num_training_steps=max_steps,
                              scheduler_specific_kwargs=training.lr_scheduler_kwargs or None)
    return PPOLoop(model=model, value_head=value_head, ref_model=ref_model, tokenizer=setup.tokenizer,
                   stop_ids=setup.chat.stop_token_ids(), reward_funcs=funcs, reward_weights=weights, options=opts,
                   batch_size=training.per_device_train_batch_size, grad_accum=training.gradient_accumulation_steps,
                   bf16=bool(training.bf16), max_grad_norm=training.max_grad_norm, optimizer=optimizer,
                   scheduler=scheduler,
                   kl_ctl=AdaptiveKLController(opts.ppo_init_kl_coef, opts.ppo_target, opts.ppo_horizon))


def _read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.is_file() else []


def _save_value_head(value_head: torch.nn.Linear, folder: Path) -> None:
    from safetensors.torch import save_file

    save_file({name: p.detach().cpu().contiguous() for name, p in value_head.state_dict().items()},
              str(folder / VALUE_HEAD_FILE), metadata={"format": "pt", "what": "gym-ppo-value-head"})


def run(args: TrainArgs) -> RunResult:
    from tqdm.auto import tqdm

    from gym.train import outputs, resources
    from gym.train.workflow import prepare

    opts: PPOOptions = args.finetuning.method_options
    training = args.training
    _check_unsupported(args)
    setup = prepare(args, "prompt")
    if setup.data.eval is not None:
        logger.warning("stage: ppo does not evaluate: val_size / eval_dataset are ignored.")

    rollout_size = training.per_device_train_batch_size * training.gradient_accumulation_steps * opts.ppo_buffer_size
    max_steps = training.max_steps if training.max_steps > 0 else max(
        1, math.ceil(training.num_train_epochs * len(setup.data.train) / rollout_size))
    device = torch.device("cuda" if torch.cuda.is_available() and not training.use_cpu else "cpu")
    torch.manual_seed(training.seed)
    loop = _build_loop(args, setup, device, max_steps)
    generator = torch.Generator().manual_seed(training.seed)
    prompts = _prompt_batches(setup.data.train, rollout_size, training.seed)
    logger.info("PPO: %d steps of %d rollouts, %d epochs each.", max_steps, rollout_size, opts.ppo_epochs)

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
    log_path = Path(training.output_dir) / LOG_FILE
    log_path.parent.mkdir(parents=True, exist_ok=True)
    kept = [line for line in _read_lines(log_path) if json.loads(line)["step"] < first_step]
    log_path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    save_steps = save_every(training.save_strategy, training.save_steps, max_steps)

    bar = tqdm(total=max_steps, initial=first_step - 1, desc="ppo", dynamic_ncols=True, disable=training.disable_tqdm)
    started, entry = time.perf_counter(), {}
    for step in range(first_step, max_steps + 1):
        learning_rate = loop.scheduler.get_last_lr()[0]
        kl_coef = loop.kl_ctl.value
        rollout = collect_rollout(loop, next(prompts), device)
        losses = optimise(loop, rollout, generator)
        loop.scheduler.step()
        loop.kl_ctl.update(rollout.stats["kl"], rollout_size)
        tokens += int(rollout.stats.pop("tokens"))
        entry = {"step": step, "max_steps": max_steps, **losses, **rollout.stats, "kl_coef": kl_coef,
                 "learning_rate": learning_rate, "elapsed_s": round(time.perf_counter() - started, 2)}
        with log_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")
        bar.update(1)
        bar.set_postfix({"reward": f"{entry['reward']:.3f}", "kl": f"{entry['kl']:.3f}"}, refresh=False)
        if training.disable_tqdm:  # no bar: one line per step instead, like the other stages
            logger.info("step %d/%d: reward %.4f, kl %.4f, loss %.4f", step, max_steps, entry["reward"],
                        entry["kl"], entry["loss"])
        if save_steps and step % save_steps == 0 and step < max_steps:
            moments = loop.score_moments
            save_checkpoint(training.output_dir, step, modules, loop.optimizer, loop.scheduler, generator,
                            {"tokens": tokens, "kl_coef": loop.kl_ctl.value,
                             "score_moments": [moments.mean, moments.var, moments.count]},
                            training.save_total_limit)
    bar.close()
    seconds = time.perf_counter() - started

    out = outputs.save_final(loop.model, setup.tokenizer, args, setup.model_path, max_steps,
                             setup.pissa_init_dir, extra=lambda folder: _save_value_head(loop.value_head, folder))
    if args.finetuning.plot_loss:
        outputs.plot_loss(out)
    return RunResult(
        output_dir=str(out), global_step=max_steps, final_loss=entry.get("loss"),
        tokens_per_second=tokens / max(seconds, 1e-9), peak_memory_bytes=resources.peak_memory_bytes(),
        train_seconds=seconds, tokens_seen=tokens,
        metrics={k: entry[k] for k in ("reward", "kl", "kl_coef", "entropy", "response_length") if k in entry},
    )


METHOD = Method(name="ppo", data_kind="prompt", run=run, options=PPOOptions)
