"""TrainingArguments: Hugging Face's training keys, with the defaults Gym changes and Gym's own checks.

A plain dataclass (its fields are Hugging Face's, written out in gym.config.hf_training_fields), so reading a config
imports neither transformers nor torch, and `gym chat`/`api`/`eval`/`export` never build a Hugging Face
`TrainingArguments`. The training job builds the real one from these values when a run starts (gym.train.hf_args);
what depends on the machine (bf16 where it is native, the CPU when there is no accelerator) is decided there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym.config.hf_training_fields import HFTrainingFields
from gym.config.tracking import check_report_to, split_report_to
from gym.core.errors import ConfigError

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


@dataclass
class TrainingArguments(HFTrainingFields):
    """Every Hugging Face `TrainingArguments` key, with the defaults Gym changes:

    - `output_dir`: unset means `saves/<model>/<finetuning_type>/<stage>`.
    - `logging_steps`: 1, so `trainer_log.jsonl` and the loss plot see every step (logging is cheap;
      Gym's progress bar does not print a line per log).
    - `gradient_checkpointing`: unset means "auto": on only when the estimated activations would not
      fit in free memory, because recomputing them costs about a third more compute.
    - `bf16`: unset means "auto": on where the hardware has native bf16, decided when the run starts.
    - `logging_nan_inf_filter`: false, so a diverged run's loss reads NaN (Hugging Face hides it, and reports 0
      when no loss of the window is finite).
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
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={"help": "Log a NaN or inf loss as the average of the finite ones around it (0 when none is). Off "
                  "by default, unlike Hugging Face: a run that diverged logs, plots and reports its loss as NaN."},
    )
    bf16: bool | None = field(  # type: ignore[assignment]  # None = auto, resolved when the run starts
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
    use_cpu: bool | None = field(  # type: ignore[assignment]  # None = auto, resolved when the run starts
        default=None,
        metadata={"help": "Train on the CPU even where an accelerator exists. Unset: the CPU only when there is no "
                  "accelerator (so configs written for GPUs, bf16: true included, still run here)."},
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
        if self.pure_bf16:
            self.bf16 = False  # the weights are bf16 already: no autocast on top
        if self.use_reentrant_gc is not None:
            kwargs = self.gradient_checkpointing_kwargs or self.activation_checkpointing_kwargs or {}
            if isinstance(kwargs, str):  # given on the command line as JSON
                try:
                    kwargs = json.loads(kwargs)
                except json.JSONDecodeError:
                    raise ConfigError(f"'gradient_checkpointing_kwargs' is a JSON object, got {kwargs!r}.") from None
            self.activation_checkpointing_kwargs = {**kwargs, "use_reentrant": self.use_reentrant_gc}
            self.gradient_checkpointing_kwargs = None
        self.report_to = split_report_to(self.report_to)

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.bf16 and self.fp16:
            raise ConfigError("At most one of fp16 and bf16 can be true (bf16: unset chooses by the hardware).")
        if self.learning_rate < 0:
            raise ConfigError(f"'learning_rate' must be >= 0, got {self.learning_rate}.")
        for key in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'{key}' must be at least 1, got {getattr(self, key)}.")
        if not self.weight_decay >= 0:  # torch's AdamW refuses it once the model has loaded; NaN fails here too
            raise ConfigError(f"'weight_decay' must be 0 or more (0.01 to 0.1 is usual), got {self.weight_decay}.")
        self._validate_schedule(args)
        if self.fsdp and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            raise ConfigError("'fsdp' shards the model across processes, and this is one process: launch with "
                              "NPROC_PER_NODE=2 (or more) gym train ... (docs/distributed.md), or remove it.")
        if self.deepspeed and "LOCAL_RANK" not in os.environ:
            raise ConfigError("'deepspeed' runs in processes started by a launcher: `gym train CONFIG` starts torchrun "
                              "itself (NPROC_PER_NODE=N for N processes); from Python, run under torchrun.")
        if self.deepspeed and importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("'deepspeed' needs the deepspeed package: pip install 'zoo-gym[deepspeed]' (then launch "
                              "with NPROC_PER_NODE=N gym train ..., docs/distributed.md).")
        report_to = self.report_to
        if isinstance(report_to, str):  # one name; "none" and "all" are transformers' own words
            report_to = [] if report_to in ("none", "all") else [report_to]
        check_report_to(list(report_to or []))
        if self.do_predict:
            raise ConfigError("'do_predict' is not how Gym predicts: run `gym infer CONFIG --dataset D -o out.jsonl` "
                              "(generations for every row, resumable).")

    def _validate_schedule(self, args: TrainArgs[Any]) -> None:
        """How long the run is, and when it saves and evaluates: values Hugging Face takes silently and then trains
        nothing, never saves, adds reversed noise, or fails on after the model has loaded."""
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ConfigError(f"Nothing to train: max_steps {self.max_steps} and num_train_epochs "
                              f"{self.num_train_epochs}; set max_steps (a positive step count) or num_train_epochs.")
        if self.save_strategy == "steps" and self.save_steps <= 0:
            raise ConfigError(f"'save_steps' must be positive with save_strategy: steps, got {self.save_steps} "
                              "(a step count, or a share of the run when < 1).")
        eval_strategy = str(getattr(self.eval_strategy, "value", self.eval_strategy))
        if eval_strategy != "no" and not (args.data.val_size or args.data.eval_dataset):
            raise ConfigError(f"'eval_strategy: {eval_strategy}' needs evaluation data: set val_size "
                              "(e.g. 0.1) or eval_dataset, or remove eval_strategy.")
        if self.neftune_noise_alpha is not None and self.neftune_noise_alpha <= 0:
            raise ConfigError(f"'neftune_noise_alpha' must be positive (typically 5 to 15), got "
                              f"{self.neftune_noise_alpha}; remove it for no noise.")

    def check_environment(self, args: TrainArgs[Any]) -> None:
        """What this machine must have for the run (checked when it is about to train here)."""
        if self.use_liger_kernel:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("'enable_liger_kernel' (use_liger_kernel) needs a CUDA GPU: Liger's kernels are "
                                  "Triton, and this machine has none. Leave it off here.")
            if importlib.util.find_spec("liger_kernel") is None:
                raise ConfigError("'enable_liger_kernel' needs the liger-kernel package: pip install liger-kernel.")

    def non_defaults(self) -> dict[str, Any]:
        """The keys whose value differs from Hugging Face's default (what the run sets; the other hundred are noise),
        and Gym's own keys (which transformers does not take) where they differ from Gym's default."""
        defaults = {**_defaults(TrainingArguments), **_defaults(HFTrainingFields)}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.init and getattr(self, f.name) != defaults[f.name]}


GYM_ONLY_KEYS = ("pure_bf16", "use_reentrant_gc")


def _defaults(cls: type) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
        else:
            defaults[f.name] = f.default
    return defaults
