from __future__ import annotations

import pytest
import torch

from gym.train.trainer import supervised_lm_loss


def test_loss_matches_the_models_own_loss(tiny_model_dir):
    """Projecting only labelled positions must give exactly the standard shifted cross-entropy. In float64: the two
    paths multiply matrices of different shapes, whose float32 products round differently by CPU (on an AVX2-only
    CPU gradients differed by up to 3.6e-4 relative), which would hide a real difference or fail on a right one."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (2, 12))
    labels = ids.clone()
    labels[:, :5] = -100
    labels[1, 9:] = -100
    mask = torch.ones_like(ids)
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    reference.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    ours = supervised_lm_loss(model, {"input_ids": ids, "attention_mask": mask}, labels)
    assert torch.allclose(ours, reference, atol=1e-5)
    ours.backward()  # the same gradient too, through the tied head and the embeddings
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-7, msg=name)


def test_neftune_noises_training_embeddings_only(train_config, monkeypatch):
    """neftune_noise_alpha: the first layer sees noisy embeddings in training steps and clean ones at eval, with
    noise of the published scale alpha / sqrt(length x hidden) per entry (uniform in +-that)."""
    from gym.train import workflow
    from gym.workflows.training import run_exp

    original = workflow.train_and_save
    records: list[tuple[bool, float, float]] = []

    def watch(trainer, setup, args):
        model = trainer.model
        embed = model.get_input_embeddings()
        layer = model.get_base_model().model.layers[0]
        ids: dict[str, torch.Tensor] = {}
        embed.register_forward_pre_hook(lambda module, inputs: ids.update(last=inputs[0]))

        def compare(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            noise = hidden - embed.weight[ids["last"]]
            bound = 5 / (hidden.shape[1] * hidden.shape[2]) ** 0.5
            records.append((module.training, float(noise.abs().max()), bound))

        layer.register_forward_pre_hook(compare, with_kwargs=True)
        return original(trainer, setup, args)

    monkeypatch.setattr(workflow, "train_and_save", watch)
    # float32 on every machine: with bf16 on (the default where the CPU has native bf16) the base, and so the noisy
    # embeddings, are bf16, whose rounding moves the noise past its bound by a fraction of a percent.
    run_exp(train_config(neftune_noise_alpha=5, val_size=0.25, max_steps=2, bf16=False))
    training = [r for r in records if r[0]]
    evaluating = [r for r in records if not r[0]]
    assert training and evaluating
    assert all(0.5 * bound < noise <= bound * 1.0001 for _, noise, bound in training), training
    assert all(noise == 0 for _, noise, _ in evaluating)


def test_dft_loss_weights_each_token_by_its_probability(tiny_model_dir):
    """use_dft_loss: sum over labelled tokens of -p * log p with p held constant, over the token count."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    ids = torch.randint(5, 1000, (2, 10))
    labels = ids.clone()
    labels[:, :4] = -100
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    logp = model(**inputs).logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)[:, 3:]
    expected = -(logp.exp().detach() * logp).sum() / logp.numel()
    ours = supervised_lm_loss(model, inputs, labels, dft=True)
    assert torch.allclose(ours, expected, atol=1e-6)
    assert ours < supervised_lm_loss(model, inputs, labels)  # every weight p < 1


def test_pure_bf16_trains_bf16_weights_without_autocast(train_config, capture_trainer):
    from gym.train import workflow
    from gym.workflows.training import run_exp

    seen = capture_trainer(workflow)
    result = run_exp(train_config(finetuning_type="full", pure_bf16=True, max_steps=1))
    trainer = seen["trainer"]
    assert not trainer.args.bf16 and all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    assert result.global_step == 1


def test_use_reentrant_gc_reaches_the_checkpointing_kwargs():
    from gym.config.parser import get_train_args

    training = get_train_args({"use_reentrant_gc": False, "gradient_checkpointing": True}).training
    assert training.activation_checkpointing_kwargs == {"use_reentrant": False}


def test_fused_liger_loss_equals_the_plain_loss():
    """use_liger_kernel: the fused head-and-loss kernel gives the plain path's loss and gradients (a CUDA GPU)."""
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("Liger's kernels are Triton: this needs a CUDA GPU")
    pytest.importorskip("liger_kernel")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).cuda()
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (2, 12), device="cuda")
    labels = ids.clone()
    labels[:, :5] = -100
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    plain = supervised_lm_loss(model, inputs, labels)
    plain.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    fused = supervised_lm_loss(model, inputs, labels, fused=True)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)
    fused.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-3, atol=1e-5, msg=name)


