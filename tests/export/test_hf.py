"""`gym export --format hf`: the merged model, sharded, with the trained chat template and decoding settings."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym.cli import main
from gym.core.files import MANIFEST_FILE
from gym.infer.chat import ChatModel
from gym.workflows.training import run_exp

PROMPT = [{"role": "user", "content": "Add 2 and 3."}]


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_lora_export_equals_the_served_model_and_carries_its_format(trained_run, tmp_path, capsys, caplog):
    result = SimpleNamespace(output_dir=str(trained_run))
    out = tmp_path / "export"
    caplog.set_level(logging.INFO, logger="gym")
    assert main(["export", "--output_dir", result.output_dir, "--export_dir", str(out), "--export_size", "0.0004"]) == 0
    assert f"Exported {out}" in capsys.readouterr().out
    # the run's saved config holds the quantization keys at their defaults: this adapter trained on no quantized base
    assert "Merging onto the unquantized base" not in caplog.text
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()  # 0.4 MB shards of a ~2 MB model

    served = ChatModel({"adapter_name_or_path": result.output_dir})
    exported = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = served.render(PROMPT)
    # The format the adapter was trained with (llama3 + its default system), rendered by transformers alone:
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert "Answer briefly." in text and tokenizer.encode(text, add_special_tokens=False) == prompt
    assert torch.allclose(_logits(exported, prompt), _logits(served.model, prompt), atol=1e-5)
    generation = exported.generation_config
    assert generation.temperature == 0.3 and generation.top_p == 0.8
    assert set(served.chat_format.stop_token_ids()) == set(generation.eos_token_id)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["format"] == "hf" and manifest["chat_template"] == "llama3"
    assert manifest["adapters"] == [str(trained_run)]  # the run's adapter, merged: it listed none when given as a run
    assert manifest["base_model"] == json.loads((trained_run / MANIFEST_FILE).read_text())["base_model"]
    served.close()


def test_dtype_and_overwrite(train_config, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bf16"
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--export_dir", str(out),
                 "--export_dtype", "bfloat16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--export_dir", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--export_dir", str(out), "--overwrite"]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


@pytest.mark.parametrize(("args", "message"), [
    (["--format", "gguff"], "Unknown export format 'gguff'"),
    (["--export_dtype", "fp8"], "export_dtype must be one of"),
    (["--type", "q4_0"], "export_type applies to the GGUF formats"),
    (["--type", "bitdleta"], "Unknown export_type 'bitdleta' for the hf format. Did you mean 'bitdelta'?"),
    (["--format", "gguf-lora", "--type", "q8"], "not 'q8'. Did you mean 'q8_0'?"),
    # only hf casts: a GGUF took its --type and an onnx export float32, dropping the dtype asked for in silence
    (["--format", "gguf", "--dtype", "bfloat16"], "--dtype bfloat16 applies to --format hf; a GGUF's type is"),
    (["--format", "onnx", "--export_dtype", "float16"],
     "--export_dtype float16 applies to --format hf; an onnx export is float32"),
    ([], "Set export_dir"),
])
def test_bad_export_options_exit_2(tiny_model_dir, tmp_path, capsys, args, message):
    dest = [] if message == "Set export_dir" else ["--export_dir", str(tmp_path / "x")]
    # Without export_dir, a local model folder exports beside itself (DIR-<format>/); a model name has no folder.
    model = "smollm2-135m" if message == "Set export_dir" else str(tiny_model_dir)
    assert main(["export", "--model_name_or_path", model, *dest, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_delta_file_exports_as_the_rebuilt_model(make_finetune, tiny_model_dir, tmp_path):
    """A BitDelta/DeltaQuant file exports as base + delta: the same weights `gym delta apply` writes."""
    from gym.cli.delta import main as delta_main
    from gym.delta.apply import write_applied

    tuned = make_finetune(lambda name, p: p.add_(0.01 * torch.randn_like(p)) if p.ndim == 2 else None)
    delta = tmp_path / "d.safetensors"
    assert delta_main(["compress", "--base", str(tiny_model_dir), "--finetuned", str(tuned), "--method", "int8",
                       "-o", str(delta)]) == 0
    out = tmp_path / "exported"
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--delta", str(delta),
                 "--export_dir", str(out)]) == 0
    applied = write_applied(str(tiny_model_dir), delta, tmp_path / "applied")
    a = AutoModelForCausalLM.from_pretrained(out).state_dict()
    b = AutoModelForCausalLM.from_pretrained(applied).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_python_trainer_export_as_the_seeds_write_it(train_config, tmp_path):
    """`trainer.export("model.gguf", quantization=...)`: GGUF by the suffix; `bitdelta`: the fine-tune as its BitDelta
    variant serves it (base + 1-bit delta), which `gym delta compress --method bitdelta --distill-steps 0` +
    `gym delta apply` would also give."""
    import gguf

    from gym import Trainer

    trainer = Trainer(train_config(lora_target="all"))
    trainer.train()
    path = trainer.export(tmp_path / "model.gguf", quantization="q8_0")
    assert path == tmp_path / "model.gguf"
    assert {t.tensor_type.name for t in gguf.GGUFReader(path).tensors} == {"Q8_0", "F32"}

    folder = trainer.export(tmp_path / "bitdelta", quantization="bitdelta")
    variant = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    base = AutoModelForCausalLM.from_pretrained(train_config()["model_name_or_path"]).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(trainer.export(tmp_path / "merged")).state_dict()
    weight = "model.layers.0.self_attn.q_proj.weight"
    delta = variant[weight] - base[weight]
    # 1-bit: within each row the change is one magnitude with the fine-tune's signs
    assert torch.allclose(delta.abs(), delta.abs().max(1, keepdim=True).values, rtol=1e-3)
    assert (torch.sign(delta) == torch.sign(merged[weight] - base[weight])).float().mean() > 0.99
    assert (tmp_path / "bitdelta.gguf").exists() is False
    gguf_variant = trainer.export(tmp_path / "variant.gguf", quantization="bitdelta")
    assert {t.tensor_type.name for t in gguf.GGUFReader(gguf_variant).tensors} == {"F16", "F32"}


def test_dora_export_equals_the_served_model(train_config, tmp_path):
    result = run_exp(train_config(use_dora=True))
    out = tmp_path / "dora"
    assert main(["export", "--output_dir", result.output_dir, "--export_dir", str(out)]) == 0
    served = ChatModel({"adapter_name_or_path": result.output_dir})
    prompt = served.render(PROMPT)
    assert torch.allclose(_logits(AutoModelForCausalLM.from_pretrained(out), prompt), _logits(served.model, prompt),
                          atol=1e-5)
    served.close()


def test_format_and_type_are_read_whatever_their_case():
    # Gym writes `...-Q4_0.gguf`; `--type Q4_0` and `--format GGUF` were refused.
    from gym.export.config import ExportArguments

    args = ExportArguments(export_dir="x", export_format="GGUF", export_type="Q4_0")
    assert (args.export_format, args.export_type) == ("gguf", "q4_0")


def test_a_training_config_without_its_run_is_refused_not_exported_as_the_base(tmp_path, capsys):
    # It wrote the base's weights under the run's config with exit 0, a log line the only sign.
    config = tmp_path / "untrained.yaml"
    config.write_text(f"model_name_or_path: smollm2-135m\noutput_dir: {tmp_path / 'never-trained'}\n")
    assert main(["export", str(config), "--export_dir", str(tmp_path / "out")]) == 2
    assert "holds no finished run: train it first" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
