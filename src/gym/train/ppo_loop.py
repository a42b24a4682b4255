"""PPO's two phases for stage ppo (gym.train.methods.ppo): collect a rollout (sample, score, advantages)
and optimise on it (clipped policy and value updates). The maths is in gym.train.ppo_math."""

from __future__ import annotations

import copy
import json
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from peft.optimizers import create_loraplus_optimizer
from transformers import GenerationConfig, get_scheduler

from gym.config.args import TrainArgs
from gym.config.finetuning import ADAPTER_TYPES
from gym.config.stages.ppo import PPOOptions
from gym.models.logit_positions import last_positions
from gym.rewards.functions import RewardFunc, combined_reward, rewards_of
from gym.train import ranks
from gym.train.generation import merged_lora
from gym.train.ppo_math import (
    AdaptiveKLController,
    RunningMoments,
    completion_mask,
    compute_gae,
    masked_mean,
    policy_loss,
    value_loss,
    whiten,
)
from gym.train.workflow import Setup


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
                    logits_to_keep=last_positions(n_completion + 1, input_ids.shape[1], input_ids.device))
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
    reward_funcs: list[RewardFunc]
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

    parts: dict[str, list[torch.Tensor]] = {"logprobs": [], "ref": [], "values": [], "entropy": []}
    for part in loop.chunks(len(rows)):
        args = (input_ids[part], attention_mask[part], n_prompt, opts.temperature, loop.bf16)
        policy_logprobs, policy_values, policy_entropy = forward(loop.model, loop.value_head, *args, with_entropy=True)
        assert policy_values is not None and policy_entropy is not None  # asked for with the value head and entropy
        parts["logprobs"].append(policy_logprobs)
        parts["values"].append(policy_values)
        parts["entropy"].append(policy_entropy)
        if loop.ref_model is None:  # LoRA: the reference is the same weights without the adapter
            with loop.model.disable_adapter():
                parts["ref"].append(forward(loop.model, None, *args)[0])
        else:
            parts["ref"].append(forward(loop.ref_model, None, *args)[0])
    logprobs, ref_logprobs = torch.cat(parts["logprobs"]), torch.cat(parts["ref"])
    values, entropy = torch.cat(parts["values"]) * mask, torch.cat(parts["entropy"])

    texts = loop.tokenizer.batch_decode(completions.masked_fill(mask == 0, loop.tokenizer.pad_token_id),
                                        skip_special_tokens=True)
    raw_scores = loop.score(rows, texts).to(device)
    scores = raw_scores
    if opts.ppo_score_norm:  # the moments of every process's scores, so all normalise alike
        loop.score_moments.update(ranks.gather_across(raw_scores))
        scores = (raw_scores - loop.score_moments.mean) / loop.score_moments.std
    if opts.ppo_score_clip is not None:
        scores = scores.clamp(-opts.ppo_score_clip, opts.ppo_score_clip)

    kl = (logprobs - ref_logprobs) * mask
    rewards = -loop.kl_ctl.value * kl
    last = mask.sum(1).long() - 1  # every row has at least one token: the stop token or a sampled one
    rewards[torch.arange(len(rows), device=device), last] += scores
    total = ranks.sum_across if ranks.world_size() > 1 else None  # whiten over the global batch
    if opts.ppo_whiten_rewards:
        rewards = whiten(rewards, mask, shift_mean=False, total=total)
    advantages, returns = compute_gae(rewards, values, mask, opts.ppo_gamma, opts.ppo_lam)
    stats = {"reward": raw_scores.mean().item(), "kl": kl.sum(1).mean().item(),
             "entropy": masked_mean(entropy, mask).item(), "response_length": mask.sum(1).mean().item(),
             "tokens": float(attention_mask.sum().item())}
    return Rollout(input_ids, attention_mask, n_prompt, mask, logprobs, values, whiten(advantages, mask, total=total),
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
            assert values is not None  # forward with the value head
            mask = rollout.mask[idx]
            pg_loss, clipfrac = policy_loss(logprobs, rollout.logprobs[idx], rollout.advantages[idx], mask,
                                            opts.ppo_cliprange)
            vf_loss, vf_clipfrac = value_loss(values, rollout.values[idx], rollout.returns[idx], mask,
                                              opts.ppo_cliprange_value)
            loss = pg_loss + opts.ppo_vf_coef * vf_loss
            (loss / loop.grad_accum).backward()
            if (i + 1) % loop.grad_accum == 0 or part.stop >= n:
                ranks.average_gradients(params)  # DDP's step: every process applies the mean gradient
                torch.nn.utils.clip_grad_norm_(params, loop.max_grad_norm)
                loop.optimizer.step()
                loop.optimizer.zero_grad(set_to_none=True)
            for key, value in (("loss", loss), ("loss/policy", pg_loss), ("loss/value", vf_loss),
                               ("clipfrac", clipfrac), ("value_clipfrac", vf_clipfrac)):
                sums[key] += value.item()
            updates += 1
    loop.model.eval()
    return {key: total / updates for key, total in sums.items()}



def _disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _make_optimizer(args: TrainArgs[PPOOptions], model: Any, value_head: torch.nn.Module) -> torch.optim.Optimizer:
    training, finetuning = args.training, args.finetuning
    kwargs: dict[str, Any] = {"betas": (training.adam_beta1, training.adam_beta2), "eps": training.adam_epsilon,
                              "weight_decay": training.weight_decay}
    if finetuning.finetuning_type == "lora" and finetuning.loraplus_lr_ratio is not None:
        optimizer = create_loraplus_optimizer(model=model, optimizer_cls=torch.optim.AdamW, lr=training.learning_rate,
                                              loraplus_lr_ratio=finetuning.loraplus_lr_ratio,
                                              loraplus_lr_embedding=finetuning.loraplus_lr_embedding, **kwargs)
    else:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=training.learning_rate, **kwargs)
    optimizer.add_param_group({"params": list(value_head.parameters()), "lr": training.learning_rate})
    return optimizer


