"""DeltaQuant: a fine-tune's delta at int8, int4, int2, ternary or binary, one precision or mixed.

Each changed projection matrix (and the embedding / LM head, with `compress_embeddings`) is quantized
by gym.delta.tensor_quant with per-tensor, per-channel or per-group scales; norms and biases stay dense.
Mixed precision comes two ways: `layer_bits` names the method per layer (a pattern of the parameter
name, e.g. {"mlp.down_proj": "int8"}); `bit_budget` (average bits per compressed weight) lets Gym
choose, by greedily giving more bits where they remove the most error per added bit (1, 2 = ternary,
4 and 8 bits). Errors are
measured on calibration data (gym.delta.sensitivity) when `calibration_samples` > 0 and
`calibration` is set, and then also choose each layer's clipping percentile; otherwise the plain
squared error is used and `clip_percentile` applies as given.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gym.core.errors import ConfigError
from gym.core.options import check_bool, check_number, check_path, check_seed, check_whole, strict_fields
from gym.delta.calibration import choose_calibration, tokenizer_for
from gym.delta.compress import CompressedDelta, dense_entry, finish
from gym.delta.distill import calibration_batches
from gym.delta.sensitivity import input_grams, weighted_error
from gym.delta.tensor_quant import BITS, Encoded, QuantMethod, dequantize, quantize
from gym.delta.weights import EMBEDDING, LINEAR, Delta, extract_deltas, parameters

CLIP_CANDIDATES = (None, 99.99, 99.9, 99.5, 99.0)
# The best method at each size: ternary beats symmetric int2 (same 2 bits, a better-placed scale).
BUDGET_LADDER = (QuantMethod.BINARY, QuantMethod.TERNARY, QuantMethod.INT4, QuantMethod.INT8)


@strict_fields
@dataclass
class DeltaQuantConfig:
    """DeltaQuant's options; the documented fields (method, per_channel, calibration_samples) first."""

    method: QuantMethod | str = QuantMethod.INT8
    """int8, int4, int2, ternary or binary: the precision of every layer layer_bits/bit_budget leave alone."""
    per_channel: bool = True
    """One scale per output channel (row); False: one per tensor. group_size overrides both."""
    calibration_samples: int = 0
    """Calibration sequences used to weigh errors (mixed precision, clipping search); 0: plain L2 error."""
    group_size: int | None = None
    """One scale per group of this many consecutive weights in a row."""
    symmetric: bool = True
    """Symmetric integer codes around 0 (int methods); False: asymmetric with a zero point."""
    clip_percentile: float | None = None
    """Clip each unit's range at this percentile of |delta| (int methods); searched on calibration data when set."""
    layer_bits: dict[str, str] | None = None
    """Explicit mixed precision: {name pattern: method}, e.g. {"*.mlp.down_proj.*": "int8"}."""
    bit_budget: float | None = None
    """Mixed precision by measured sensitivity: average bits per compressed weight (1 to 8)."""
    compress_embeddings: bool = True
    """Quantize a changed embedding / LM head per row too (else: stored dense)."""
    enable_deltasoup: bool = False
    """Mark the delta as contributable to DeltaSoup community aggregation (opt-in, recorded in the file)."""
    calibration: str | None = None
    """Calibration data: a dataset name from dataset_info.json, or a file. None: chosen when compression starts
    (the fine-tune's training data, else Gym's built-in set; gym.delta.calibration)."""
    calibration_dir: str = "data"
    seq_len: int = 128
    seed: int = 42

    def __post_init__(self) -> None:
        self.method = _method(self.method)
        if self.layer_bits is not None and not isinstance(self.layer_bits, dict):
            raise ConfigError(f"'layer_bits' maps name patterns to methods, e.g. {{\"*.mlp.down_proj.*\": \"int8\"}}; "
                              f"got {self.layer_bits!r}.")
        if self.layer_bits:
            self.layer_bits = {pattern: _method(m).value for pattern, m in self.layer_bits.items()}
        if self.layer_bits and self.bit_budget is not None:
            raise ConfigError("Give layer_bits or bit_budget, not both: one sets the precisions, the other "
                              "chooses them.")
        if self.bit_budget is not None and not (isinstance(self.bit_budget, (int, float)) and
                                                not isinstance(self.bit_budget, bool) and 1 <= self.bit_budget <= 8):
            raise ConfigError(f"bit_budget is an average number of bits per weight between 1 and 8, "
                              f"got {self.bit_budget!r}.")
        for name in ("per_channel", "symmetric", "compress_embeddings", "enable_deltasoup"):
            check_bool(name, getattr(self, name))
        check_whole("calibration_samples", self.calibration_samples, 0)
        check_whole("group_size", self.group_size, 1, optional=True)
        # what tensor_quant takes: at 50 or below the clip would cut most of the delta away
        check_number("clip_percentile", self.clip_percentile, 50, 100, low_open=True, optional=True)
        self.calibration = check_path("calibration", self.calibration, optional=True)
        self.calibration_dir = check_path("calibration_dir", self.calibration_dir)
        check_whole("seq_len", self.seq_len, 1)
        check_seed("seed", self.seed)

    def granularity(self) -> str:
        return "group" if self.group_size else "channel" if self.per_channel else "tensor"


def _method(value: QuantMethod | str | int) -> QuantMethod:
    aliases = {8: "int8", 4: "int4", 2: "int2", 1: "binary"}
    try:
        if isinstance(value, bool):  # True is 1 to Python, not a request for binary
            raise ValueError(value)
        name = aliases.get(value, value) if isinstance(value, int) else str(getattr(value, "value", value)).lower()
        return QuantMethod(name)
    except ValueError:
        raise ConfigError(f"Unknown DeltaQuant method {value!r}; choose one of "
                          f"{', '.join(m.value for m in QuantMethod)}.") from None


