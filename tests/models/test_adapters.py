from __future__ import annotations

import pytest
import torch

from gym.config.finetuning import FinetuningArguments
from gym.core.errors import ConfigError
from gym.models.adapters import count_parameters, setup_adapter, setup_freeze


@pytest.fixture()
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_freeze_negative_means_first_layers(tiny):
    setup_freeze(tiny, FinetuningArguments(finetuning_type="freeze", freeze_trainable_layers=-1,
                                           freeze_extra_modules="embed_tokens"))
    trainable = {n for n, p in tiny.named_parameters() if p.requires_grad}
    assert any(n.startswith("model.layers.0.") for n in trainable)
    assert not any(n.startswith("model.layers.1.") for n in trainable)
    assert "model.embed_tokens.weight" in trainable


def test_freeze_bad_values_are_config_errors(tiny):
    with pytest.raises(ConfigError, match="freeze_trainable_layers"):
        setup_freeze(tiny, FinetuningArguments(freeze_trainable_layers=5))
    with pytest.raises(ConfigError, match="'freeze_trainable_modules': no module of the model is named 'nonexistent'"):
        setup_freeze(tiny, FinetuningArguments(freeze_trainable_modules="nonexistent"))


@pytest.mark.parametrize(("key", "names", "typo", "closest"), [
    ("freeze_extra_modules", "embed_tokenz", "embed_tokenz", "embed_tokens"),
    ("freeze_trainable_modules", "mlp,self_atn", "self_atn", "self_attn"),
])
def test_a_misspelt_freeze_module_is_refused_not_skipped(tiny, key, names, typo, closest):
    """Each list is OR-ed: a typo beside a good name (or alone, in the extras) trained silently without it."""
    with pytest.raises(ConfigError, match=f"'{key}': no module of the model is named '{typo}'. Did you mean "
                                          f"'{closest}'"):
        setup_freeze(tiny, FinetuningArguments(finetuning_type="freeze", freeze_trainable_layers=1, **{key: names}))


def test_freeze_extra_modules_match_whole_module_names(tiny):
    """`norm` is the final norm (model.norm), not every layer's input_layernorm that contains the word; the tiny
    model's lm_head is tied, so naming it trains the embedding it shares."""
    setup_freeze(tiny, FinetuningArguments(finetuning_type="freeze", freeze_trainable_layers=1,
                                           freeze_extra_modules="norm,lm_head"))
    trainable = {n for n, p in tiny.named_parameters() if p.requires_grad}
    assert {"model.norm.weight", "model.embed_tokens.weight"} <= trainable
    assert not any(n.startswith("model.layers.0.") for n in trainable)


def test_lora_all_targets_every_linear_but_the_head(tiny):
    model = setup_adapter(tiny, FinetuningArguments(lora_rank=4))
    wrapped = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_A" in n}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable, total = count_parameters(model)
    assert 0 < trainable < total
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_unknown_lora_target_is_a_config_error_naming_the_closest(tiny):
    with pytest.raises(ConfigError, match="'lora_target': no module of the model is named 'qq_proj'. Did you mean "
                                          "'q_proj'"):
        setup_adapter(tiny, FinetuningArguments(lora_target="q_proj,qq_proj"))


def test_a_misspelt_additional_target_is_refused_not_skipped(tiny):
    """peft skips a modules_to_save name that matches nothing: the run would train without the head it was asked to."""
    with pytest.raises(ConfigError, match="'additional_target': .* 'lm_hed'. Did you mean 'lm_head'"):
        setup_adapter(tiny, FinetuningArguments(additional_target="lm_hed"))


def test_dotted_targets_match_by_suffix(tiny):
    model = setup_adapter(tiny, FinetuningArguments(lora_target="self_attn.q_proj", additional_target="lm_head"))
    assert any("q_proj.lora_A" in n for n, _ in model.named_parameters())
    assert not any("v_proj.lora_A" in n for n, _ in model.named_parameters())


@pytest.mark.parametrize("finetuning_type", ["oft", "boft"])
def test_orthogonal_adapters_rotate_weights_and_keep_their_spectrum(train_config, tiny_model_dir, finetuning_type):
    """OFT/BOFT train only their rotations; the merged weights changed, but each keeps its singular values
    (an orthogonal transform cannot stretch), which is the method's point. Chat finds the adapter by itself."""
    from pathlib import Path

    from peft import PeftModel
    from safetensors.torch import load_file

    from gym.infer.chat import ChatModel
    from gym.models.loader import load_causal_lm
    from gym.workflows.training import run_exp

    out = run_exp(train_config(finetuning_type=finetuning_type, oft_block_size=16, boft_block_size=8)).output_dir
    saved = load_file(str(Path(out) / "adapter_model.safetensors"))
    assert saved and all(f"{finetuning_type}_" in k for k in saved)
    base = load_causal_lm(str(tiny_model_dir)).state_dict()
    merged = PeftModel.from_pretrained(load_causal_lm(str(tiny_model_dir)), out).merge_and_unload().state_dict()
    linear = [k for k in base if "layers." in k and k.endswith("proj.weight")]
    assert all(not torch.equal(base[k], merged[k]) for k in linear)
    for k in linear:
        moved = (merged[k] - base[k]).norm() / base[k].norm()
        stretched = (torch.linalg.svdvals(merged[k]) - torch.linalg.svdvals(base[k])).norm() / base[k].norm()
        # peft computes the rotation with a truncated Cayley-Neumann series: orthogonal up to ~1% here.
        assert moved > 0.05 and stretched < 0.1 * moved, (k, float(moved), float(stretched))
    assert all(torch.equal(base[k], merged[k]) for k in base if k not in linear)  # embeddings, norms
    chat = ChatModel({"output_dir": out, "max_new_tokens": 2, "do_sample": False})
    assert chat.adapters == [out]
    chat.close()


def test_oft_needs_exactly_one_of_rank_and_block_size():
    from gym.config.parser import get_train_args

    with pytest.raises(ConfigError, match="exactly one of 'oft_rank' and 'oft_block_size'"):
        get_train_args({"finetuning_type": "oft", "oft_rank": 4})


def test_llama_pro_trains_the_last_layer_of_each_stretch(tmp_path):
    """use_llama_pro with 2 trainable layers of 4: layers 1 and 3 (the expanded ones), not the last two."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                         num_attention_heads=2, num_key_value_heads=1))
    setup_freeze(model, FinetuningArguments(finetuning_type="freeze", freeze_trainable_layers=2, use_llama_pro=True))
    trained = {int(n.split(".")[2]) for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {1, 3}
    with pytest.raises(ConfigError, match="must be positive and divide"):
        setup_freeze(model, FinetuningArguments(finetuning_type="freeze", freeze_trainable_layers=3,
                                                use_llama_pro=True))
