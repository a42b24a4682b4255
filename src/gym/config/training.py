"""TrainingArguments: Hugging Face's, with the defaults Gym changes and Gym's own checks."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from transformers import TrainingArguments as HFTrainingArguments

from gym.config.tracking import check_report_to, split_report_to
from gym.core.errors import ConfigError

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class TrainingArguments(HFTrainingArguments):
    """Every Hugging Face `TrainingArguments` field, with the defaults Gym changes:

    - `output_dir`: unset means `saves/<model>/<finetuning_type>/<stage>`.
    - `logging_steps`: 1, so `trainer_log.jsonl` and the loss plot see every step (logging is cheap;
      Gym's progress bar does not print a line per log).
    - `gradient_checkpointing`: unset means "auto": on only when the estimated activations would not
      fit in free memory, because recomputing them costs about a third more compute.
    """

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where checkpoints and the final model go (default: saves/<model>/<type>/<stage>)."},
    )
    logging_steps: float = field(default=1, metadata={"help": "Log (loss, lr, tokens/s) every n steps."})
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory: true, false, or auto (the "
                  "default): on only when the estimated activations would take over half the free memory."},
    )
    # Wider than Hugging Face's `str | None` on purpose: `true` means "the last complete checkpoint".
    resume_from_checkpoint: bool | str | None = field(  # type: ignore[assignment]
        default=None,
        metadata={"help": "true = resume from the last complete checkpoint in output_dir; or a checkpoint path."},
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept off: Gym's collator already builds only what the model takes."}
    )
    disable_tqdm: bool = field(
        default=False, metadata={"help": "Turn off the progress bar (then each log is printed as a line)."}
    )
    bf16: bool | None = field(  # type: ignore[assignment]  # None = auto, resolved by the parser
        default=None,
        metadata={"help": "bf16 mixed precision. Unset = auto: on where the hardware has native bf16 "
                  "(recent GPUs, CPUs with AVX512-BF16/AMX), off elsewhere."},
    )

    # Wider than Hugging Face's `str | None`: transformers itself now documents `fsdp: true` (FSDP2, tuned through
    # fsdp_config), while LLaMA-Factory configs carry the older strings.
    fsdp: bool | str | None = field(  # type: ignore[assignment]
        default=None,
        metadata={"help": "Shard parameters, gradients and optimizer state across processes (FSDP2): true, or "
                  "'full_shard' / 'shard_grad_op' (+ ' offload'); tune with fsdp_config. Needs several processes "
                  "(NPROC_PER_NODE); runs on GPUs and on CPU processes (gloo)."},
    )

    pure_bf16: bool = field(
        default=False,
        metadata={"help": "Train with the weights themselves in bf16 (no float32 master copy, no autocast): half "
                  "the weight and optimizer memory, at bf16's rounding on every update."},
    )
    use_reentrant_gc: bool | None = field(
        default=None,
        metadata={"help": "Gradient checkpointing with torch's reentrant implementation (true) or the "
                  "non-reentrant one (false). Unset: transformers' default."},
    )

    def __post_init__(self) -> None:
        # transformers resolves an unset gradient_checkpointing (and its new name, activation_checkpointing) to
        # False; Gym's unset means auto, decided once the model and batch are known (train.workflow).
        auto = self.gradient_checkpointing is None and self.activation_checkpointing is None
        if self.pure_bf16:
            self.bf16 = False  # the weights are bf16 already: no autocast on top
        if self.use_reentrant_gc is not None:
            kwargs = self.gradient_checkpointing_kwargs or self.activation_checkpointing_kwargs or {}
            if isinstance(kwargs, str):  # given on the command line as JSON
                kwargs = json.loads(kwargs)
            self.activation_checkpointing_kwargs = {**kwargs, "use_reentrant": self.use_reentrant_gc}
            self.gradient_checkpointing_kwargs = None
        self.report_to = split_report_to(self.report_to)
        super().__post_init__()  # type: ignore[no-untyped-call]
        if auto:
            self.gradient_checkpointing = self.activation_checkpointing = None

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.learning_rate < 0:
            raise ConfigError(f"'learning_rate' must be >= 0, got {self.learning_rate}.")
        for key in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'{key}' must be at least 1, got {getattr(self, key)}.")
        if self.fsdp and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            raise ConfigError("'fsdp' shards the model across processes, and this is one process: launch with "
                              "NPROC_PER_NODE=2 (or more) gym train ... (docs/distributed.md), or remove it.")
        if self.deepspeed and "LOCAL_RANK" not in os.environ:
            raise ConfigError("'deepspeed' runs in processes started by a launcher: `gym train CONFIG` starts torchrun "
                              "itself (NPROC_PER_NODE=N for N processes); from Python, run under torchrun.")
        check_report_to(list(self.report_to or []))
        if self.do_predict:
            raise ConfigError("'do_predict' is not how Gym predicts: run `gym infer CONFIG --dataset D -o out.jsonl` "
                              "(generations for every row, resumable).")
        if self.use_liger_kernel:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("'enable_liger_kernel' (use_liger_kernel) needs a CUDA GPU: Liger's kernels are "
                                  "Triton, and this machine has none. Leave it off here.")
            if importlib.util.find_spec("liger_kernel") is None:
                raise ConfigError("'enable_liger_kernel' needs the liger-kernel package: pip install liger-kernel.")


def torch_cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@functools.cache
def training_defaults() -> TrainingArguments:
    """A TrainingArguments with nothing set (what gym_config.yaml leaves out as default). Built once per process,
    by the parser, before the run's own TrainingArguments: building one resets accelerate's process-wide state
    (in a torchrun process, to a single process), which the run's arguments set up again and a live Trainer
    reads, so it must never be built after them."""
    return TrainingArguments(output_dir="saves/defaults")
