"""One LoRA training step on CPU: Gym's forward against the one it replaced, alternating in one process.

The step is Gym's SFT step on the embedded SmolLM2-135M-Instruct (LoRA r=16 on every linear layer, as
examples/quickstart.yaml; under bf16 the frozen base in bf16, as `gym train` loads it): forward under autocast,
the head and the loss on the labelled positions (`supervised_lm_loss`), backward, AdamW. Three forwards:

- before: transformers' sdpa attention and `logits_to_keep=1` (the head projects each row's last position, and
  the sliced rows send it through a batched product that copies its weight once per row);
- positions: `logits_to_keep` as an empty index tensor (`gym.models.logit_positions`), transformers' sdpa;
- after: that, and short half-precision sequences attended by plain ops (`gym.models.short_attention`).

Each round times every forward on the same batch, in turn; the table gives medians over rounds of the mean step.
Lengths are full rows (no padding) at a fixed number of tokens a batch.

    python bench/train_step.py [--lengths 64,128,256,512,1024] [--batch-tokens 512] [--rounds 3] [--bf16 auto]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="64,128,256,512,1024")
    parser.add_argument("--batch-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per forward per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="auto: on where the CPU has native bf16 (Gym's rule)")
    args = parser.parse_args()

    from peft import LoraConfig, get_peft_model
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gym.core.hardware import cpu_supports_bf16
    from gym.models import short_attention
    from gym.models.loader import load_causal_lm, resolve_model_path
    from gym.train.trainer import supervised_lm_loss
    from gym.train.workflow import trainable_in_float32

    torch.set_num_threads(1)
    bf16 = cpu_supports_bf16() if args.bf16 == "auto" else args.bf16 == "on"
    from pathlib import Path

    flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    print(f"CPU flags: {' '.join(isa)}; bf16 mixed precision: {'on' if bf16 else 'off'}; one thread", flush=True)

    model = load_causal_lm(str(resolve_model_path(None)), None, dtype=torch.bfloat16 if bf16 else torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
    trainable_in_float32(model)  # as `gym train` does: float32 master weights for the adapter on a bf16 base
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def before_loss(inputs: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        hidden = model(**inputs, output_hidden_states=True, logits_to_keep=1, use_cache=False).hidden_states[-1]
        head = model.get_output_embeddings()
        hidden, targets = hidden[:, :-1].to(head.weight.dtype), labels[:, 1:]
        return F.cross_entropy(head(hidden.reshape(-1, hidden.shape[-1])).float(), targets.reshape(-1))

    def step(loss_of: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], labels: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(inputs, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    stock = sdpa_attention_forward
    forwards: dict[str, tuple[Any, Callable[..., torch.Tensor]]] = {
        "before": (stock, before_loss),
        "positions": (stock, lambda inputs, labels: supervised_lm_loss(model, inputs, labels)),
        "after": (short_attention.attention, lambda inputs, labels: supervised_lm_loss(model, inputs, labels)),
    }
    print(f"\n| tokens a row | rows | {' | '.join(forwards)} | after / before |\n|---:|---:|"
          + "---:|" * (len(forwards) + 1), flush=True)
    for length in (int(x) for x in args.lengths.split(",")):
        rows = max(1, args.batch_tokens // length)
        ids = torch.randint(0, 49152, (rows, length), generator=torch.Generator().manual_seed(length))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        seconds: dict[str, list[float]] = {name: [] for name in forwards}
        for round_ in range(args.rounds + 1):  # the first round warms every path and is not counted
            for name, (attention, loss_of) in forwards.items():
                AttentionInterface.register("sdpa", attention)
                started = time.perf_counter()
                for _ in range(args.steps):
                    step(loss_of, inputs, ids)
                if round_:
                    seconds[name].append((time.perf_counter() - started) / args.steps)
        medians = {name: statistics.median(s) for name, s in seconds.items()}
        cells = " | ".join(f"{medians[n] * 1e3:.0f} ms" for n in forwards)
        print(f"| {length} | {rows} | {cells} | {medians['after'] / medians['before']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
