"""BitDelta (Liu et al. 2024, arXiv 2402.10193): a fine-tune as its base plus one bit per weight.

Each changed projection matrix of the transformer blocks becomes alpha * sign(delta), signs packed
eight to a byte, alpha = mean|delta| per matrix (or per group of `group_size` weights in a row) -
the alpha that minimises the L2 error for those signs. A zero delta entry gets sign +1. Scale
distillation (gym.delta.distill) then trains the alphas, with everything else frozen, to match the
fine-tune's logits on calibration text.

Where we go past the paper: the embedding / LM head, which the paper leaves uncompressed, is
compressed too when it changed (`compress_embeddings`, one alpha per row: rows are tokens, whose
deltas differ in size by orders of magnitude); norms and biases are stored dense. `safety_threshold`
keeps a matrix whose 1-bit relative error is above it at int8 instead (for a Gaussian delta the
1-bit error is sqrt(1 - 2/pi) = 0.60, so heavier-tailed deltas than that are the ones kept).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from gym.core.errors import ConfigError
from gym.core.hardware import native_bf16
from gym.core.options import (
    check_bool,
    check_number,
    check_path,
    check_seed,
    check_whole,
    strict_fields,
)
from gym.delta.calibration import choose_calibration, tokenizer_for
from gym.delta.compress import CompressedDelta, dense_entry, finish
from gym.delta.distill import DISTINCT_BATCHES, calibration_batches, distill_scales
from gym.delta.tensor_quant import Encoded, QuantMethod, quantize, relative_error
from gym.delta.weights import EMBEDDING, LINEAR, Delta, extract_deltas, parameters


@strict_fields
@dataclass
class BitDeltaConfig:
    """BitDelta's options: the documented fields first; every field is used."""

    bits: int = 1
    """Bits per weight: BitDelta is 1 (for 2, 4 or 8 bits use DeltaQuantConfig)."""
    group_size: int | None = None
    """None: one scale per matrix (the paper). N: one scale per N consecutive weights of a row."""
    safety_threshold: float | None = None
    """A matrix whose 1-bit relative error ||alpha*S - delta|| / ||delta|| exceeds this is stored as int8."""
    enable_deltasoup: bool = False
    """Mark the delta as contributable to DeltaSoup community aggregation (opt-in, recorded in the file)."""
    compress_embeddings: bool = True
    """Compress a changed embedding / LM head to 1 bit with one scale per row (else: stored dense)."""
    distill_embeddings: bool = False
    """Distil the embedding's per-row scales too. Off by default: they start at the L2 optimum, and training
    them adds the LM head's weight gradient to every step (measured: +34% time for +0.4 points of gain kept)."""
    distill_steps: int = 200
    """Scale-distillation steps (0: keep alpha = mean|delta|). Paper: 200."""
    distill_lr: float = 1e-4
    """AdamW learning rate for the scales. Paper: 1e-4."""
    distill_seq_len: int = 128
    """Calibration sequence length in tokens. Paper: 128."""
    distill_batch_size: int = 1
    """Calibration sequences per step. The paper used 4; 1 keeps 200 steps near 1.5 minutes on 2 CPU cores
    (docs/benchmarks.md measures both)."""
    calibration: str | None = None
    """Calibration data for distillation: a dataset name from dataset_info.json, or a file. None: chosen when
    compression starts (the fine-tune's training data, else Gym's built-in set; gym.delta.calibration)."""
    calibration_dir: str = "data"
    """Where dataset_info.json lives for `calibration` names."""
    seed: int = 42

    def __post_init__(self) -> None:
        if self.bits != 1:
            raise ConfigError(f"BitDelta stores 1 bit per weight (bits=1), got bits={self.bits}; for 2, 4 or 8 bits "
                              "use DeltaQuantConfig(method=QuantMethod.INT2/INT4/INT8).")
        check_whole("group_size", self.group_size, 1, optional=True)
        # a relative error: above 1 is legitimate too (it keeps only the matrices 1 bit would worsen)
        check_number("safety_threshold", self.safety_threshold, 0, low_open=True, optional=True)
        for name in ("enable_deltasoup", "compress_embeddings", "distill_embeddings"):
            check_bool(name, getattr(self, name))
        check_whole("distill_steps", self.distill_steps, 0)
        check_number("distill_lr", self.distill_lr, 0, low_open=True)
        check_whole("distill_seq_len", self.distill_seq_len, 1)
        check_whole("distill_batch_size", self.distill_batch_size, 1)
        self.calibration = check_path("calibration", self.calibration, optional=True)
        self.calibration_dir = check_path("calibration_dir", self.calibration_dir)
        check_seed("seed", self.seed)

class BitDeltaQuantizer:
    """BitDeltaQuantizer(config).compress(base_model, finetuned_model) -> CompressedDelta."""

    def __init__(self, config: BitDeltaConfig | None = None) -> None:
        self.config = config or BitDeltaConfig(distill_steps=0)

    def encode(self, delta: Delta) -> Encoded | None:
        """The 1-bit form of one delta (int8 past the safety threshold); None: not compressed (dense)."""
        config = self.config
        if delta.kind == LINEAR:
            granularity = "group" if config.group_size else "tensor"
        elif delta.kind == EMBEDDING and config.compress_embeddings:
            granularity = "channel"
        else:
            return None
        encoded = quantize(delta.value, QuantMethod.BINARY, granularity=granularity, group_size=config.group_size)
        if config.safety_threshold is not None and delta.kind == LINEAR and \
                relative_error(delta.value, encoded) > config.safety_threshold:
            encoded = quantize(delta.value, QuantMethod.INT8, granularity="channel")
        return encoded

    @property
    def needs_tokenizer(self) -> bool:
        """Whether compress() reads calibration text, and so needs the base model's tokenizer."""
        return bool(self.config.distill_steps)

    def compress(self, base: Any, finetuned: Any, tokenizer: Any = None, base_name: str | None = None,
                 progress: bool = True) -> CompressedDelta:
        started = time.perf_counter()
        config = self.config
        deltas = extract_deltas(base, finetuned)
        base_params, tuned_params = parameters(base), parameters(finetuned)
        entries: dict[str, Encoded | Any] = {}
        for delta in deltas:
            encoded = self.encode(delta)
            entries[delta.name] = encoded if encoded is not None else dense_entry(
                delta, base_params[delta.name], tuned_params[delta.name])
        extra: dict[str, Any] = {"deltasoup": {"eligible": config.enable_deltasoup}}
        if config.distill_steps:
            tokenizer = tokenizer_for(base, tokenizer)
            if tokenizer is None:
                raise ConfigError("Scale distillation needs the base model's tokenizer for its calibration data: "
                                  "pass tokenizer=, or distill_steps=0 to keep alpha = mean|delta|.")
            dataset, dataset_dir = choose_calibration(config.calibration, config.calibration_dir, finetuned,
                                                      "BitDelta's scales")
            batches = calibration_batches(tokenizer, dataset, dataset_dir, config.distill_seq_len,
                                          config.distill_batch_size, min(config.distill_steps, DISTINCT_BATCHES),
                                          config.seed)
            frozen = frozenset() if config.distill_embeddings else frozenset(
                d.name for d in deltas if d.kind == EMBEDDING)
            result = distill_scales(base, finetuned, entries, batches, config.distill_steps, config.distill_lr,
                                    bf16=native_bf16(), progress=progress, frozen=frozen)
            extra["distillation"] = asdict(result)
        return finish(entries, deltas, base, "bitdelta", asdict(config), started, base_name, extra)