def prompt_batches(rows: list[dict[str, Any]], n: int, seed: int) -> Iterator[list[dict[str, Any]]]:
    """Endless batches of n prompts: a fresh shuffle of the dataset per epoch."""
    rng, order = random.Random(seed), list[int]()
    while True:
        while len(order) < n:
            epoch = list(range(len(rows)))
            rng.shuffle(epoch)
            order += epoch
        batch, order = order[:n], order[n:]
        yield [rows[i] for i in batch]


def build_loop(args: TrainArgs[PPOOptions], setup: Setup, device: torch.device, max_steps: int) -> PPOLoop:
    """The policy (+ value head), its reference, optimizer, scheduler and KL controller, ready to step."""
    opts, training = args.options, setup.training
    funcs, weights = rewards_of(opts)
    model = setup.model.to(device)
    _disable_dropout(model)
    ref_model = None
    if args.finetuning.finetuning_type not in ADAPTER_TYPES:  # an adapter's reference is its base, disabled
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
                              scheduler_specific_kwargs=_scheduler_kwargs(training.lr_scheduler_kwargs))
    return PPOLoop(model=model, value_head=value_head, ref_model=ref_model, tokenizer=setup.tokenizer,
                   stop_ids=setup.chat.stop_token_ids(), reward_funcs=funcs, reward_weights=weights, options=opts,
                   batch_size=training.per_device_train_batch_size, grad_accum=training.gradient_accumulation_steps,
                   bf16=bool(training.bf16), max_grad_norm=training.max_grad_norm, optimizer=optimizer,
                   scheduler=scheduler,
                   kl_ctl=AdaptiveKLController(opts.ppo_init_kl_coef, opts.ppo_target, opts.ppo_horizon))


def _scheduler_kwargs(value: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """`lr_scheduler_kwargs` as the scheduler takes it (Hugging Face also accepts it as a JSON string)."""
    if isinstance(value, str):
        return dict(json.loads(value)) if value.strip() else None
    return value or None
