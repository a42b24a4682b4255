"""`gym export --format gguf-lora`: the adapter, applied by llama.cpp's rule (W + alpha/r * B A, on the GGUF base),
gives the merged model's GGUF weights."""

from __future__ import annotations

import logging

import gguf
import numpy as np
import pytest

from gym.cli import main
from gym.workflows.training import run_exp


def _tensors(path):
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
            for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("options", [{}, {"use_rslora": True, "lora_alpha": 32}])
def test_adapter_applied_as_llama_cpp_does_equals_the_merged_export(train_config, tiny_model_dir, tmp_path, options):
    result = run_exp(train_config(lora_target="all", lora_rank=4, **options))
    out = tmp_path / "out"
    assert main(["export", "--output_dir", result.output_dir, "--format", "gguf-lora", "--export_dir",
                 str(out / "adapter.gguf")]) == 0
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--format", "gguf", "--quantization", "f32",
                 "--export_dir", str(out / "base.gguf")]) == 0
    assert main(["export", "--output_dir", result.output_dir, "--format", "gguf", "--quantization", "f32",
                 "--export_dir", str(out / "merged.gguf")]) == 0
    reader = gguf.GGUFReader(out / "adapter.gguf")
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["general.architecture"] == "llama"
    alpha = fields["adapter.lora.alpha"]
    adapter, base, merged = _tensors(out / "adapter.gguf"), _tensors(out / "base.gguf"), _tensors(out / "merged.gguf")
    targets = {name.removesuffix(".lora_a") for name in adapter if name.endswith(".lora_a")}
    assert len(targets) == 2 * 7  # every linear of both layers
    for name in merged:
        if name in targets:
            a, b = adapter[name + ".lora_a"], adapter[name + ".lora_b"]
            rank = a.shape[0]
            applied = base[name] + alpha / rank * (b @ a)
            assert np.allclose(applied, merged[name], atol=1e-5), name
            assert not np.allclose(base[name], merged[name], atol=1e-4), name  # training did change it
        else:
            assert np.array_equal(base[name], merged[name]), name


def test_adapters_that_gguf_cannot_carry_are_refused(train_config, tmp_path, capsys):
    result = run_exp(train_config(use_dora=True))
    assert main(["export", "--output_dir", result.output_dir, "--format", "gguf-lora", "--export_dir",
                 str(tmp_path / "a.gguf")]) == 2
    assert "DoRA adapter, which a GGUF adapter cannot carry" in capsys.readouterr().err
    assert not (tmp_path / "a.gguf").exists()


def test_a_q8_0_adapter_says_once_which_matrices_are_f16(trained_run, tmp_path, caplog):
    # Each B (rows of the rank's width, under q8_0's 32) logged a warning of its own, all alike.
    caplog.set_level(logging.INFO)
    out = tmp_path / "adapter.gguf"
    assert main(["export", "--output_dir", str(trained_run), "--format", "gguf-lora", "--type", "q8_0",
                 "--export_dir", str(out)]) == 0
    stored = [t for t in gguf.GGUFReader(out).tensors if t.tensor_type == gguf.GGMLQuantizationType.F16]
    rank = int(stored[0].shape[0])  # GGUF lists a matrix's shape row width first
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "another type" in r.msg]
    assert warnings == [f"GGUF adapter q8_0: {len(stored)} tensors are stored in another type than asked, their rows "
                        "not a whole number of its blocks (256 values for a K type, 32 for the other quantized types): "
                        f"{len(stored)} Q8_0 -> F16 (rows of {rank})."]
    assert all(t.name.endswith(".lora_b") for t in stored)
