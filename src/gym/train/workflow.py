"""The training path every method shares, top to bottom:
tokenizer -> chat format -> data -> model (+ adapters) -> [the method's trainer] -> train -> save -> report.

`prepare` and `train_and_save` are the two halves around a method's own trainer; `run_causal_lm` is
the whole path for pt and sft."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gym.config.args import TrainArgs
from gym.config.finetuning import ADAPTER_TYPES
from gym.config.stages.registry import registered_stages
from gym.core.files import temp_path
from gym.core.hardware import cpu_supports_bf16
from gym.core.kinds import DataKind
from gym.core.names import split_names
from gym.core.results import RunResult
from gym.data.collators import CausalLMCollator, MediaCollator
from gym.data.loader import TokenizedData, get_dataset
from gym.data.multimodal import MediaInputs
from gym.data.templates import ChatFormat, get_chat_format
from gym.models import vision
from gym.models.adapters import count_parameters, setup_finetuning
from gym.models.loader import load_causal_lm, load_tokenizer, resolve_model_path
from gym.train import harness, optimizers, ranks, sharding, stopping, tracking
from gym.train.checkpoints import resolve_resume
from gym.train.hf_args import hf_training_args
from gym.train.memory import needs_checkpointing
from gym.train.trainer import GymTrainer

logger = logging.getLogger(__name__)


def _warn_about_precision(args: TrainArgs[Any]) -> None:
    if args.training.bf16 and not torch.cuda.is_available() and not cpu_supports_bf16():
        logger.warning("bf16 is on, but this CPU has no native bf16 instructions: expect it to train ~2x slower "
                       "than float32 (leave bf16 unset to choose automatically).")


@dataclass
class Setup:
    """Everything a method needs before it builds its trainer."""

    model_path: str
    tokenizer: Any
    chat: ChatFormat
    data: TokenizedData
    model: Any  # adapters already attached (a PeftModel under lora)
    resume: str | None
    pissa_init_dir: str | None
    training: Any  # the run's transformers.TrainingArguments: the config's training keys plus the run's decisions
    processor: Any = None  # a multimodal model's processor (saved with the result in place of the tokenizer)
    media: MediaInputs | None = None  # how rows' media reach a multimodal model (gym.data.multimodal)


def media_refusal(args: TrainArgs[Any], method_refusal: str | None = None) -> str | None:
    """Why this run cannot train on rows with images, videos or audio (the end of a sentence naming the first such
    row), or None when it can: its stage does not feed media to the model (gym.config.stages.registry: `media`), or
    the method says why (`method_refusal`: a variant of a stage that can, e.g. dpo with pref_loss: orpo)."""
    stages = registered_stages()
    name = args.finetuning.stage
    if not stages[name].media:
        takers = sorted(stage for stage, declared in stages.items() if declared.media)
        return (f"stage '{name}' cannot train on them: its trainer shows the model the text alone, which would teach "
                f"answers about media the model never sees. The stages that take images, videos and audio are "
                f"{', '.join(takers)}; use one of them, or a dataset without media.")
    return method_refusal


def prepare(args: TrainArgs[Any], data_kind: DataKind, *, packing_by_default: bool = False,
            model_loader: Callable[..., Any] = load_causal_lm, refuse_media: str | None = None,
            loader_options: Callable[[TokenizedData], dict[str, Any]] | None = None) -> Setup:
    """resume -> output checks -> tokenizer -> chat format -> data -> model + adapters, for any method.

    Rows with media reach a multimodal model only in the stages that declare `media` (others are refused as the rows
    are read, see media_refusal); `refuse_media` is the method's own reason to refuse them. `loader_options(data)`:
    the model loader's keywords that depend on the data read (a classifier's class names)."""
    model_args, data_args, training_args, finetuning_args = args.model, args.data, args.training, args.finetuning
    resume = resolve_resume(args)
    _warn_about_precision(args)
    hf_args = hf_training_args(args)

    with ranks.local_main_first(hf_args):
        sharding.connect_deepspeed(hf_args)
        model_path = resolve_model_path(model_args.model_name_or_path)
        processor, media = None, None
        if vision.is_multimodal(model_path, model_args):
            processor = vision.load_processor(model_path, model_args)
            media = MediaInputs.for_processor(processor, model_args.model_name_or_path or model_path,
                                              image_max_pixels=model_args.image_max_pixels,
                                              image_min_pixels=model_args.image_min_pixels,
                                              audio_sampling_rate=model_args.audio_sampling_rate)
            tokenizer = processor.tokenizer
            if model_loader is load_causal_lm:
                model_loader = vision.load_multimodal
        else:
            tokenizer = load_tokenizer(model_path, model_args)
        chat = get_chat_format(tokenizer, data_args.template, data_args.default_system, data_args.enable_thinking,
                               tool_format=data_args.tool_format)
        packing = data_args.neat_packing or (packing_by_default if data_args.packing is None else data_args.packing)
        data = get_dataset(data_args, chat, data_kind, seed=training_args.seed, packing=packing, media=media,
                           refuse_media=media_refusal(args, refuse_media))
    logger.info("Data: %s", data.stats)
    dtype = weights_dtype(args, hf_args, data_kind)
    logger.info("Precision: %s", ("bf16 mixed (the frozen base in bf16, what trains in float32)" if dtype is
                                  torch.bfloat16 else "bf16 mixed (float32 master weights)") if hf_args.bf16 else
                "pure bf16" if training_args.pure_bf16 else "fp16 mixed" if training_args.fp16 else "float32")

    torch.manual_seed(training_args.seed)
    model_loader = functools.partial(model_loader, dtype=dtype, **(loader_options(data) if loader_options else {}))
    pissa_init_dir = None
    if finetuning_args.finetuning_type == "lora" and finetuning_args.pissa_init:
        pissa_init_dir = str(Path(args.output_dir) / "pissa_init")
    if pissa_init_dir is not None and model_args.quantization_bit is not None:
        model = _pissa_on_quantized_base(args, model_path, model_loader, pissa_init_dir, fresh=resume is None)
    else:
        model = model_loader(model_path, model_args)
        model = setup_finetuning(model, finetuning_args, split_names(model_args.adapter_name_or_path))
        if dtype is torch.bfloat16 and hf_args.bf16:
            trainable_in_float32(model)
        if pissa_init_dir is not None and resume is None:
            model.save_pretrained(pissa_init_dir)
    upcast(model, model_args)
    trainable, total = count_parameters(model)
    logger.info("Trainable parameters: %s of %s (%.2f%%)", f"{trainable:,}", f"{total:,}", 100 * trainable / total)

    return Setup(model_path, tokenizer, chat, data, model, resume, pissa_init_dir, hf_args, processor, media)


def weights_dtype(args: TrainArgs[Any], hf_args: Any, data_kind: DataKind) -> torch.dtype:
    """The dtype the model is loaded in. pure_bf16: bf16. bf16 mixed precision with a frozen base (LoRA, OFT or
    BOFT on an unquantized model): the base in bf16 too, as TRL and LLaMA-Factory load it. Autocast reads its
    linear weights in bf16 anyway; kept in float32 they doubled the base's memory, cost a cast of every weight at
    every forward (and again when checkpointing recomputes), and left the LM head and its loss, which run
    outside autocast, as float32 matrix products (on an H200, 19% of a Qwen3-0.6B LoRA step's GPU time). What
    trains is made float32 after the adapter is added (`trainable_in_float32`). Otherwise float32 master weights.

    Not for runs that generate with the adapter merged (the prompt-only stages: ppo, grpo, rloo): merging into
    bf16 weights and back rounds the base at every rollout. Not under FSDP or DeepSpeed, whose shards expect one
    dtype per group of parameters, nor for PiSSA, whose saved adapter is converted against the exact base."""
    training, finetuning = args.training, args.finetuning
    if training.pure_bf16:
        return torch.bfloat16
    frozen_base = (finetuning.finetuning_type in ADAPTER_TYPES and args.model.quantization_bit is None
                   and not args.model.use_unsloth and not finetuning.pissa_init)
    sharded = (bool(hf_args.fsdp) or bool(hf_args.deepspeed)
               or any(os.environ.get(f"ACCELERATE_USE_{kind}", "").lower() in ("1", "true")
                      for kind in ("FSDP", "DEEPSPEED")))
    if hf_args.bf16 and frozen_base and not sharded and data_kind is not DataKind.PROMPT:
        return torch.bfloat16
    return torch.float32


def trainable_in_float32(model: torch.nn.Module) -> None:
    """Float32 master weights for what trains on a bf16 base: peft makes its adapters float32 already; copies it
    trains in full (modules_to_save: `additional_target`, a classifier's score head, a vision projector) are
    still bf16 until here. In place, so a tied head stays tied."""
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.is_floating_point() and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()


def upcast(model: torch.nn.Module, model_args: Any) -> None:
    """LLaMA-Factory's upcast_layernorm / upcast_lmhead_output, and its print_param_status."""
    if model_args.upcast_layernorm:
        for name, parameter in model.named_parameters():
            parts = name.split(".")
            if parameter.ndim == 1 and any("norm" in part or part.startswith("ln") for part in parts[:-1]):
                parameter.data = parameter.data.float()  # in place, so the optimizer and any tie see it
    if model_args.upcast_lmhead_output:
        head = model.get_output_embeddings()  # type: ignore[operator]
        if head is not None:
            head.register_forward_hook(lambda module, inputs, output: output.float())
    if model_args.print_param_status:
        for name, parameter in model.named_parameters():
            logger.info("%s: %s, %s, %s", name, str(parameter.dtype).removeprefix("torch."), parameter.device,
                        "trains" if parameter.requires_grad else "frozen")


def _pissa_on_quantized_base(args: TrainArgs[Any], model_path: str, model_loader: Callable[..., Any],
                             pissa_init_dir: str, fresh: bool) -> Any:
    """PiSSA under quantization_bit: the principal components move into the adapter in full precision, and only
    what remains of each weight (the residual, with a smaller range) is quantized, so the base loses less to
    rounding than the original weights would (Meng et al., 2024, sec. 4.4). The residual model is kept in
    output_dir/pissa_residual for resuming; the saved adapter is converted to apply to the original base."""
    residual_dir = Path(args.output_dir) / "pissa_residual"
    if fresh or not (residual_dir / "config.json").is_file():
        full = model_loader(model_path, dataclasses.replace(args.model, quantization_bit=None))
        peft_model = setup_finetuning(full, args.finetuning)
        peft_model.save_pretrained(pissa_init_dir)
        residual = peft_model.unload()  # the base layers without the adapter: W - U S V^T
        tmp = temp_path(residual_dir)
        residual.save_pretrained(tmp)
        shutil.rmtree(residual_dir, ignore_errors=True)
        os.replace(tmp, residual_dir)
        del peft_model, residual, full
    model = model_loader(str(residual_dir), args.model)
    return setup_finetuning(model, args.finetuning, [pissa_init_dir])


def choose_checkpointing(args: TrainArgs[Any], setup: Setup, tokens_per_step: int) -> None:
    """Gradient checkpointing: on when asked, or (unset) when the activations would not fit in memory. The decision
    goes into the run's arguments (setup.training), which the trainer reads; the config stays as validated."""
    training, model = setup.training, setup.model
    if args.training.gradient_checkpointing is None and args.training.activation_checkpointing is None:
        needed = needs_checkpointing(model, tokens_per_step)
        training.gradient_checkpointing = training.activation_checkpointing = needed
        logger.info("Gradient checkpointing: %s (auto, for %d tokens per step).", "on" if needed else "off",
                    tokens_per_step)
    if training.activation_checkpointing and args.finetuning.finetuning_type != "full":
        # With a frozen embedding, checkpointed blocks would see inputs that need no grad and
        # silently skip the backward pass through them.
        model.enable_input_require_grads()


def trl_args(config_cls: type, args: TrainArgs[Any], setup: Setup, **method_values: Any) -> Any:
    """A TRL config (a TrainingArguments subclass) holding the user's training keys, the run's decisions and the
    method's own values (gym.train.hf_args: the user's config wins over TRL's changed defaults)."""
    return hf_training_args(args, config_cls, activation_checkpointing=setup.training.activation_checkpointing,
                            **method_values)


def drop_fresh_reference_adapter(model: Any, args: TrainArgs[Any]) -> None:
    """TRL copies a given LoRA adapter as the reference ("ref"). A fresh adapter starts at zero, so the
    base with the adapter disabled is the same reference, without a second adapter to run and save.
    (PiSSA and LoftQ start from a non-zero adapter: their copy is the true reference.)"""
    fresh = not (args.model.adapter_name_or_path or args.finetuning.pissa_init or args.finetuning.loftq_init)
    if fresh and "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def train_and_save(trainer: Any, setup: Setup, args: TrainArgs[Any]) -> RunResult:
    """The harness around a Trainer: log file, progress and trackers -> train (resuming if asked) -> evaluate ->
    save -> plot -> report."""
    sharding.enable_fsdp_on_cpu(trainer)
    trainer.add_callback(sharding.ShardReport())
    optimizers.install(trainer, args)
    harness.attach(trainer, args, setup.model_path)
    # The trackers' runs stay open until the final evaluation has been logged to them.
    with tracking.runs_closed(trainer.callback_handler.callbacks):
        metrics, seconds = _train_and_evaluate(trainer, setup, args)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    if isinstance(trainer, GymTrainer):  # counts from its first batch, so setup is not counted
        tokens_seen, tokens_per_second = trainer.tokens_seen, trainer.tokens_per_second()
    else:  # TRL trainers log the running count of tokens they trained on; transformers' the tokens it read
        tokens_seen = int(max((e.get("num_tokens", 0) or e.get("num_input_tokens_seen", 0)
                               for e in trainer.state.log_history), default=0))
        tokens_per_second = tokens_seen / seconds if seconds else 0.0
    return harness.finish_run(trainer.model, setup.processor or setup.tokenizer, args, model_path=setup.model_path,
                              global_step=trainer.state.global_step, seconds=seconds, tokens_seen=tokens_seen,
                              tokens_per_second=tokens_per_second, final_loss=losses[-1] if losses else None,
                              metrics=metrics, pissa_init_dir=setup.pissa_init_dir)


def _train_and_evaluate(trainer: Any, setup: Setup, args: TrainArgs[Any]) -> tuple[dict[str, Any], float]:
    """The run's metrics, and the seconds it trained (the final evaluation not counted)."""
    started = time.perf_counter()
    with stopping.stop_on_interrupt() as stop:
        trainer.add_callback(stopping.StopCallback(stop))
        trainer.add_callback(stopping.EndReachedCallback())
        try:
            metrics = dict(trainer.train(resume_from_checkpoint=setup.resume).metrics)
        except stopping.NothingLeftToTrain:
            logger.info("%s is at the run's last step (%d): saving it as the result, nothing left to train.",
                        Path(str(setup.resume)).name, trainer.state.global_step)
            trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
            metrics = {}
    if stop.requested and trainer.state.global_step < trainer.state.max_steps:
        raise stopping.stopped(args.output_dir, trainer.state.global_step, trainer.state.max_steps)
    seconds = time.perf_counter() - started
    if trainer.eval_dataset is not None:
        final_eval = [e for e in trainer.state.log_history
                      if e.get("step") == trainer.state.global_step and any(k.startswith("eval_") for k in e)]
        metrics.update(final_eval[-1] if final_eval else trainer.evaluate())
    return metrics, seconds


def run_causal_lm(args: TrainArgs[Any], data_kind: DataKind, packing_by_default: bool) -> RunResult:
    setup = prepare(args, data_kind, packing_by_default=packing_by_default)
    longest = max(len(row["input_ids"]) for row in setup.data.train)
    choose_checkpointing(args, setup, longest * args.training.per_device_train_batch_size)
    trainer = GymTrainer(
        model=setup.model,
        args=setup.training,
        train_dataset=setup.data.train,
        eval_dataset=setup.data.eval,
        data_collator=MediaCollator(
            pad_token_id=setup.tokenizer.pad_token_id,
            flash_attention=setup.model.config._attn_implementation == "flash_attention_2",
            media=setup.media,
        ) if setup.media is not None else CausalLMCollator(
            pad_token_id=setup.tokenizer.pad_token_id,
            flash_attention=setup.model.config._attn_implementation == "flash_attention_2",
        ),
        processing_class=setup.processor or setup.tokenizer,
        loraplus_lr_ratio=args.finetuning.loraplus_lr_ratio,
        loraplus_lr_embedding=args.finetuning.loraplus_lr_embedding,
        dft_loss=args.finetuning.use_dft_loss,
    )
    return train_and_save(trainer, setup, args)
