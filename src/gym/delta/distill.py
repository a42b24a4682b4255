"""BitDelta's scale distillation (Liu et al. 2024, section 3.2): with the base weights and the delta
signs frozen, train only the scales so that the compressed model's logits match the fine-tune's.

Objective: the mean squared error between the two models' logits on calibration text, AdamW on the
scales alone. The fine-tune's final hidden states are computed once per calibration batch and kept
(hidden_size values per token instead of vocab_size logits), so the fine-tuned model is run only
once per batch and its logits are re-made by its LM head at each step. The student is a copy of the
base with every fixed (non-distilled) delta already added; the distilled weights are passed in
functionally (torch.func.functional_call), which keeps tied embeddings tied.
"""

from __future__ import annotations

import copy
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call
from tqdm.auto import tqdm

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.data.loader import get_dataset
from gym.data.templates import get_chat_format
from gym.delta.compress import reconstruct
from gym.delta.tensor_quant import Encoded, QuantMethod, expand_scale, signs
from gym.models.logit_positions import no_positions

logger = logging.getLogger(__name__)

MSE_BATCHES = 4  # batches the before/after logit MSE is reported on
DISTINCT_BATCHES = 64  # calibration batches at most; steps cycle over them (the teacher runs once per batch)


@dataclass
class DistillResult:
    steps: int
    mse_before: float  # logit MSE on the calibration batches before training the scales
    mse_after: float  # of the scales kept: the trained ones, or the first ones where training made it worse
    seconds: float
    kept_initial: bool = False  # training raised the MSE (too few steps, a high lr): the closed-form scales stayed


def calibration_batches(tokenizer: Any, dataset: str, dataset_dir: str, seq_len: int, batch_size: int,
                        n_batches: int, seed: int) -> list[torch.Tensor]:
    """Token ids [batch_size, seq_len] from a Gym dataset (name or file), conversations rendered as sft does.

    Rows are concatenated and cut into seq_len pieces, as the paper's calibration text is.
    """
    chat = get_chat_format(tokenizer)
    args = DataArguments(dataset=dataset, dataset_dir=dataset_dir, cutoff_len=seq_len * 4)
    try:
        rows = get_dataset(args, chat, "supervised", seed=seed).train
    except DataError:  # plain text data has no answers to supervise
        rows = get_dataset(args, chat, "unsupervised", seed=seed).train
    stream = [t for row in rows for t in row["input_ids"]]
    pieces = len(stream) // seq_len
    if pieces < batch_size:
        raise DataError(f"Calibration data '{dataset}' has {len(stream)} tokens: too few for one batch of "
                        f"{batch_size} x {seq_len} tokens.")
    ids = torch.tensor(stream[: pieces * seq_len]).view(pieces, seq_len)
    n_batches = min(n_batches, pieces // batch_size)
    order = torch.randperm(pieces, generator=torch.Generator().manual_seed(seed))[: n_batches * batch_size]
    return list(ids[order].view(n_batches, batch_size, seq_len))


def _autocast(bf16: bool) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()


def distill_scales(base: Any, finetuned: Any, entries: dict[str, Encoded | torch.Tensor],
                   batches: list[torch.Tensor], steps: int, lr: float, bf16: bool = False,
                   progress: bool = True, frozen: frozenset[str] = frozenset()) -> DistillResult:
    """Train the scales of every binary entry not in `frozen`, in place (their float16 `scale` is replaced)."""
    started = time.perf_counter()
    binary = {n: e for n, e in entries.items()
              if isinstance(e, Encoded) and e.method == QuantMethod.BINARY and n not in frozen}
    student = copy.deepcopy(base).eval().requires_grad_(False)
    params = dict(student.named_parameters())
    with torch.no_grad():  # fixed parts of the delta (dense, int8 fallbacks) go into the student once
        for name, entry in entries.items():
            if name not in binary:
                params[name].add_(reconstruct(entry).to(params[name].dtype))
    # Under bf16 autocast every matmul reads its weight in bf16 anyway: building the weights in bf16
    # halves the memory traffic of the per-step rebuild, which is most of a step's non-matmul time.
    dtype = torch.bfloat16 if bf16 else torch.float32
    frozen_base = {n: params[n].detach().to(dtype) for n in binary}
    frozen_signs = {n: signs(e).to(dtype) for n, e in binary.items()}
    scales = {n: torch.nn.Parameter(e.tensors["scale"].float()) for n, e in binary.items()}

    def weights() -> dict[str, torch.Tensor]:
        return {n: frozen_base[n] + expand_scale(scales[n], binary[n]).to(dtype) * frozen_signs[n] for n in binary}

    head = finetuned.get_output_embeddings()
    with torch.no_grad(), _autocast(bf16):  # the teacher runs once per batch
        targets = [finetuned(input_ids=b, output_hidden_states=True, use_cache=False,
                             logits_to_keep=no_positions(b.device)).hidden_states[-1] for b in batches]

    def loss_on(i: int) -> torch.Tensor:
        with _autocast(bf16):
            logits = functional_call(student, weights(), args=(), kwargs={"input_ids": batches[i], "use_cache": False})
            teacher = head(targets[i])
        return torch.nn.functional.mse_loss(logits.logits.float(), teacher.float())

    def mean_mse() -> float:  # on a few fixed batches: a pass over all of them would cost as much as training
        shown = range(min(len(batches), MSE_BATCHES))
        with torch.no_grad():
            return sum(loss_on(i).item() for i in shown) / len(shown)

    before = mean_mse()
    optimizer = torch.optim.AdamW(list(scales.values()), lr=lr, weight_decay=0.0)
    bar = tqdm(range(steps), desc="distilling scales", disable=not progress, dynamic_ncols=True)
    for step in bar:
        loss = loss_on(step % len(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.set_postfix({"mse": f"{loss.item():.4f}"}, refresh=False)
    after = mean_mse()
    if after > before:  # distillation is meant to bring the variant closer to the fine-tune, never farther
        logger.warning("Scale distillation raised the logit MSE (%.4f -> %.4f in %d steps); the scales it started "
                       "from are kept. More calibration rows or steps, or a lower lr, may help.", before, after, steps)
        return DistillResult(steps, before, before, time.perf_counter() - started, kept_initial=True)
    for name, scale in scales.items():
        binary[name].tensors["scale"] = scale.detach().to(binary[name].tensors["scale"].dtype)
    logger.info("Scale distillation: logit MSE %.4f -> %.4f in %d steps.", before, after, steps)
    return DistillResult(steps, before, after, time.perf_counter() - started)
