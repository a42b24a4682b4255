"""llama.cpp itself reads what `gym export` writes (opt-in: `make test-llamacpp` installs llama-cpp-python, which
builds llama.cpp from source; without it these tests skip).

- The embedded model at f32 and f16: llama.cpp tokenizes like the HF tokenizer and decodes the same greedy tokens as
  transformers running the same file's weights, for 5 prompts.
- q8_0 and q4_k_m: llama.cpp's perplexity stays within a stated margin of f16's, and agrees with transformers'
  reading of the same file (so both readers decode our quantized blocks alike).
- A GGUF LoRA adapter loaded with llama.cpp's lora_path decodes as the merged model does.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from gym.export.run import run_export

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                                   reason="llama-cpp-python is not installed: make test-llamacpp")]

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "Water boils at",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]


def _llama(path: Path, **options):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=2, verbose=False, **options)


def _greedy_llama(llm, ids: list[int], stops: set[int], n: int = 16) -> list[int]:
    llm.reset()
    out: list[int] = []
    for token in llm.generate(ids, temp=0.0, top_k=1):
        out.append(token)
        if len(out) == n or token in stops:
            break
    return out


def _greedy_hf(model, ids: list[int], n: int = 16) -> list[int]:
    with torch.no_grad():
        return model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()


def _export(tmp_path: Path, quantization: str, **keys) -> Path:
    return run_export({"model_name_or_path": "smollm2-135m", "export_dir": str(tmp_path), "export_format": "gguf",
                       "export_type": quantization, **keys})


def _text_ids(tokenizer) -> list[int]:
    rows = json.loads((REPO / "data" / "alpaca_en_demo.json").read_text())
    return tokenizer.encode("\n\n".join(f"{r['instruction']}\n{r['output']}" for r in rows))[:512]


def _perplexity_llama(llm, ids: list[int]) -> float:
    llm.reset()
    llm.eval(ids)
    scores = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
    top = scores.max(1)
    log_z = top + np.log(np.exp(scores - top[:, None]).sum(1))
    return math.exp(float((log_z - scores[np.arange(len(ids) - 1), ids[1:]]).mean()))


def _perplexity_hf(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return math.exp(float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))))


@pytest.mark.parametrize("quantization", ["f32", "f16"])
def test_llama_cpp_decodes_the_exported_model_as_transformers_does(tmp_path, tokenizer, quantization):
    path = _export(tmp_path, quantization)
    llm = _llama(path)
    same_weights = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    stops = {tokenizer.eos_token_id, *tokenizer.all_special_ids}
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids, prompt
        reference = _greedy_hf(same_weights, ids)
        assert _greedy_llama(llm, ids, stops)[:len(reference)] == reference, prompt


def test_quantized_files_keep_perplexity_in_llama_cpp(tmp_path, tokenizer):
    ids = _text_ids(tokenizer)
    f16 = _perplexity_llama(_llama(_export(tmp_path, "f16"), logits_all=True), ids)
    # Margins from this model's measurements (docs/benchmarks.md): q8_0 -0.3%, q4_k_m +13.6% in llama.cpp.
    for quantization, margin in (("q8_0", 0.01), ("q4_k_m", 0.20)):
        path = _export(tmp_path, quantization)
        ours = _perplexity_llama(_llama(path, logits_all=True), ids)
        assert abs(ours / f16 - 1) < margin, (quantization, ours, f16)
        hf = _perplexity_hf(AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                 dtype=torch.float32), ids)
        assert abs(ours / hf - 1) < 0.02, (quantization, ours, hf)  # two readers, one file


def test_gguf_lora_in_llama_cpp_equals_the_merged_model(train_config, tmp_path, tokenizer):
    from gym.workflows.training import run_exp

    result = run_exp(train_config(lora_target="all", max_steps=5))
    base = run_export({"model_name_or_path": train_config()["model_name_or_path"],
                       "export_dir": str(tmp_path / "b.gguf"), "export_format": "gguf", "export_type": "f32"})
    merged = run_export({"output_dir": result.output_dir, "export_dir": str(tmp_path / "m.gguf"),
                         "export_format": "gguf", "export_type": "f32"})
    adapter = run_export({"output_dir": result.output_dir, "export_dir": str(tmp_path / "a.gguf"),
                          "export_format": "gguf-lora"})
    with_lora, merged_llm, base_llm = _llama(base, lora_path=str(adapter)), _llama(merged), _llama(base)
    changed = 0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        expected = _greedy_llama(merged_llm, ids, set(), n=12)
        assert _greedy_llama(with_lora, ids, set(), n=12) == expected, prompt
        changed += _greedy_llama(base_llm, ids, set(), n=12) != expected
    assert changed  # the adapter does change what the model says
