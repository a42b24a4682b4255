"""DataArguments: which data to train on, and how it becomes token ids."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gym.core.errors import ConfigError
from gym.core.names import did_you_mean, split_names

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


# gym.data.tools' formats and aliases, spelled out here because config sits below data (a test keeps them equal)
TOOL_FORMAT_NAMES = ("chatml", "default", "glm4", "hermes", "llama3", "mistral", "qwen")
# gym.data.templates' TEMPLATES, likewise (a test keeps them equal): a misspelt template is refused with the config,
# not after the tokenizer has loaded
TEMPLATE_NAMES = ("alpaca", "chatml", "cohere", "deepseek", "deepseek3", "default", "gemma", "gemma3", "glm4", "llama2",
                  "llama3", "llama4", "mistral", "moss_vl", "phi", "phi4", "qwen", "qwen2_vl", "qwen3", "qwen3_nothink",
                  "qwen3_vl", "qwen3_vl_nothink", "vicuna", "yi", "zephyr")


@dataclass
class DataArguments:
    """Which data to train on, and how it becomes token ids."""

    template: str | None = field(
        default=None,
        metadata={"help": "Chat template: the tokenizer's own when unset, or a named one "
                  "(chatml, qwen3, llama3, mistral, gemma, default, ...)."},
    )
    tool_format: str | None = field(
        default=None,
        metadata={"help": "How tools and tool calls are written (default, qwen/hermes, llama3, mistral, glm4): "
                  "overrides the named template's family format, or, with the tokenizer's own template, is used "
                  "when its format cannot be detected or when it cannot render tools itself."},
    )
    dataset: str | None = field(
        default=None,
        metadata={"help": "Comma-separated dataset names from dataset_info.json, file paths, or hub ids."},
    )
    dataset_dir: str = field(default="data", metadata={"help": "Folder holding dataset_info.json and data files."})
    media_dir: str | None = field(
        default=None,
        metadata={"help": "Folder that relative image, video and audio paths in the rows are read from "
                  "(LLaMA-Factory's key). Default: dataset_dir."},
    )
    eval_dataset: str | None = field(default=None, metadata={"help": "Comma-separated evaluation datasets."})
    mix_strategy: Literal["concat", "interleave_under", "interleave_over"] = field(
        default="concat",
        metadata={"help": "How several datasets in `dataset` (and in `eval_dataset`) become one (LLaMA-Factory's key): "
                  "concat (one after another), interleave_under (a row of each in turn, or drawn with "
                  "interleave_probs, until the first runs out), interleave_over (until every one has run out at "
                  "least once, the shorter ones repeated)."},
    )
    interleave_probs: list[float] | None = field(
        default=None,
        metadata={"help": "With an interleave mix_strategy: the chance that the next row comes from each dataset, "
                  "one per dataset in `dataset`, summing to 1 (0.7,0.3). Unset: a row of each in turn."},
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "Accepted for LLaMA-Factory configs. Gym reads and tokenizes every row before training "
                  "starts, so nothing is streamed and this has no effect."},
    )
    buffer_size: int = field(
        default=16384, metadata={"help": "LLaMA-Factory's shuffle buffer for streaming; no effect (see streaming)."}
    )
    cutoff_len: int = field(default=2048, metadata={"help": "Maximum tokens per example; longer ones are truncated."})
    max_samples: int | None = field(default=None, metadata={"help": "Keep at most this many rows per dataset."})
    # int | float keeps what the user wrote: `1` is one row, `1.0` a share of all of them (refused in validate)
    val_size: int | float = field(
        default=0.0,
        metadata={"help": "Hold out this share (a number below 1: 0.1) or this many rows (a whole number: 100) of "
                  "the training data for evaluation."},
    )
    packing: bool | None = field(
        default=None,
        metadata={"help": "Pack several examples into one row of cutoff_len tokens, with no attention across "
                  "them. Default: on for pt, off for sft."},
    )
    neat_packing: bool = field(
        default=False,
        metadata={"help": "LLaMA-Factory's name for packing without cross-attention; Gym's packing always "
                  "isolates samples, so this just turns packing on."},
    )
    train_on_prompt: bool = field(default=False, metadata={"help": "Also compute the loss on prompt tokens."})
    mask_history: bool = field(
        default=False, metadata={"help": "Train only on the last assistant turn of multi-turn conversations."}
    )
    default_system: str | None = field(
        default=None, metadata={"help": "System prompt used when a row has none."}
    )
    enable_thinking: bool = field(
        default=True,
        metadata={"help": "For thinking templates (qwen3): keep the <think> block; false inserts an empty one."},
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes used to tokenize the dataset."}
    )
    overwrite_cache: bool = field(
        default=False,
        metadata={"help": "Accepted for LLaMA-Factory configs. Gym keeps no tokenized cache, so data is always "
                  "re-tokenized and this has no effect."},
    )
    seed_shuffle_datasets: bool = field(
        default=False, metadata={"help": "Shuffle rows (with the training seed) before max_samples is applied."}
    )

    def validate(self, args: TrainArgs[Any]) -> None:
        if self.template is not None and self.template not in TEMPLATE_NAMES:
            hint = did_you_mean(self.template, TEMPLATE_NAMES)
            raise ConfigError(f"Unknown template '{self.template}'.{hint} Known: {', '.join(TEMPLATE_NAMES)}; "
                              "or leave it unset for the tokenizer's own.")
        if self.tool_format is not None and self.tool_format not in TOOL_FORMAT_NAMES:
            hint = did_you_mean(self.tool_format, TOOL_FORMAT_NAMES)
            raise ConfigError(f"Unknown tool_format '{self.tool_format}'.{hint} Known: {', '.join(TOOL_FORMAT_NAMES)}.")
        if self.cutoff_len <= 0:
            raise ConfigError(f"'cutoff_len' must be positive, got {self.cutoff_len}.")
        if self.max_samples is not None and self.max_samples <= 0:
            raise ConfigError(f"'max_samples' must be positive, got {self.max_samples}.")
        if self.val_size < 0:
            raise ConfigError(f"'val_size' must be >= 0, got {self.val_size}.")
        if self.val_size and self.eval_dataset:
            raise ConfigError("Set either 'val_size' or 'eval_dataset', not both.")
        if isinstance(self.val_size, float) and self.val_size == 1:
            # LLaMA-Factory fails on it too; holding out every row, or one row, are both guesses at what was meant
            raise ConfigError("'val_size: 1.0' is a share of all the training rows, which leaves none to train on: "
                              "write a share below 1 (0.1 holds out 10%), or a whole number of rows without a "
                              "decimal point (1 holds out one row).")
        if self.val_size > 1 and not float(self.val_size).is_integer():
            raise ConfigError(f"'val_size' is a share below 1 or a whole number of rows, got {self.val_size}.")
        self._validate_mix()
        stage = args.finetuning.stage
        # Only sft and pt pack (the rows of the other stages are pairs, groups or prompts scored whole); the others
        # would train unpacked and say nothing. cls and unlearn say why in their own words.
        if (self.packing or self.neat_packing) and stage not in ("sft", "pt", "cls", "unlearn"):
            key = "packing" if self.packing else "neat_packing"
            raise ConfigError(f"'{key}' applies to stage sft and pt (rows concatenated into full-length sequences); "
                              f"stage {stage} trains on whole rows: remove it.")

    def _validate_mix(self) -> None:
        probs = self.interleave_probs
        if probs is None:
            return
        if self.mix_strategy == "concat":
            raise ConfigError("'interleave_probs' applies to mix_strategy: interleave_under or interleave_over; "
                              "with concat every row of every dataset is used once. Set mix_strategy, or remove it.")
        if any(not math.isfinite(p) or p < 0 for p in probs) or not math.isclose(sum(probs), 1, abs_tol=0.01):
            raise ConfigError(f"'interleave_probs' are chances, each 0 or more and summing to 1, got {probs}.")
        if self.mix_strategy == "interleave_over" and 0 in probs:
            # datasets' interleave_datasets loops for ever here: a dataset never drawn never runs out
            raise ConfigError("'interleave_probs' gives a dataset the chance 0, so it is never drawn and "
                              "interleave_over (which runs until every dataset has run out) would never end: "
                              "remove that dataset from `dataset`, or use interleave_under.")
        # One evaluation set is not mixed, whatever `dataset` holds; several are mixed as the training sets are.
        for key, least in (("dataset", 1), ("eval_dataset", 2)):
            count = len(split_names(getattr(self, key)))
            if count >= least and count != len(probs):
                raise ConfigError(f"'interleave_probs' has {len(probs)} chances and '{key}' names {count} "
                                  "datasets: give one chance per dataset, in the same order.")