class DeltaQuantizer:
    """DeltaQuantizer(config).compress(base_model, finetuned_model) -> CompressedDelta."""

    def __init__(self, config: DeltaQuantConfig | None = None) -> None:
        self.config = config or DeltaQuantConfig()

    def _encode(self, delta: Delta, method: QuantMethod, gram: torch.Tensor | None) -> tuple[Encoded, float]:
        """The best-clipped encoding of `delta` at `method` and its (weighted) squared error."""
        config = self.config
        granularity = config.granularity() if delta.kind == LINEAR else "channel"
        int_method = method not in (QuantMethod.BINARY, QuantMethod.TERNARY)
        if not int_method:
            clips: tuple[float | None, ...] = (None,)
        elif config.clip_percentile is not None and gram is not None:
            clips = tuple(sorted({None, config.clip_percentile, *CLIP_CANDIDATES[1:]}, key=lambda c: c or 101))
        else:
            clips = (config.clip_percentile,)
        best: tuple[Encoded, float] | None = None
        for clip in clips:
            encoded = quantize(delta.value, method, granularity=granularity, group_size=config.group_size,
                               symmetric=config.symmetric if int_method else True, clip_percentile=clip)
            error = weighted_error(dequantize(encoded) - delta.value, gram)
            if best is None or error < best[1]:
                best = (encoded, error)
        assert best is not None  # clips is never empty
        return best

    def _methods(self, deltas: list[Delta], grams: dict[str, torch.Tensor]) -> dict[str, QuantMethod]:
        config = self.config
        if config.bit_budget is not None:
            return self._allocate(deltas, grams)
        chosen: dict[str, QuantMethod] = {}
        for delta in deltas:
            match = [m for p, m in (config.layer_bits or {}).items()
                     if fnmatch.fnmatch(delta.name, p) or p in delta.name]
            chosen[delta.name] = _method(match[-1] if match else config.method)
        return chosen

    def _allocate(self, deltas: list[Delta], grams: dict[str, torch.Tensor]) -> dict[str, QuantMethod]:
        """Greedy bit allocation: start every layer at 1 bit, then repeatedly make the move (one layer to any
        higher precision) that removes the most weighted error per added bit, while the average stays
        within budget. Moves may skip a rung: a higher one can pay where the next one does not."""
        errors = {d.name: [self._encode(d, m, grams.get(d.name))[1] for m in BUDGET_LADDER] for d in deltas}
        sizes = {d.name: d.value.numel() for d in deltas}
        level = {d.name: 0 for d in deltas}
        if self.config.bit_budget is None:
            raise ConfigError("Bit allocation needs a bit_budget.")
        budget = self.config.bit_budget * sum(sizes.values())
        used = sum(sizes[n] * BITS[BUDGET_LADDER[0]] for n in sizes)
        while True:
            best, best_gain, best_extra = None, 0.0, 0
            for name in sizes:
                for target in range(level[name] + 1, len(BUDGET_LADDER)):
                    extra = sizes[name] * (BITS[BUDGET_LADDER[target]] - BITS[BUDGET_LADDER[level[name]]])
                    gain = (errors[name][level[name]] - errors[name][target]) / extra
                    if used + extra <= budget and gain > best_gain:
                        best, best_gain, best_extra = (name, target), gain, extra
            if best is None:
                return {name: BUDGET_LADDER[i] for name, i in level.items()}
            level[best[0]] = best[1]
            used += best_extra

    @property
    def needs_tokenizer(self) -> bool:
        """Whether compress() reads calibration text, and so needs the base model's tokenizer."""
        return bool(self.config.calibration_samples)

    def compress(self, base: Any, finetuned: Any, tokenizer: Any = None, base_name: str | None = None,
                 progress: bool = True) -> CompressedDelta:
        started = time.perf_counter()
        config = self.config
        deltas = extract_deltas(base, finetuned)
        quantized = [d for d in deltas if d.kind == LINEAR or (d.kind == EMBEDDING and config.compress_embeddings)]
        grams: dict[str, torch.Tensor] = {}
        if config.calibration_samples:
            tokenizer = tokenizer_for(base, tokenizer)
            if tokenizer is None:
                raise ConfigError("Calibration needs the base model's tokenizer: pass tokenizer=, or "
                                  "calibration_samples=0.")
            dataset, dataset_dir = choose_calibration(config.calibration, config.calibration_dir, finetuned,
                                                      "DeltaQuant's error weights")
            batches = calibration_batches(tokenizer, dataset, dataset_dir, config.seq_len, 1,
                                          config.calibration_samples, config.seed)
            grams = input_grams(finetuned, batches, [d.name for d in quantized])
        methods = self._methods(quantized, grams)
        base_params, tuned_params = parameters(base), parameters(finetuned)
        entries: dict[str, Encoded | torch.Tensor] = {}
        for delta in deltas:
            if delta.name in methods:
                entries[delta.name] = self._encode(delta, methods[delta.name], grams.get(delta.name))[0]
            else:
                entries[delta.name] = dense_entry(delta, base_params[delta.name], tuned_params[delta.name])
        options = {**asdict(config), "method": _method(config.method).value}
        return finish(entries, deltas, base, options["method"] if not (config.layer_bits or config.bit_budget)
                      else "mixed", options, started, base_name, {"deltasoup": {"eligible": config.enable_deltasoup}})