def test_bf16_lora_trains_float32_adapters_on_a_bf16_base(train_config, capture_trainer):
    """bf16 mixed precision with a frozen base: the base is loaded in bf16 (autocast reads it so anyway), what trains
    is float32: peft's adapters, and the full copies peft trains beside them (here the final norm)."""
    from gym.train import workflow
    from gym.workflows.training import run_exp

    seen = capture_trainer(workflow)
    result = run_exp(train_config(bf16=True, max_steps=2, additional_target="norm"))
    model = seen["trainer"].model
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert seen["trainer"].args.bf16 and result.global_step == 2 and result.final_loss == result.final_loss
    assert any("lora_A" in name for name in trainable) and any("modules_to_save" in name for name in trainable)
    assert all(p.dtype == torch.float32 for p in trainable.values())
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)


def test_bf16_lora_loss_stays_that_of_float32_master_weights(train_config, capture_trainer, monkeypatch):
    """The first step's loss (the adapter still a no-op) with a bf16 base is the loss with float32 master weights
    under the same autocast, to bf16's rounding of the residual stream."""
    from gym.train import workflow
    from gym.workflows.training import run_exp

    losses = {}
    for base in ("bf16", "float32"):
        if base == "float32":
            monkeypatch.setattr(workflow, "weights_dtype", lambda *args: torch.float32)
        seen = capture_trainer(workflow)
        run_exp(train_config(bf16=True, max_steps=1, logging_steps=1,
                             output_dir=f"{train_config()['output_dir']}-{base}"))
        losses[base] = next(e["loss"] for e in seen["trainer"].state.log_history if "loss" in e)
    assert abs(losses["bf16"] - losses["float32"]) < 1e-2 * losses["float32"], losses


@pytest.mark.parametrize("overrides, data_kind, expected", [
    ({"bf16": True}, "SUPERVISED", torch.bfloat16),
    ({"bf16": True, "finetuning_type": "oft", "oft_rank": 2, "oft_block_size": 0}, "PAIRWISE", torch.bfloat16),
    ({"pure_bf16": True, "finetuning_type": "full"}, "SUPERVISED", torch.bfloat16),
    ({"bf16": False}, "SUPERVISED", torch.float32),
    ({"bf16": True, "finetuning_type": "full"}, "SUPERVISED", torch.float32),  # what trains is the base itself
    ({"bf16": True, "finetuning_type": "freeze"}, "SUPERVISED", torch.float32),
    ({"bf16": True}, "PROMPT", torch.float32),  # merges the adapter into the base to generate
    ({"bf16": True, "pissa_init": True}, "SUPERVISED", torch.float32),
    ({"bf16": True, "fsdp": "full_shard"}, "SUPERVISED", torch.float32),
], ids=["lora", "oft", "pure-bf16", "float32", "full", "freeze", "generates", "pissa", "fsdp"])
def test_which_runs_load_the_base_in_bf16(overrides, data_kind, expected):
    overrides = dict(overrides)
    from types import SimpleNamespace

    from gym.config.parser import get_train_args
    from gym.core.kinds import DataKind
    from gym.train.workflow import weights_dtype

    fsdp = overrides.pop("fsdp", [])  # a config with it is refused in one process: the run's arguments carry it
    args = get_train_args({"stage": "sft", "finetuning_type": "lora", **overrides})
    hf_args = SimpleNamespace(bf16=bool(args.training.bf16), fsdp=fsdp, deepspeed=None)
    assert weights_dtype(args, hf_args, DataKind[data_kind]) is expected


def test_upcast_keys_keep_norms_and_logits_float32_on_a_bf16_base(train_config, capture_trainer, caplog):
    """LLaMA-Factory's upcast_layernorm / upcast_lmhead_output were refused as unknown keys; on a bf16 LoRA base the
    norms stay bf16 without them. print_param_status logs each parameter once."""
    import logging

    from gym.train import workflow
    from gym.workflows.training import run_exp

    seen = capture_trainer(workflow)
    with caplog.at_level(logging.INFO, logger="gym.train.workflow"):
        result = run_exp(train_config(bf16=True, max_steps=1, upcast_layernorm=True, upcast_lmhead_output=True,
                                      print_param_status=True))
    model = seen["trainer"].model
    params = dict(model.named_parameters())
    norms = [p for name, p in params.items() if "norm" in name]
    assert result.global_step == 1 and norms and all(p.dtype == torch.float32 for p in norms)
    assert any(p.dtype == torch.bfloat16 for name, p in params.items() if "q_proj.base_layer" in name)
    ids = torch.tensor([[1, 2, 3]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=ids).logits.dtype == torch.float32
    logged = [r.getMessage() for r in caplog.records if r.getMessage().endswith(("trains", "frozen"))]
    assert len(logged) == len(params) and any("lora_A" in line and "trains" in line for line in logged)
