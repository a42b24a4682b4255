"""`gym export --format onnx`: onnxruntime runs the graph with the logits PyTorch gives, with and without a cache,
and a greedy loop through the ONNX cache decodes the tokens transformers' generate decodes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from gym.cli import main
from gym.export.onnx import cache_shape

ort = pytest.importorskip("onnxruntime", reason="the ONNX check needs onnxruntime: pip install 'zoo-gym[onnx]'")


def _session(folder):
    return ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])


def _run(session, ids, past, start):
    batch, seq = ids.shape
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((batch, start + seq), dtype=np.int64),
             "position_ids": np.arange(start, start + seq, dtype=np.int64)[None].repeat(batch, 0),
             "past_key_values": past}
    return session.run(None, feeds)


def test_lora_export_runs_in_onnxruntime_as_in_pytorch(trained_run, tmp_path, tokenizer):
    result = SimpleNamespace(output_dir=str(trained_run))
    out = tmp_path / "onnx"
    assert main(["export", "--output_dir", result.output_dir, "--format", "onnx", "--export_dir", str(out)]) == 0
    manifest = json.loads((out / "gym_manifest.json").read_text())
    assert manifest["checked_max_relative_logit_diff"] < 1e-5
    reference = AutoModelForCausalLM.from_pretrained(_merged(result.output_dir, tmp_path)).eval()
    session = _session(out)
    ids = np.array([tokenizer.encode("The quick brown fox jumps over")], dtype=np.int64)
    empty = np.zeros(cache_shape(reference.config, 1, 0), dtype=np.float32)
    logits, present = _run(session, ids, empty, 0)  # without a cache
    with torch.no_grad():
        expected = reference(torch.from_numpy(ids)).logits.numpy()
    assert np.abs(logits - expected).max() < 1e-4
    # with a cache: the prompt minus its last token, then the last token alone
    _, head = _run(session, ids[:, :-1], empty, 0)
    last, _ = _run(session, ids[:, -1:], head, ids.shape[1] - 1)
    assert np.abs(last[0, -1] - expected[0, -1]).max() < 1e-4
    # greedy decoding through the cache equals generate
    tokens, past, start = ids, empty, 0
    produced = []
    for _ in range(8):
        logits, past = _run(session, tokens, past, start)
        start += tokens.shape[1]
        tokens = np.array([[int(logits[0, -1].argmax())]])
        produced.append(int(tokens[0, 0]))
    with torch.no_grad():
        generated = reference.generate(torch.from_numpy(ids), max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert produced == generated[0, ids.shape[1]:].tolist()
    assert present.shape[3] == ids.shape[1]


def _merged(run_dir, tmp_path):
    out = tmp_path / "merged"
    assert main(["export", "--output_dir", run_dir, "--export_dir", str(out)]) == 0
    return out
