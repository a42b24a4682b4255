"""FinetuningArguments: the stage (training method) and which parameters move."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gym.config.optimizers import OptimizerArguments
from gym.core.errors import ConfigError
from gym.core.names import split_names

if TYPE_CHECKING:
    from gym.config.args import TrainArgs


# Fine-tuning types that train a peft adapter on a frozen base.
ADAPTER_TYPES = ("lora", "oft", "boft")


@dataclass
class FinetuningArguments(OptimizerArguments):
    """What to train (stage), which parameters move (finetuning type) and, through OptimizerArguments, the
    optimizer that moves them."""

    stage: str = field(
        default="sft",
        metadata={"help": "Training method: one of the stages listed at the top of `gym train --help`."},
    )
    finetuning_type: Literal["lora", "oft", "boft", "freeze", "full"] = field(
        default="lora",
        metadata={"help": "lora (low-rank adapters), oft/boft (orthogonal adapters: a learned rotation of each "
                  "weight, which keeps its spectrum), freeze (last layers only) or full."},
    )
    # LoRA and its variants (all through peft).
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: int | None = field(default=None, metadata={"help": "LoRA scaling alpha. Default: 2 x lora_rank."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input."})
    lora_target: str = field(
        default="all",
        metadata={"help": "Comma-separated module names for LoRA, or 'all' for every linear layer but the head."},
    )
    additional_target: str | None = field(
        default=None,
        metadata={"help": "Comma-separated modules trained in full and saved with the adapter (e.g. embed_tokens)."},
    )
    use_rslora: bool = field(default=False, metadata={"help": "Rank-stabilised LoRA (scale alpha/sqrt(r))."})
    use_dora: bool = field(default=False, metadata={"help": "Weight-decomposed LoRA (DoRA)."})
    pissa_init: bool = field(default=False, metadata={"help": "Initialise LoRA from principal singular vectors."})
    pissa_iter: int = field(
        default=16, metadata={"help": "Fast-SVD iterations for PiSSA; -1 uses a full SVD."}
    )
    loftq_init: bool = field(
        default=False,
        metadata={"help": "QLoRA: start the adapter at the base's 4-bit rounding error (LoftQ), so the quantized base "
                  "plus the adapter starts near the original model. The adapter then belongs to the 4-bit base: "
                  "chat with it under the same quantization_bit. Needs quantization_bit: 4 (bnb)."},
    )
    pissa_convert: bool = field(
        default=True,
        metadata={"help": "PiSSA: save the adapter converted to plain LoRA for the original base (Gym always does; "
                  "an unconverted one would need the residual model, which is not saved)."},
    )
    loraplus_lr_ratio: float | None = field(
        default=None, metadata={"help": "LoRA+: learning rate of B = ratio x learning rate of A."}
    )
    loraplus_lr_embedding: float = field(default=1e-6, metadata={"help": "LoRA+ learning rate for embedding adapters."})
    # Orthogonal fine-tuning (peft OFT/BOFT).
    oft_rank: int = field(
        default=0, metadata={"help": "OFT: number of orthogonal blocks per weight (0: derived from oft_block_size)."})
    oft_block_size: int = field(
        default=32, metadata={"help": "OFT: size of each orthogonal block (0: derived from oft_rank)."})
    oft_target: str = field(
        default="all", metadata={"help": "OFT/BOFT: comma-separated module names, or 'all' for every linear layer "
                                 "but the head."})
    boft_block_size: int = field(default=4, metadata={"help": "BOFT: size of each butterfly block."})
    boft_n_butterfly_factor: int = field(
        default=1, metadata={"help": "BOFT: butterfly factors (1 = plain block-diagonal OFT)."})
    # Loss.
    use_dft_loss: bool = field(
        default=False,
        metadata={"help": "sft/pt: Dynamic Fine-Tuning (Wu et al., 2025): each token's loss is weighted by its own "
                  "probability (held constant), which damps the pull of tokens the model finds unlikely."},
    )
    # Freeze tuning.
    freeze_trainable_layers: int = field(
        default=2,
        metadata={"help": "Number of trainable layers: positive = the last n, negative = the first n."},
    )
    freeze_trainable_modules: str = field(
        default="all", metadata={"help": "Comma-separated module names trained inside those layers, or 'all'."}
    )
    use_llama_pro: bool = field(
        default=False,
        metadata={"help": "LLaMA Pro (block expansion): train freeze_trainable_layers layers spread evenly through "
                  "the model (the last of each equal stretch), as added by expanding a model; finetuning_type freeze."},
    )
    freeze_extra_modules: str | None = field(
        default=None, metadata={"help": "Comma-separated modules outside the layers to train too (e.g. embed_tokens)."}
    )
    # Vision-language models: which parts train (LLaMA-Factory's keys and defaults).
    freeze_vision_tower: bool = field(
        default=True, metadata={"help": "Keep the vision (and audio) encoder frozen; false trains it too (LoRA on "
                                        "its layers under finetuning_type lora)."})
    freeze_multi_modal_projector: bool = field(
        default=True, metadata={"help": "Keep the projector from the encoder into the language model frozen; false "
                                        "trains it in full (saved with the adapter under lora)."})
    freeze_language_model: bool = field(
        default=False, metadata={"help": "Keep the language model frozen (train only the unfrozen vision parts)."})
    # Delta compression of the result (gym.delta): delta.safetensors next to the trained model.
    delta_compression: Literal["bitdelta", "int8", "int4", "int2", "ternary", "binary"] | None = field(
        default=None,
        metadata={"help": "At the end of training, also store the result as a compressed delta from its base."},
    )
    delta_group_size: int | None = field(
        default=None, metadata={"help": "Delta compression: one scale per this many weights of a row."}
    )
    delta_distill_steps: int = field(
        default=200, metadata={"help": "bitdelta: scale-distillation steps on the training data (0: none)."}
    )
    delta_safety_threshold: float | None = field(
        default=None, metadata={"help": "bitdelta: a matrix whose 1-bit relative error exceeds this is kept at int8."}
    )
    delta_enable_deltasoup: bool = field(
        default=False, metadata={"help": "Mark the delta as contributable to a DeltaSoup (recorded in the file)."}
    )
    # Evaluation of the result (gym.eval), written into the run folder.
    eval_tasks: list[str] | None = field(
        default=None,
        metadata={"help": "After training, run these `gym eval` tasks (mc_demo, arithmetic, mc:<data>, ppl:<data>, "
                  "gen:<data>, lm_eval:<tasks>) on the result and, once (cached), on the base."},
    )
    # Outputs.
    plot_loss: bool = field(default=False, metadata={"help": "Save training_loss.png in the output folder."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Allow writing over a finished model in output_dir (otherwise that is an error)."},
    )

    def validate(self, args: TrainArgs[Any]) -> None:
        super().validate(args)
        if self.lora_rank <= 0:
            raise ConfigError(f"'lora_rank' must be positive, got {self.lora_rank}.")
        # peft takes these and trains an adapter that changes nothing (alpha 0 scales it away) or fails after the
        # model has loaded (dropout outside [0, 1), no target).
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise ConfigError(f"'lora_alpha' must be positive, got {self.lora_alpha} (unset: 2 x lora_rank).")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"'lora_dropout' must be in [0, 1), got {self.lora_dropout}.")
        if self.loraplus_lr_ratio is not None and self.loraplus_lr_ratio <= 0:
            raise ConfigError(f"'loraplus_lr_ratio' must be positive (typically 16), got {self.loraplus_lr_ratio}.")
        if self.finetuning_type == "lora" and not split_names(self.lora_target):
            raise ConfigError("'lora_target' is empty: name the modules (e.g. q_proj,v_proj) or use 'all'.")
        if self.finetuning_type != "lora":
            lora_only = [k for k in ("use_dora", "use_rslora", "pissa_init", "loftq_init") if getattr(self, k)]
            if self.loraplus_lr_ratio is not None:
                lora_only.append("loraplus_lr_ratio")
            if lora_only:
                raise ConfigError(f"'{lora_only[0]}' needs finetuning_type: lora (got '{self.finetuning_type}').")
        # Keys of another finetuning type would be read by nothing: the run trained without what they asked for.
        freeze_keys = [k for k, default in (("freeze_trainable_layers", 2), ("freeze_trainable_modules", "all"),
                                            ("freeze_extra_modules", None)) if getattr(self, k) != default]
        if freeze_keys and self.finetuning_type != "freeze":
            hint = (" (with lora, additional_target trains whole modules beside the adapter)"
                    if self.finetuning_type == "lora" else "")
            raise ConfigError(f"'{freeze_keys[0]}' picks what trains under finetuning_type: freeze, and this run is "
                              f"{self.finetuning_type}{hint}; remove it or set finetuning_type: freeze.")
        if self.additional_target and self.finetuning_type != "lora":
            instead = {"freeze": "; with freeze, freeze_extra_modules trains whole modules",
                       "full": "; full trains every module already"}.get(self.finetuning_type, "")
            raise ConfigError(f"'additional_target' trains whole modules beside a LoRA adapter: it needs "
                              f"finetuning_type: lora (got '{self.finetuning_type}'){instead}.")
        if self.pissa_iter < -1:
            raise ConfigError(f"'pissa_iter' is a number of fast-SVD iterations (0 or more), or -1 for a full SVD; "
                              f"got {self.pissa_iter}.")
        if not self.pissa_convert:
            raise ConfigError("'pissa_convert: false' would save a PiSSA adapter that only applies to the residual "
                              "model, which Gym does not keep; leave it true (then it applies to the original base).")
        if self.use_llama_pro and self.finetuning_type != "freeze":
            raise ConfigError("'use_llama_pro' picks which layers train under finetuning_type: freeze.")
        if self.use_dft_loss and self.stage not in ("sft", "pt"):
            raise ConfigError(f"'use_dft_loss' reweights the language-model loss of sft/pt, not stage {self.stage}.")
        if self.finetuning_type not in ADAPTER_TYPES and args.model.adapter_name_or_path:
            raise ConfigError(f"'adapter_name_or_path' continues training an adapter: it needs finetuning_type "
                              f"lora, oft or boft (got '{self.finetuning_type}').")
        if self.finetuning_type == "oft" and (self.oft_rank == 0) == (self.oft_block_size == 0):
            raise ConfigError(f"OFT takes exactly one of 'oft_rank' and 'oft_block_size' (the other 0); got "
                              f"oft_rank {self.oft_rank}, oft_block_size {self.oft_block_size}.")
        if self.loraplus_lr_ratio is not None and self.chosen():
            raise ConfigError(f"'loraplus_lr_ratio' builds its own AdamW; it cannot be combined with "
                              f"'{self.chosen()[0]}'.")
        initialisations = [k for k in ("use_dora", "pissa_init", "loftq_init") if getattr(self, k)]
        if len(initialisations) > 1:
            raise ConfigError(f"'{initialisations[0]}' and '{initialisations[1]}' cannot be combined; choose one "
                              "LoRA initialisation.")
        if self.loftq_init and (args.model.quantization_bit, args.model.quantization_method) != (4, "bnb"):
            raise ConfigError("'loftq_init' initialises the adapter from a 4-bit base's rounding error: it needs "
                              "quantization_bit: 4 with quantization_method: bnb.")
        extras = [k for k in ("delta_safety_threshold", "delta_enable_deltasoup", "delta_group_size")
                  if getattr(self, k)]
        if extras and not self.delta_compression:
            raise ConfigError(f"'{extras[0]}' shapes the delta stored after training: set delta_compression too.")
        if self.delta_safety_threshold is not None and self.delta_compression != "bitdelta":
            raise ConfigError("'delta_safety_threshold' applies to delta_compression: bitdelta.")
        if self.delta_compression and self.stage == "rm":
            raise ConfigError("delta_compression applies to language models; a reward model (stage: rm) is not one.")
