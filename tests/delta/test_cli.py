"""`gym delta compress | apply | inspect | eval` on the tiny model, and their errors (exit 2, one message)."""

from __future__ import annotations

import pytest
import torch

from gym.cli import main


def test_compress_apply_inspect_eval(gaussian_finetune, tiny_model_dir, tmp_path, data_dir, capsys):
    delta = tmp_path / "d.safetensors"
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--method", "bitdelta", "--distill-steps", "3", "--seq-len", "32", "--distill-batch-size", "2",
                 "--calibration", "tiny_alpaca", "--dataset-dir", str(data_dir), "-o", str(delta)]) == 0
    out = capsys.readouterr().out
    assert f"Wrote {delta}" in out and "smaller than the fine-tune in fp16" in out and "Scale distillation" in out

    assert main(["delta", "inspect", str(delta)]) == 0
    out = capsys.readouterr().out
    assert "bitdelta delta (format v1)" in out and "model.layers.0.self_attn.q_proj.weight" in out
    assert "rel. error" in out and "scale distillation: 3 steps" in out

    applied = tmp_path / "applied"
    assert main(["delta", "apply", "--base", str(tiny_model_dir), "--delta", str(delta), "-o", str(applied)]) == 0
    assert (applied / "model.safetensors").is_file()

    assert main(["delta", "eval", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--delta", str(delta), "--dataset", "tiny_alpaca", "--dataset-dir", str(data_dir),
                 "--max-samples", "8"]) == 0
    out = capsys.readouterr().out
    assert "eval loss on 8 rows of tiny_alpaca: base" in out and "gain kept" in out


@pytest.mark.parametrize("method", ["int8", "int4", "int2", "ternary", "binary"])
def test_compress_with_each_deltaquant_method(method, gaussian_finetune, tiny_model_dir, tmp_path, capsys):
    delta = tmp_path / f"{method}.safetensors"
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--method", method, "-o", str(delta)]) == 0
    assert delta.is_file()


def test_errors_exit_2_with_one_message_and_write_nothing(gaussian_finetune, make_finetune, tiny_model_dir, tmp_path,
                                                          capsys):
    delta = tmp_path / "d.safetensors"
    # bitdelta distils by default: without calibration data that is an error before any model loads.
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "-o", str(delta)]) == 2
    err = capsys.readouterr().err
    assert "needs calibration data" in err and "Traceback" not in err and not delta.exists()

    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--distill-steps", "0", "-o", str(delta)]) == 0
    other = make_finetune(lambda name, p: p.mul_(1.01), "other-base")
    out = tmp_path / "applied"
    assert main(["delta", "apply", "--base", str(other), "--delta", str(delta), "-o", str(out)]) == 2
    assert "different base model" in capsys.readouterr().err and not out.exists()

    with pytest.raises(SystemExit) as exit_info:  # argparse: an unknown method
        main(["delta", "compress", "--base", "b", "--finetuned", "f", "--method", "int3", "-o", "x"])
    assert exit_info.value.code == 2


def test_training_config_compresses_the_result(train_config, tmp_path):
    from gym.delta.format import load_delta
    from gym.train.run import run_exp

    result = run_exp(train_config(delta_compression="bitdelta", delta_distill_steps=2, max_steps=2))
    entries, header = load_delta(result.metrics["delta_file"])
    assert header["method"] == "bitdelta" and header["distillation"]["steps"] == 2
    assert entries and all("lora" not in name for name in entries)  # deltas of the merged weights

    quantized = run_exp(train_config(delta_compression="int4", max_steps=1, overwrite_output_dir=True))
    entries, header = load_delta(quantized.metrics["delta_file"])
    assert header["method"] == "int4" and all(torch.is_tensor(e) or e.method.value == "int4" for e in entries.values())
