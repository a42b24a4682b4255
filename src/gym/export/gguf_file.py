"""A transformers causal LM as a GGUF file (llama.cpp's format), written with the `gguf` package's writer.

Architectures: the llama family (Llama, SmolLM, Mistral: arch `llama`) and Qwen2/Qwen3. What goes in:
- hyper-parameters under `<arch>.*` (context, widths, heads, RoPE base and scaling, norm epsilon);
- the tokenizer as llama.cpp reads a byte-level BPE one (`tokenizer.ggml.model = gpt2`): every token with
  its type (normal, control for special tokens, user-defined for other added tokens, unused for padding
  rows of the embedding), the merges, the special ids and the chat template (gguf.SpecialVocab reads
  those from the tokenizer folder), and the pre-tokenizer's name;
- tensors renamed with the gguf package's own HF -> GGUF map. For arch `llama` the q and k projections
  are permuted: transformers keeps each head's rotary pairs as two halves, llama.cpp's llama graph
  expects them interleaved (Qwen's graph uses the halves, so Qwen's are written as they are).
- 1-D tensors (norms, biases) stay F32. Every matrix takes the requested type, except in the K-quant presets
  (q4_k_m, q5_k_m, q6_k), which mix types per tensor as llama-quantize does (`mix_type`); their K types are
  written by gym.export.kquants.

The format is documented in the gguf package and llama.cpp's docs; this file is our own code on the
gguf package's writer and quantizers.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from gym.core.errors import ConfigError
from gym.export.kquants import quantize_k
from gym.export.spelling import option

logger = logging.getLogger(__name__)

ARCHES = {"llama": gguf.MODEL_ARCH.LLAMA, "mistral": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
          "qwen3": gguf.MODEL_ARCH.QWEN3}

Q = gguf.GGMLQuantizationType
# --type -> (the type of every matrix, general.file_type)
TYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (Q.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (Q.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    "q5_0": (Q.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "q5_1": (Q.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
    "q4_k_m": (Q.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
    "q5_k_m": (Q.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_M),
    "q6_k": (Q.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
}
K_TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# llama.cpp's substitutes for a K type when a row is not a whole number of 256-value super-blocks.
K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}

# llama.cpp picks its pre-tokenizer (the regex that splits text before BPE) by name. We name it from the
# model family and vocabulary, the facts that decide it for the families exported here.
_PRE_TOKENIZERS = {("llama", 49152): "smollm", ("llama", 128256): "llama-bpe", ("qwen2", None): "qwen2",
                   ("qwen3", None): "qwen2"}

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = (
    gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNUSED)


def arch_of(config: Any) -> gguf.MODEL_ARCH:
    return arch_for(getattr(config, "model_type", None))


def arch_for(model_type: str | None) -> gguf.MODEL_ARCH:
    """The GGUF architecture of a transformers model_type, or a ConfigError naming the ones written here."""
    arch = ARCHES.get(model_type or "")
    if arch is None:
        raise ConfigError(f"GGUF export supports {', '.join(sorted(ARCHES))} models; this one is "
                          f"{model_type or 'unknown'!r}. Export it with {option('export_format', 'hf')}.")
    return arch


def permute_for_llama(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's rows from transformers' rotary layout (first half, second half) to llama.cpp's (pairs)."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def pre_tokenizer(config: Any) -> str:
    key = (config.model_type if config.model_type != "mistral" else "llama", config.vocab_size)
    name = _PRE_TOKENIZERS.get(key) or _PRE_TOKENIZERS.get((key[0], None))
    if name is None:
        logger.warning("No llama.cpp pre-tokenizer is known for this %s tokenizer (vocab %d): writing 'default'.",
                       config.model_type, config.vocab_size)
    return name or "default"


def _write_hparams(writer: gguf.GGUFWriter, config: Any, name: str, file_type: gguf.LlamaFileType) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != config.hidden_size // heads or config.model_type == "qwen3":  # Qwen3's readers require it
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is not None:
        writer.add_rope_freq_base(float(theta))
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope.get("original_max_position_embeddings") or 0))
    elif kind not in ("default", "llama3"):  # llama3's factors go in a rope_freqs tensor (not written here)
        raise ConfigError(f"GGUF export cannot carry rope_scaling of type {kind!r}; export with "
                          f"{option('export_format', 'hf')}.")
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _write_vocab(writer: gguf.GGUFWriter, tokenizer: Any, tokenizer_dir: Path, config: Any) -> None:
    """Byte-level BPE tokens in id order; the embedding may have more rows than the tokenizer has tokens."""
    if not getattr(tokenizer, "is_fast", False) or tokenizer.backend_tokenizer.model.__class__.__name__ != "BPE":
        raise ConfigError("GGUF export writes byte-level BPE tokenizers (SmolLM, Llama 3, Qwen, Mistral Tekken); "
                          f"this tokenizer is not one. Export with {option('export_format', 'hf')}.")
    vocab = tokenizer.get_vocab()
    by_id = {i: token for token, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []
    for i in range(config.vocab_size):
        if i in added:
            tokens.append(added[i].content)
            types.append(TOKEN_CONTROL if added[i].special else TOKEN_USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer(config))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=config.vocab_size).add_to_gguf(writer, quiet=True)


def _tensors(model: Any, arch: gguf.MODEL_ARCH) -> Iterator[tuple[str, torch.Tensor]]:
    config = model.config
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue  # llama.cpp uses token_embd when output.weight is absent
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigError(f"GGUF export: no GGUF name for the tensor {hf_name!r}.")
        tensor = tensor.detach().float().cpu()
        if arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith("q_proj.weight"):
            tensor = permute_for_llama(tensor, config.num_attention_heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and hf_name.endswith("k_proj.weight"):
            tensor = permute_for_llama(tensor, kv_heads)
        yield name, tensor


def _more_bits(layer: int, layers: int) -> bool:
    """The layers whose attn_v and ffn_down a _M mix keeps at Q6_K: the first and last eighth, and every third."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def preset_type(gguf_type: str, name: str, layers: int, tied: bool) -> gguf.GGMLQuantizationType:
    """The K type llama-quantize's Q4_K_M / Q5_K_M / Q6_K give one matrix, before its rows are looked at:
    - the output matrix (the embedding, when tied) gets Q6_K;
    - in the _M mixes, attn_v and ffn_down get Q6_K in the layers `_more_bits` picks;
    - everything else gets the preset's type."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    if gguf_type.endswith("_m") and name.startswith("blk."):
        layer = int(name.split(".")[1])
        if (".attn_v." in name or ".ffn_down." in name) and _more_bits(layer, layers):
            return Q.Q6_K
    return TYPES[gguf_type][0]


def mix_type(gguf_type: str, name: str, row: int, layers: int, tied: bool) -> gguf.GGMLQuantizationType:
    """The type of one matrix in a K-quant file: its `preset_type`, unless that is a K type whose 256-value blocks
    its rows do not fill, which falls back to Q5_0 (for Q4_K), Q5_1 (Q5_K) or Q8_0 (Q6_K) as in llama-quantize."""
    chosen = preset_type(gguf_type, name, layers, tied)
    return K_FALLBACK[chosen] if chosen in K_TYPES and row % 256 else chosen


class Fallbacks:
    """The matrices of one export stored in another type than the one asked for, because their rows do not fill
    its blocks: counted, for one warning at the end. llama-quantize writes a line per tensor, which buries the rest
    of the log (a 30-layer model whose width is not a multiple of 256 takes a fallback in most of its matrices)."""

    def __init__(self) -> None:
        self.count: Counter[tuple[gguf.GGMLQuantizationType, gguf.GGMLQuantizationType]] = Counter()
        self.widths: defaultdict[tuple[gguf.GGMLQuantizationType, gguf.GGMLQuantizationType], set[int]] = \
            defaultdict(set)

    def note(self, tensor: torch.Tensor, asked: gguf.GGMLQuantizationType,
             stored: gguf.GGMLQuantizationType) -> None:
        if tensor.ndim >= 2 and stored != asked:  # a 1-D tensor is F32 by design, not for want of blocks
            self.count[asked, stored] += 1
            self.widths[asked, stored].add(int(tensor.shape[-1]))

    def warn(self, what: str) -> None:
        if not self.count:
            return
        moves = []
        for (asked, stored), n in sorted(self.count.items(), key=lambda item: (-item[1], item[0])):
            widths = ", ".join(map(str, sorted(self.widths[asked, stored])))
            moves.append(f"{n} {asked.name} -> {stored.name} (rows of {widths})")
        logger.warning("%s: %d tensors are stored in another type than asked, their rows not a whole number of its "
                       "blocks (256 values for a K type, 32 for the other quantized types): %s.",
                       what, sum(self.count.values()), "; ".join(moves))


def encode_tensor(tensor: torch.Tensor, qtype: gguf.GGMLQuantizationType
                  ) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """The bytes (or array) to store and their type: 1-D tensors stay F32; a matrix whose rows do not fill whole
    blocks of the type is stored as F16 (the caller counts it in its `Fallbacks`)."""
    data = tensor.numpy().astype(np.float32)
    if data.ndim < 2 or qtype == Q.F32:
        return data, Q.F32
    if qtype == Q.F16:
        return data.astype(np.float16), Q.F16
    if qtype in K_TYPES:
        return quantize_k(data, qtype.name), qtype
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if data.shape[-1] % block:
        return data.astype(np.float16), Q.F16
    return gguf.quants.quantize(data, qtype), qtype


def write_gguf(model: Any, tokenizer: Any, tokenizer_dir: Path, path: Path, gguf_type: str, name: str) -> Path:
    """The GGUF file at `path` (the caller renames it into place)."""
    if gguf_type not in TYPES:
        raise ConfigError(f"Unknown GGUF type {gguf_type!r}; choose one of {', '.join(TYPES)}.")
    qtype, file_type = TYPES[gguf_type]
    arch = arch_of(model.config)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    _write_hparams(writer, model.config, name, file_type)
    _write_vocab(writer, tokenizer, tokenizer_dir, model.config)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    fallbacks = Fallbacks()
    for tensor_name, tensor in _tensors(model, arch):
        asked = wanted = qtype
        if qtype in K_TYPES and tensor.ndim == 2:
            asked = preset_type(gguf_type, tensor_name, model.config.num_hidden_layers, tied)
            wanted = mix_type(gguf_type, tensor_name, tensor.shape[-1], model.config.num_hidden_layers, tied)
        data, stored = encode_tensor(tensor, wanted)
        fallbacks.note(tensor, asked, stored)
        writer.add_tensor(tensor_name, data, raw_dtype=stored if stored not in (Q.F32, Q.F16) else None)
    fallbacks.warn(f"GGUF {gguf_type}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
