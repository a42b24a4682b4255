"""`gym export --format onnx`: the merged model as an ONNX decoder with a KV cache, through torch's exporter.

The graph (model.onnx, weights beside it when over 2 GB):
    inputs   input_ids [batch, seq] int64, attention_mask [batch, past + seq] int64,
             position_ids [batch, seq] int64, past_key_values [2 * layers, batch, kv_heads, past, head_dim]
    outputs  logits [batch, seq, vocab], present_key_values [2 * layers, batch, kv_heads, past + seq, head_dim]
Keys and values of layer i are rows 2i and 2i + 1 of the cache tensors; a first call passes past = 0. The
folder also holds config.json, generation_config.json and the tokenizer with the trained chat template, so
onnxruntime-genai or a hand-written loop can prompt the model as Gym did. After writing, the export runs one
prompt through onnxruntime (when installed) and compares the logits with PyTorch's (at most 1e-4 of the largest
logit apart, or nothing is written).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from gym.core.errors import ConfigError, GymError
from gym.core.files import building_folder, check_free_space, make_folder, refuse_overwrite, write_manifest
from gym.data.chat_jinja import jinja_chat_template
from gym.export.config import ExportArguments
from gym.export.hf import load_merged
from gym.export.spelling import option

logger = logging.getLogger(__name__)

INPUTS = ["input_ids", "attention_mask", "position_ids", "past_key_values"]
OUTPUTS = ["logits", "present_key_values"]


class CachedDecoder(torch.nn.Module):
    """A causal LM with its KV cache as one stacked tensor in and out (ONNX graphs take tensors, not cache objects)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.num_hidden_layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                past_key_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past_key_values[2 * i], past_key_values[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return out.logits, torch.stack(present)


def cache_shape(config: Any, batch: int, past: int) -> tuple[int, ...]:
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers, batch, kv_heads, past, head_dim


def example_inputs(config: Any, batch: int, past: int, seq: int) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    mask = torch.ones(batch, past + seq, dtype=torch.long)
    positions = torch.arange(past, past + seq).repeat(batch, 1)
    return ids, mask, positions, torch.randn(cache_shape(config, batch, past))


def _require_exporter() -> None:
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"ONNX export needs {' and '.join(missing)} (torch's exporter): "
                          "pip install 'zoo-gym[onnx]'.")


def _export_graph(decoder: CachedDecoder, path: Path) -> None:
    batch, seq, past, total = (torch.export.Dim(name) for name in ("batch", "seq", "past", "total"))
    dynamic = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, {1: batch, 3: past})
    program = torch.onnx.export(decoder, example_inputs(decoder.model.config, 2, 3, 4), dynamo=True,
                                dynamic_shapes=dynamic, input_names=INPUTS, output_names=OUTPUTS)
    if program is None:
        raise GymError("torch.onnx.export returned no program.")
    big = sum(p.numel() * p.element_size() for p in decoder.parameters()) > 1.8e9  # protobuf's 2 GB limit
    program.save(str(path), external_data=big)


def check_with_onnxruntime(decoder: CachedDecoder, path: Path) -> float | None:
    """The largest logit difference between onnxruntime and PyTorch on a prompt with a cache, relative to the largest
    logit (None: no onnxruntime). float32 kernels that sum in another order differ by ~1e-7 of the scale."""
    if importlib.util.find_spec("onnxruntime") is None:
        logger.info("onnxruntime is not installed: the ONNX file was not run after export.")
        return None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = example_inputs(decoder.model.config, 1, 2, 5)
    with torch.no_grad():
        expected = decoder(*inputs)[0]
    got = session.run(["logits"], {name: t.numpy() for name, t in zip(INPUTS, inputs)})[0]
    return float((torch.from_numpy(got) - expected).abs().max() / expected.abs().max().clamp(min=1.0))


def export_onnx(args: ExportArguments, config: dict[str, Any]) -> Path:
    assert args.export_dir is not None
    _require_exporter()
    out = Path(args.export_dir)
    how = option("export_overwrite", True)
    refuse_overwrite(out, args.export_overwrite, how, folder=True)
    merged = load_merged(config, args.delta, args.export_type == "bitdelta")
    model, tokenizer, chat = merged.model, merged.tokenizer, merged.chat
    model.config.use_cache = True
    decoder = CachedDecoder(model.float().eval())
    make_folder(out.parent)
    check_free_space(out, sum(p.numel() * 4 for p in model.parameters()))
    if chat.template is not None:
        tokenizer.chat_template = jinja_chat_template(chat.template, tokenizer.eos_token or "", chat.default_system,
                                                      chat.enable_thinking, chat.tool_format)
    with building_folder(out, args.export_overwrite, how) as tmp:
        _export_graph(decoder, tmp / "model.onnx")
        difference = check_with_onnxruntime(decoder, tmp / "model.onnx")
        if difference is not None and difference > 1e-4:
            raise GymError(f"The ONNX graph's logits differ from PyTorch's by {difference:.2e} of their largest value: "
                           "not written.")
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp, {"what": "onnx", "made_by": "gym export", "inputs": INPUTS, "outputs": OUTPUTS,
                             "checked_max_relative_logit_diff": difference}, indent=1)
    logger.info("ONNX export checked with onnxruntime: largest logit difference %s of the largest logit.",
                "not run" if difference is None else f"{difference:.2e}")
    return out
