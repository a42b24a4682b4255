"""BaseQuantizationArguments: load the base model quantized (QLoRA and its kin), with LLaMA-Factory's key names.

The base is quantized on load by transformers' quantizers; only adapters train on it (a quantized weight
has no gradient). Each method names the package it needs and the bit widths it takes, and every check
runs before anything loads: a config that cannot run on this machine says why, it never trains a model
that is silently not quantized.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gym.config.finetuning import ADAPTER_TYPES
from gym.core.errors import ConfigError

if TYPE_CHECKING:
    from gym.config.args import TrainArgs

# method -> (package to import, pip name, bit widths it quantizes to)
QUANTIZERS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "bnb": ("bitsandbytes", "bitsandbytes  (or pip install 'zoo-gym[qlora]')", (4, 8)),
    "torchao": ("torchao", "torchao", (4, 8)),
    "hqq": ("hqq", "hqq", (1, 2, 3, 4, 8)),
}


@dataclass
class BaseQuantizationArguments:
    """Quantize the base model on load (QLoRA: a 4-bit base, float adapters)."""

    quantization_bit: int | None = field(
        default=None,
        metadata={"help": "Load the base model quantized to this many bits (QLoRA: 4), training adapters on it. "
                  "bnb/torchao: 4 or 8; hqq: 1, 2, 3, 4 or 8. Unset: the base is not quantized."},
    )
    quantization_method: Literal["bnb", "torchao", "hqq"] = field(
        default="bnb",
        metadata={"help": "Quantizer: bnb (bitsandbytes NF4/FP4 and int8; CPU and CUDA), torchao (int8 weight-only "
                  "on CPU; int4 needs its CUDA kernels) or hqq."},
    )
    quantization_type: Literal["nf4", "fp4"] = field(
        default="nf4", metadata={"help": "bnb 4-bit data type: nf4 (NormalFloat, QLoRA's) or fp4."}
    )
    double_quantization: bool = field(
        default=True, metadata={"help": "bnb 4-bit: quantize the per-block scales too (~0.4 bit less per weight)."}
    )
    quantization_group_size: int = field(
        default=64, metadata={"help": "hqq/torchao: weights per quantization group (one scale and zero each)."}
    )

    def validate(self, args: TrainArgs[Any]) -> None:
        self._no_options_unused()
        if self.quantization_bit is None:
            return
        package, pip_name, widths = QUANTIZERS[self.quantization_method]
        if self.quantization_bit not in widths:
            raise ConfigError(f"'quantization_bit: {self.quantization_bit}' is not a width quantization_method: "
                              f"{self.quantization_method} offers; use one of {', '.join(map(str, widths))}.")
        if args.finetuning.finetuning_type not in ADAPTER_TYPES:
            raise ConfigError(f"'quantization_bit' trains adapters on a frozen quantized base; finetuning_type: "
                              f"{args.finetuning.finetuning_type} would update the quantized weights themselves. "
                              f"Use finetuning_type: lora (QLoRA), oft or boft.")
        unavailable = _unavailable_here(self.quantization_method, self.quantization_bit)
        if unavailable:
            raise ConfigError(unavailable)
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"quantization_method: {self.quantization_method} needs the {package} package, which "
                              f"is not installed: pip install {pip_name}.")
        if "," in (args.model.adapter_name_or_path or ""):
            raise ConfigError("'adapter_name_or_path' lists several adapters; on a quantized base they cannot be "
                              "merged one into another without rounding them to the base's bits. Merge them on the "
                              "unquantized model first and give one.")
        if args.model.infer_dtype in ("int8", "int4"):
            raise ConfigError(f"'infer_dtype: {args.model.infer_dtype}' quantizes for the fast engine; with "
                              "'quantization_bit' the transformers engine serves the quantized base. Set one.")


    def _no_options_unused(self) -> None:
        """A quantization option the chosen quantizer does not read (or with no quantized base at all) would be
        ignored: the base loads otherwise than the config says."""
        bnb4 = (self.quantization_bit, self.quantization_method) == (4, "bnb")
        grouped = self.quantization_bit is not None and self.quantization_method != "bnb"
        for key, default, applies, where in (
                ("quantization_type", "nf4", bnb4, "quantization_bit: 4 with quantization_method: bnb"),
                ("double_quantization", True, bnb4, "quantization_bit: 4 with quantization_method: bnb"),
                ("quantization_group_size", 64, grouped, "quantization_method: hqq or torchao")):
            if getattr(self, key) != default and not applies:
                now = ("no quantization_bit" if self.quantization_bit is None else
                       f"quantization_bit: {self.quantization_bit} with {self.quantization_method}")
                raise ConfigError(f"'{key}: {getattr(self, key)}' applies to {where}; this config has {now}. "
                                  "Remove it, or quantize the base that way.")


def _unavailable_here(method: str, bits: int) -> str | None:
    """Why the installed libraries cannot quantize this way on this machine, or None."""
    if method == "hqq":
        import transformers
        from transformers.quantizers.base import HfQuantizer
        from transformers.quantizers.quantizer_hqq import HqqHfQuantizer

        if HqqHfQuantizer.get_quantize_ops is HfQuantizer.get_quantize_ops:
            return (f"quantization_method: hqq cannot quantize on load with the installed transformers "
                    f"{transformers.__version__} (its hqq quantizer has no weight conversion yet); use "
                    f"quantization_method: bnb (4 or 8 bits) or torchao (8 bits).")
    if method == "torchao" and bits == 4 and importlib.util.find_spec("mslk") is None:
        return ("quantization_method: torchao with quantization_bit: 4 needs torchao's CUDA int4 kernels (the mslk "
                "package, CUDA GPUs only), which are not installed; use quantization_method: bnb for 4 bits, or "
                "torchao with quantization_bit: 8.")
    return None
