"""Any Gym model is evaluated as it is served: a delta on its base, the same delta as a user's variant, and the
folder `gym delta apply` writes all score the same weights."""

from __future__ import annotations

import pytest
import torch

from gym.cli import main
from gym.eval.runner import run_eval


def _shift(name, param):
    if "mlp" in name:
        torch.manual_seed(len(name))
        param.add_(torch.randn_like(param) * 0.05)


def test_delta_variant_and_applied_folder_score_the_same_model(make_finetune, tiny_model_dir, data_dir, tmp_path):
    from gym.personalization.store import VariantStore

    tuned = make_finetune(_shift)
    delta, applied = tmp_path / "d.safetensors", tmp_path / "applied"
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(tuned), "--distill-steps", "0",
                 "-o", str(delta)]) == 0
    assert main(["delta", "apply", "--base", str(tiny_model_dir), "--delta", str(delta), "-o", str(applied)]) == 0
    VariantStore(tmp_path / "store").add("alice", delta=delta)
    task = {"tasks": ["ppl:tiny_alpaca"], "dataset_dir": str(data_dir), "cutoff_len": 64}
    reports = [run_eval({"model_name_or_path": str(tiny_model_dir), "delta": str(delta), **task}),
               run_eval({"variant": f"{tmp_path / 'store'}:alice", **task}),
               run_eval({"model_name_or_path": str(applied), **task})]
    base = run_eval({"model_name_or_path": str(tiny_model_dir), **task})
    losses = [r["results"]["ppl:tiny_alpaca"]["metrics"]["loss"] for r in reports]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6) and losses[0] == pytest.approx(losses[2], rel=1e-5)
    assert len({r["model"]["fingerprint"] for r in reports}) == 1
    assert base["model"]["fingerprint"] != reports[0]["model"]["fingerprint"]
    assert base["results"]["ppl:tiny_alpaca"]["metrics"]["loss"] != pytest.approx(losses[0], rel=1e-3)
    assert reports[1]["model"]["variant"] == f"{tmp_path / 'store'}:alice"


def test_a_base_without_chat_template_is_prompted_as_plain_text(tiny_model_dir, mc_dir, tmp_path):
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    config = (plain / "tokenizer_config.json").read_text()
    import json

    settings = json.loads(config)
    settings.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(settings))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    report = run_eval({"model_name_or_path": str(plain), "tasks": ["mc:quiz"], "dataset_dir": str(mc_dir),
                       "n_shot": 1})
    assert report["results"]["mc:quiz"]["prompt"] == "plain" and report["model"]["template"] is None


def test_a_peft_adapter_folder_is_scored_on_the_base_its_config_names(tiny_model_dir, mc_dir, tmp_path):
    # An adapter saved by peft (no gym_config.yaml) loaded the default model under it, named as the model or as
    # the adapter alone: the wrong base, scored without a word when the shapes happened to fit.
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    task = {"tasks": ["mc:quiz"], "dataset_dir": str(mc_dir), "n_shot": 0, "limit": 1}
    explicit = run_eval({"model_name_or_path": str(tiny_model_dir), "adapter_name_or_path": str(adapter), **task})
    for config in ({"model_name_or_path": str(adapter)}, {"adapter_name_or_path": str(adapter)}):
        report = run_eval({**config, **task})
        assert report["model"]["model_name_or_path"] == str(tiny_model_dir)
        assert report["model"]["fingerprint"] == explicit["model"]["fingerprint"]
    assert main(["eval", str(adapter), "--task", "mc:quiz", f"dataset_dir={mc_dir}", "--n_shot", "0", "--limit", "1",
                 "-o", str(tmp_path / "r.json")]) == 0
    assert '"model_name_or_path": "' + str(tiny_model_dir) in (tmp_path / "r.json").read_text()
