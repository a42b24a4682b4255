"""`gym delta compress | apply | inspect | eval` on the tiny model, and their errors (exit 2, one message)."""

from __future__ import annotations

import pytest
import torch

from gym.cli import main

from .conftest import block_linears


def test_compress_apply_inspect_eval(gaussian_finetune, tiny_model_dir, tmp_path, data_dir, capsys):
    delta = tmp_path / "d.safetensors"
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--method", "bitdelta", "--distill-steps", "3", "--seq-len", "32", "--distill-batch-size", "2",
                 "--calibration", "tiny_alpaca", "--dataset-dir", str(data_dir), "-o", str(delta)]) == 0
    captured = capsys.readouterr()
    assert f"Wrote {delta}" in captured.out and "smaller than the fine-tune in fp16" in captured.out
    assert (captured.out + captured.err).count("Scale distillation") <= 1  # said once (the distiller's own line)

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


# Per method: the bits a code takes, and the most a rebuilt block linear may differ from the fine-tune relative
# to what the fine-tune changed (||applied - finetuned|| / ||finetuned - base||). Measured on the Gaussian
# fine-tune: int8 0.006, int4 0.12, int2 0.76 (symmetric int2 has three levels, -r, 0, r with r = max|x|),
# ternary 0.44, binary 0.61 (sign x mean magnitude of a Gaussian: sqrt(1 - 2/pi) = 0.60).
METHODS = {"int8": (8, 0.01), "int4": (4, 0.15), "int2": (2, 0.85), "ternary": (2, 0.5), "binary": (1, 0.65)}


@pytest.mark.parametrize("method", list(METHODS))
def test_compress_with_each_deltaquant_method(method, gaussian_finetune, tiny_model_dir, tmp_path, capsys, models):
    from gym.core.files import human_bytes
    from gym.delta.format import file_size, load_delta, read_header
    from gym.delta.tensor_quant import Encoded

    bits, max_error = METHODS[method]
    delta = tmp_path / f"{method}.safetensors"
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--method", method, "-o", str(delta)]) == 0
    assert f"Wrote {delta}" in capsys.readouterr().out

    # The file holds one entry per parameter the fine-tune changed, each coded with `bits` bits per value.
    base, finetuned = models(tiny_model_dir), models(gaussian_finetune)
    changed = block_linears(finetuned)
    header = read_header(delta)
    assert header["method"] == method and set(header["entries"]) == set(changed)
    assert all(spec["encoding"] == method for spec in header["entries"].values())
    entries, _ = load_delta(delta)
    assert all(isinstance(e, Encoded) and e.method.value == method for e in entries.values())
    numel = sum(p.numel() for p in changed.values())
    codes = sum(e.tensors["codes"].numel() * e.tensors["codes"].element_size() for e in entries.values())
    scales = sum(e.tensors["scale"].numel() * e.tensors["scale"].element_size() for e in entries.values())
    assert codes == numel * bits // 8
    assert scales <= 2 * sum(p.shape[0] for p in changed.values())  # one fp16 scale per output channel
    assert file_size(delta) < codes + scales + 16_000  # and a JSON header, nothing else

    assert main(["delta", "inspect", str(delta)]) == 0
    out = capsys.readouterr().out
    assert f"{delta}: {method} delta (format v1), {human_bytes(file_size(delta))} on disk" in out
    assert f"changed parameters: {len(changed)};" in out
    assert "model.layers.0.self_attn.q_proj.weight" in out and f" {method} " in out

    applied = tmp_path / "applied"
    assert main(["delta", "apply", "--base", str(tiny_model_dir), "--delta", str(delta), "-o", str(applied)]) == 0
    rebuilt = dict(models(applied).named_parameters())
    base_params = dict(base.named_parameters())
    for name, tuned in finetuned.named_parameters():
        if name not in changed:  # untouched by the fine-tune: the base's own values
            assert torch.equal(rebuilt[name], base_params[name]), name
            continue
        error = (rebuilt[name] - tuned).norm() / (tuned - base_params[name]).norm()
        assert error < max_error, (name, float(error))


def test_errors_exit_2_with_one_message_and_write_nothing(gaussian_finetune, make_finetune, tiny_model_dir, tmp_path,
                                                          capsys):
    delta = tmp_path / "d.safetensors"
    # An option error comes before any model loads.
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--group-size", "0", "-o", str(delta)]) == 2
    err = capsys.readouterr().err
    assert "'group_size' must be a whole number of at least 1" in err and "Traceback" not in err and not delta.exists()

    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--distill-steps", "0", "-o", str(delta)]) == 0
    other = make_finetune(lambda name, p: p.mul_(1.01), "other-base")
    out = tmp_path / "applied"
    assert main(["delta", "apply", "--base", str(other), "--delta", str(delta), "-o", str(out)]) == 2
    assert "different base model" in capsys.readouterr().err and not out.exists()

    # argparse's errors are one line as every other (it printed its usage over twenty), with the closest choice
    assert main(["delta", "compress", "--base", "b", "--finetuned", "f", "--method", "int3", "-o", "x"]) == 2
    err = capsys.readouterr().err
    assert "--method: invalid choice: 'int3'" in err and "Did you mean 'int" in err and err.count("\n") == 1
    assert main(["delta", "compress", "--base", "b", "--finetuned", "f", "--metod", "int8", "-o", "x"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --metod int8. Did you mean --method?" in err and err.count("\n") == 1


def test_training_config_compresses_the_result(train_config, tmp_path):
    from gym.delta.format import load_delta
    from gym.workflows.training import run_exp

    result = run_exp(train_config(delta_compression="bitdelta", delta_distill_steps=2, max_steps=2))
    entries, header = load_delta(result.metrics["delta_file"])
    assert header["method"] == "bitdelta" and header["distillation"]["steps"] == 2
    assert entries and all("lora" not in name for name in entries)  # deltas of the merged weights

    quantized = run_exp(train_config(delta_compression="int4", max_steps=1, overwrite_output_dir=True))
    entries, header = load_delta(quantized.metrics["delta_file"])
    assert header["method"] == "int4" and all(torch.is_tensor(e) or e.method.value == "int4" for e in entries.values())


def test_inspect_a_folder_min_kept_as_a_percentage_and_a_closed_pipe_are_one_line_or_quiet(tmp_path, capsys):
    assert main(["delta", "inspect", str(tmp_path)]) == 2
    assert f"{tmp_path} is a folder; a delta is one file" in capsys.readouterr().err
    assert main(["delta", "compress", "--base", "b", "--finetuned", "f", "--eval-task", "ppl:x", "--min-kept", "95",
                 "-o", str(tmp_path / "d.safetensors")]) == 2  # refused before minutes of work, not after
    assert "score to keep (0.95 for 95%), above 0 and at most 2; got 95" in capsys.readouterr().err


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    # `gym ... | head -1`: the rest of the output has nowhere to go; that is no error, and no traceback.
    import subprocess
    import sys

    done = subprocess.run(f"{sys.executable} -m gym.cli --help | head -c 10", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout == "usage: gym" and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
