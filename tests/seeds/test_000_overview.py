"""Seed 000, "Gym: Complete AI Training Platform": its Python snippets, CLI lines and YAML blocks."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch

from gym.cli import main
from gym.core.errors import ConfigError, IncompleteConfig

DATA = Path(__file__).resolve().parents[2] / "data"

GSPO_BLOCK = """
model: Qwen/Qwen3-4B
algorithm: gspo
group_size: 8
sequence_parallel: true
use_unsloth: true
quantization:
  method: bitdelta
  bits: 1
  enable_deltasoup: true
"""

MULTI_GPU_BLOCK = """
distributed:
  backend: nccl
  strategy: fsdp
  sharding_strategy: full_shard
  mixed_precision: bf16
"""

SERVING_BLOCK = """
serving:
  model_format: gguf
  quantization: int4
  batch_size: 32
  max_concurrent: 100
  cache_size: 10GB
"""


def _nudged(make_finetune):
    generator = torch.Generator().manual_seed(0)

    def change(name, param):
        if param.ndim == 2 and ".layers." in name:
            param.add_(torch.randn(param.shape, generator=generator) * 1e-2)

    return make_finetune(change)


def test_bitdelta_quantizer(tiny_model_dir, make_finetune, caplog):
    from gym.delta.weights import load_model
    from gym.quantization import BitDeltaConfig, BitDeltaQuantizer

    config = BitDeltaConfig(
        bits=1,
        group_size=128,
        safety_threshold=0.6,
        enable_deltasoup=True
    )
    quantizer = BitDeltaQuantizer(config)
    # Ours: compress a fine-tune (3 distillation steps instead of 200). No calibration was named and the
    # fine-tune records no training data, so the built-in set is used, and said so.
    quantizer.config = dataclasses.replace(config, distill_steps=3, distill_seq_len=32)
    with caplog.at_level(logging.INFO):
        delta = quantizer.compress(load_model(str(tiny_model_dir)), load_model(str(_nudged(make_finetune))),
                                   progress=False)
    assert "built-in set" in caplog.text
    assert delta.header["deltasoup"]["eligible"] and delta.header["distillation"]["steps"] == 3


def test_deltaquant_config():
    from gym.quantization import DeltaQuantConfig, QuantMethod

    config = DeltaQuantConfig(
        method=QuantMethod.INT4,
        per_channel=True,
        calibration_samples=256
    )
    assert config.method is QuantMethod.INT4 and config.calibration is None  # chosen when compression starts


def test_deltasoup_config_and_community_learning(lora_finetune, lora_delta, own_gym_home, tiny_model_dir):
    from gym.quantization import AggregationMethod, DeltaSoup, DeltaSoupConfig

    config = DeltaSoupConfig(
        method=AggregationMethod.BYZANTINE_ROBUST,
        differential_privacy=True,
        enable_rewards=True
    )
    # "Community Learning": model_alice and model_bob are fine-tunes of one base; a PEFT model names its base,
    # so DeltaSoup(config) needs no folder or base of its own.
    model_alice, model_bob, model_carol = (lora_finetune(seed) for seed in (1, 2, 3))
    soup = DeltaSoup(config)
    soup.contribute(user_id="alice", model=model_alice)
    soup.contribute(user_id="bob", model=model_bob)
    with pytest.raises(ConfigError, match="aggregating needs at least 3"):  # Krum needs n >= 3
        soup.aggregate(min_contributors=3)
    soup.contribute(user_id="carol", model=model_carol)
    aggregated = soup.aggregate(min_contributors=3)
    assert set(aggregated) == {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2)}
    assert soup.path == own_gym_home / "soups" / Path(tiny_model_dir).name

    # Rewards pay leave-one-out agreement (gym.soup.payouts). With differential privacy every contribution is
    # clipped to clip_norm (1; each is longer) and the robust mean gives the three agreeing ones a third each,
    # so what the others put in is (u_j + u_k) / 3 for unit vectors u, and q_i = cos(u_i, u_j + u_k). The pool
    # is split quality_weight by q and participation_weight equally among the three.
    rewards = soup.calculate_rewards()
    models = {"alice": model_alice, "bob": model_bob, "carol": model_carol}
    flat = {user: torch.cat([v.reshape(-1) for _, v in sorted(lora_delta(model).items())])
            for user, model in models.items()}
    assert all(v.norm() > config.clip_norm for v in flat.values())
    unit = {user: v / v.norm() for user, v in flat.items()}
    quality = {user: float(torch.nn.functional.cosine_similarity(
        u, sum(unit[other] for other in unit if other != user), dim=0)) for user, u in unit.items()}
    assert all(q > 0.5 for q in quality.values())  # they agree, as fine-tunes of one task do
    share = config.reward_pool / (config.quality_weight + config.participation_weight)
    expected = {user: share * (config.quality_weight * q / sum(quality.values()) + config.participation_weight / 3)
                for user, q in quality.items()}
    assert rewards == pytest.approx(expected, rel=1e-5)  # the same three keys, and each amount
    assert sum(rewards.values()) == pytest.approx(config.reward_pool)


def test_python_api_gspo_bitdelta_deltasoup_export(tiny_model_dir, tmp_path, caplog):
    from gym import Trainer, TrainingConfig

    # Configure training (hub id -> the tiny local model)
    config = TrainingConfig(
        model=str(tiny_model_dir),
        algorithm="gspo",
        quantization="bitdelta",
        use_unsloth=True
    )
    trainer = Trainer(config)
    # GSPO needs a reward: the config is accepted as written and the run says what is missing.
    with pytest.raises(IncompleteConfig, match="needs rewards"):
        trainer.train(dataset="alpaca_gpt4_en")
    # Unsloth needs a CUDA GPU: checked when the run starts, before anything loads.
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'use_unsloth' needs a CUDA GPU"):
            trainer.train(dataset="alpaca_gpt4_en", reward_funcs=["accuracy"])
        trainer.config = trainer.config.replace(use_unsloth=False)
    # alpaca_gpt4_en is registered with its hub location; offline, the error says how to get it.
    with pytest.raises(Exception, match="alpaca_gpt4_en.*offline"):
        trainer.train(dataset="alpaca_gpt4_en", reward_funcs=["accuracy"], output_dir=str(tmp_path / "hub"))
    # Train model (a local prompt/answer set, 2 steps, 3 distillation steps; a length reward too, so that the
    # tiny random model's answers differ in reward and the policy moves)
    result = trainer.train(dataset="arithmetic_demo", dataset_dir=str(DATA), reward_funcs=["accuracy", "length:3"],
                           output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4,
                           num_generations=4, max_completion_length=8, learning_rate=5e-2, delta_distill_steps=3,
                           report_to="none")
    assert result.global_step == 2 and Path(result.metrics["delta_file"]).is_file()

    # Apply community improvements: the run joins this base's soup; no round is aggregated yet, so the model
    # stays the run's own.
    applied = trainer.apply_deltasoup()
    assert applied.contribution.status == "accepted" and applied.model_dir is None

    # Export quantized model
    out = trainer.export(str(tmp_path / "model.gguf"), quantization="bitdelta")
    from gguf import GGUFReader

    assert out.is_file() and GGUFReader(out).tensors


def test_personalized_models(tiny_model_dir, tmp_path, assert_serves_variant):
    from gym.personalization import PersonalizedTrainer

    user_prefs = [{"instruction": f"Greet me, number {i}.", "chosen": "Hello, friend!", "rejected": "Go away."}
                  for i in range(8)]
    trainer = PersonalizedTrainer(base_model=str(tiny_model_dir))
    # Ours: 2 training steps and 2 scale-distillation steps instead of 3 epochs and 50.
    trainer.config = dataclasses.replace(trainer.config, distill_steps=2)
    record = trainer.create_variant(user_id="user_123", preferences=user_prefs, max_steps=2)
    assert (record.user, record.method, record.training["stage"]) == ("user_123", "bitdelta", "dpo")  # preferences
    assert 0 < record.bytes < record.base["parameters"] * 4 / 16  # 1 bit a weight plus scales, not a model copy
    chat = trainer.serve_variant("user_123")  # a ChatModel answering as the variant
    try:
        assert isinstance(chat.chat([{"role": "user", "content": "Hi"}], max_new_tokens=4), str)
        # ...as the variant, not the base: every layer the preferences trained carries the delta, nothing else does
        assert_serves_variant(chat)
    finally:
        chat.close()


def test_gspo_training_block(write_yaml, tiny_model_dir, capsys):
    config = write_yaml(GSPO_BLOCK, model=str(tiny_model_dir))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "sequence_parallel: True" in err and "DeepSpeed-Ulysses" in err and "Traceback" not in err
    # Without sequence_parallel, the block means: 8 answers per prompt, a 1-bit delta after training.
    from gym.config.parser import get_train_args

    config = write_yaml(GSPO_BLOCK, model=str(tiny_model_dir), sequence_parallel=False, use_unsloth=False,
                        reward_funcs=["accuracy"], per_device_train_batch_size=8)
    args = get_train_args(str(config))
    assert args.finetuning.stage == "gspo" and args.options.num_generations == 8
    assert args.finetuning.delta_compression == "bitdelta" and args.finetuning.delta_enable_deltasoup


def test_multi_gpu_block(write_yaml):
    from gym.config import distributed
    from gym.config.files import load_config_file
    from gym.config.parser import get_train_args

    config = write_yaml(MULTI_GPU_BLOCK)
    on_gpus = distributed.expand(load_config_file(config), cuda=True)
    assert on_gpus["ddp_backend"] == "nccl" and on_gpus["fsdp"] is True and on_gpus["bf16"] is True
    assert on_gpus["fsdp_config"]["reshard_after_forward"] is True  # full_shard
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="use 'backend: gloo'"):
            get_train_args(str(config))


def test_production_serving_block(write_yaml, tiny_model_dir, monkeypatch):
    from gym.config.parser import get_train_args

    config = write_yaml(SERVING_BLOCK, model_name_or_path=str(tiny_model_dir))
    model = get_train_args(str(config)).model
    assert (model.infer_backend, model.infer_dtype, model.infer_prefix_cache_mb) == ("llamacpp", "int4", 10240)
    seen = {}
    monkeypatch.setattr("gym.serve.server.serve", lambda cfg, **kw: seen.update(kw))
    assert main(["api", str(config)]) == 0
    # 100 admitted at once: 32 decoding together, 68 queued
    assert (seen["max_batch_size"], seen["max_waiting"]) == (32, 68)
    assert main(["api", str(config), "--max_batch_size", "4"]) == 0  # a flag wins over the block
    assert (seen["max_batch_size"], seen["max_waiting"]) == (4, 96)


def test_cli_quick_start(tiny_model_dir, tmp_path, monkeypatch):
    # gym export --model saves/model --format gguf
    run = tmp_path / "saves" / "model"
    assert main(["train", f"model_name_or_path={tiny_model_dir}", "dataset=alpaca_en_demo", f"dataset_dir={DATA}",
                 f"output_dir={run}", "max_steps=1", "cutoff_len=96", "report_to=none"]) == 0
    assert main(["export", "--model", str(run), "--format", "gguf"]) == 0
    assert list((tmp_path / "saves" / "model-gguf").glob("*.gguf"))
    # gym webui --port 8080 (the server itself is tested in tests/webui)
    seen = {}
    monkeypatch.setattr("gym.webui.app.serve", lambda **kw: seen.update(kw))
    assert main(["webui", "--port", "8080"]) == 0 and seen["port"] == 8080
