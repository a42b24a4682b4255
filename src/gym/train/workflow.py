"""The causal-LM training path shared by pt and sft, top to bottom:
tokenizer -> chat format -> data -> model (+ adapters) -> trainer -> train -> save -> report."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, ProgressCallback

from gym.config.parser import TrainArgs, split_names
from gym.data.collators import CausalLMCollator
from gym.data.loader import TokenizedData, get_dataset
from gym.data.templates import get_chat_format
from gym.models.adapters import count_parameters, setup_finetuning
from gym.models.loader import load_causal_lm, load_tokenizer, resolve_model_path
from gym.train import outputs, resources
from gym.train.callbacks import JsonlLogger, ProgressBar
from gym.train.method import RunResult
from gym.train.trainer import GymTrainer

logger = logging.getLogger(__name__)


def _warn_about_precision(args: TrainArgs) -> None:
    if args.training.bf16 and not torch.cuda.is_available() and not resources.cpu_supports_bf16():
        logger.warning("bf16 is on, but this CPU has no native bf16 instructions: expect it to train ~2x slower "
                       "than float32 (leave bf16 unset to choose automatically).")


def _choose_checkpointing(args: TrainArgs, model: Any, data: TokenizedData) -> None:
    training = args.training
    if training.gradient_checkpointing is None:
        longest = max(len(e["input_ids"]) for e in data.train)
        tokens = longest * training.per_device_train_batch_size
        training.gradient_checkpointing = training.activation_checkpointing = resources.needs_checkpointing(
            model, tokens
        )
        logger.info("Gradient checkpointing: %s (auto, for %d tokens per step).",
                    "on" if training.gradient_checkpointing else "off", tokens)
    if training.gradient_checkpointing and args.finetuning.finetuning_type != "full":
        # With a frozen embedding, checkpointed blocks would see inputs that need no grad and
        # silently skip the backward pass through them.
        model.enable_input_require_grads()


def run_causal_lm(args: TrainArgs, data_kind: str, packing_by_default: bool) -> RunResult:
    model_args, data_args, training_args, finetuning_args, _ = args
    resume = outputs.resolve_resume(args)
    outputs.check_output_dir(args, resuming=resume is not None)
    _warn_about_precision(args)

    model_path = resolve_model_path(model_args.model_name_or_path)
    tokenizer = load_tokenizer(model_path, model_args)
    chat = get_chat_format(tokenizer, data_args.template, data_args.default_system, data_args.enable_thinking)

    packing = data_args.neat_packing or (packing_by_default if data_args.packing is None else data_args.packing)
    data = get_dataset(data_args, chat, data_kind, seed=training_args.seed, packing=packing)
    logger.info("Data: %s", data.stats)
    logger.info("Precision: %s", "bf16 mixed (float32 master weights)" if training_args.bf16 else
                "fp16 mixed" if training_args.fp16 else "float32")

    torch.manual_seed(training_args.seed)
    model = load_causal_lm(model_path, model_args)
    model = setup_finetuning(model, finetuning_args, split_names(model_args.adapter_name_or_path))
    trainable, total = count_parameters(model)
    logger.info("Trainable parameters: %s of %s (%.2f%%)", f"{trainable:,}", f"{total:,}", 100 * trainable / total)
    _choose_checkpointing(args, model, data)

    pissa_init_dir = None
    if finetuning_args.finetuning_type == "lora" and finetuning_args.pissa_init:
        pissa_init_dir = str(Path(training_args.output_dir) / "pissa_init")
        if resume is None:
            model.save_pretrained(pissa_init_dir)

    if not torch.cuda.is_available():
        training_args.dataloader_pin_memory = False  # pinning needs an accelerator; it only warns on CPU
    if data.eval is not None and training_args.eval_strategy == "no":
        training_args.eval_strategy = "epoch"
    trainer = GymTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=data.eval,
        data_collator=CausalLMCollator(
            pad_token_id=tokenizer.pad_token_id,
            flash_attention=model.config._attn_implementation == "flash_attention_2",
        ),
        processing_class=tokenizer,
        loraplus_lr_ratio=finetuning_args.loraplus_lr_ratio,
        loraplus_lr_embedding=finetuning_args.loraplus_lr_embedding,
    )
    if not training_args.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(ProgressBar())
    trainer.add_callback(JsonlLogger(training_args.output_dir))

    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - started
    metrics = dict(result.metrics)
    if data.eval is not None:
        metrics.update(trainer.evaluate())

    out = outputs.save_final(trainer, tokenizer, args, model_path, pissa_init_dir)
    if finetuning_args.plot_loss:
        outputs.plot_loss(out)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return RunResult(
        output_dir=str(out),
        global_step=trainer.state.global_step,
        final_loss=losses[-1] if losses else None,
        tokens_per_second=trainer.tokens_per_second(),
        peak_memory_bytes=resources.peak_memory_bytes(),
        train_seconds=seconds,
        tokens_seen=trainer.tokens_seen,
        metrics=metrics,
    )
