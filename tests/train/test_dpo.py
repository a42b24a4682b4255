"""stage: dpo / orpo / simpo / cpo on the tiny model: each trains only its LoRA adapter, saves one adapter,
uses the reference it should (the adapter-disabled base, a given model, or none), and its first logged
loss matches the closed form of its objective when policy == reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from gym.core.errors import ConfigError
from gym.train.harness import read_log
from gym.train.methods import dpo
from gym.workflows.training import run_exp

LN2 = math.log(2)


def _step_loss(result, step: int) -> float:
    (entry,) = [e for e in read_log(result.output_dir) if e.get("step") == step and "loss" in e]
    return entry["loss"]


@pytest.fixture()
def captured(capture_trainer):
    return capture_trainer(dpo)


def _assert_disabled_adapter_is_the_base(model, tiny_model_dir: Path) -> None:
    """The frozen base in memory is bit-for-bit the model on disk (in the dtype it was loaded in: bf16 where bf16
    mixed precision is on), so the adapter-disabled reference is too."""
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    in_memory = {k.replace(".base_layer", ""): v for k, v in model.get_base_model().state_dict().items()
                 if "lora_" not in k}
    assert set(base) <= set(in_memory)
    assert all(torch.equal(base[k].to(in_memory[k].dtype), in_memory[k].cpu()) for k in base)
    ids = torch.tensor([[5, 17, 99, 1000, 23, 7]])
    model.eval()
    with torch.no_grad():
        with model.disable_adapter():
            disabled = model(input_ids=ids).logits
        trained = model(input_ids=ids).logits
    assert not torch.allclose(trained, disabled, atol=1e-5), "the adapter should change the outputs"


VARIANTS = {
    # overrides, expected step-1 loss when policy == reference (None: no closed form)
    "dpo-sigmoid": ({}, LN2),
    "dpo-ipo": ({"pref_loss": "ipo", "pref_beta": 0.5}, 1 / (4 * 0.5**2)),
    "dpo-hinge": ({"pref_loss": "hinge"}, 1.0),
    "orpo": ({"stage": "orpo"}, None),
    "simpo": ({"stage": "simpo"}, None),
    "cpo": ({"stage": "cpo"}, None),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_preference_stage_trains_only_its_adapter(pairs_config, tiny_model_dir, captured, assert_only_adapter_trained,
                                                  variant):
    overrides, closed_form = VARIANTS[variant]
    result = run_exp(pairs_config(**overrides))
    out = Path(result.output_dir)
    assert result.global_step == 2 and result.final_loss is not None and math.isfinite(result.final_loss)
    assert_only_adapter_trained(out)
    manifest = json.loads((out / "gym_manifest.json").read_text())
    assert manifest["what"] == "lora-adapter" and manifest["stage"] == overrides.get("stage", "dpo")

    trainer = captured["trainer"]
    # Under LoRA no second model and no copied "ref" adapter: the reference (where there is one) is the base
    # with the adapter disabled, and that base is still the model on disk.
    assert getattr(trainer, "ref_model", None) is None
    assert set(trainer.model.peft_config) == {"default"}
    _assert_disabled_adapter_is_the_base(trainer.model, tiny_model_dir)
    if closed_form is not None:
        assert _step_loss(result, 1) == pytest.approx(closed_form, abs=1e-3 if variant == "dpo-ipo" else 1e-4)
        assert trainer.loss_types == [overrides.get("pref_loss", "sigmoid")]
    elif variant == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        assert isinstance(trainer, ORPOTrainer)
    else:
        from trl.experimental.cpo import CPOTrainer

        assert isinstance(trainer, CPOTrainer)
        if variant == "simpo":  # SimPO = CPO's simpo loss without its SFT term
            assert (trainer.loss_type, trainer.cpo_alpha, trainer.simpo_gamma) == ("simpo", 0.0, 0.5)
        else:  # CPO: the sigmoid loss on policy log-probs plus an SFT term on the chosen answer
            assert (trainer.loss_type, trainer.cpo_alpha) == ("sigmoid", 1.0)


def test_conservative_dpo_starts_at_ln2(pairs_config, captured):
    result = run_exp(pairs_config(dpo_label_smoothing=0.2))
    assert _step_loss(result, 1) == pytest.approx(LN2, abs=1e-4)
    trainer = captured["trainer"]
    assert trainer.loss_types == ["sigmoid", "robust"] and trainer.label_smoothing == pytest.approx(0.2)


def _trl_losses(loss_type: str, z: torch.Tensor, beta: float, eps: float) -> torch.Tensor:
    """TRL 1.16 DPOTrainer's per-sequence losses (dpo_trainer.py, _compute_loss) for a margin z."""
    if loss_type == "sigmoid":  # ignores label_smoothing
        return -F.logsigmoid(beta * z)
    if loss_type == "robust":
        clean = -(1 - eps) * F.logsigmoid(beta * z)
        flipped = -eps * F.logsigmoid(-beta * z)
        return (clean - flipped) / (1 - 2 * eps)
    raise AssertionError(loss_type)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2, 0.45])
def test_dpo_losses_combine_into_conservative_dpo(eps):
    beta = 0.3
    losses, weights = dpo._dpo_losses(dpo.PreferenceOptions(pref_beta=beta, dpo_label_smoothing=eps))
    assert len(losses) == len(weights) and "sft" not in losses
    z = torch.randn(256, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 20
    z.requires_grad_(True)
    combined = sum(w * _trl_losses(name, z, beta, eps) for name, w in zip(losses, weights))
    cdpo = (1 - eps) * -F.logsigmoid(beta * z) + eps * -F.logsigmoid(-beta * z)
    assert torch.allclose(combined, cdpo, atol=1e-10)
    # ... and so are the gradients that train the policy.
    (g_combined,) = torch.autograd.grad(combined.sum(), z)
    (g_cdpo,) = torch.autograd.grad(cdpo.sum(), z)
    assert torch.allclose(g_combined, g_cdpo, atol=1e-10)


@pytest.mark.parametrize(
    ("options", "expected"),
    [({"pref_loss": "ipo"}, (["ipo"], [1.0])),
     ({"pref_loss": "hinge", "pref_ftx": 0.5}, (["hinge", "sft"], [1.0, 0.5])),
     ({"pref_ftx": 0.25}, (["sigmoid", "sft"], [1.0, 0.25])),
     ({"pref_ftx": 0.5, "dpo_label_smoothing": 0.2}, (["sigmoid", "robust", "sft"], [1.6, -0.6, 0.5]))],
)
def test_dpo_losses_add_pref_ftx_as_trl_sft_loss(options, expected):
    losses, weights = dpo._dpo_losses(dpo.PreferenceOptions(**options))
    assert losses == expected[0] and weights == pytest.approx(expected[1])


def test_pref_ftx_adds_the_sft_loss(pairs_config, tokenizer):
    result = run_exp(pairs_config(pref_ftx=0.5))
    # At step 1 the DPO term is ln 2 and the SFT term is the chosen answers' NLL, which for a freshly
    # initialised model is about ln(vocabulary size) per token.
    sft_term = (_step_loss(result, 1) - LN2) / 0.5
    assert sft_term == pytest.approx(math.log(len(tokenizer)), rel=0.05)


def test_precomputed_reference_log_probs(pairs_config, captured):
    result = run_exp(pairs_config(precompute_ref_log_probs=True))
    assert result.global_step == 2
    assert _step_loss(result, 1) == pytest.approx(LN2, abs=1e-4)
    trainer = captured["trainer"]
    assert trainer.precompute_ref_logps and trainer.ref_model is None
    assert "ref_chosen_logps" in trainer.train_dataset.column_names


def test_full_finetuning_against_a_given_reference_model(pairs_config, tiny_model_dir, captured):
    from transformers import AutoModelForCausalLM

    result = run_exp(pairs_config(finetuning_type="full", ref_model=str(tiny_model_dir), learning_rate=1e-3))
    assert _step_loss(result, 1) == pytest.approx(LN2, abs=1e-4)  # the given reference is the starting model
    trainer = captured["trainer"]
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    trained = AutoModelForCausalLM.from_pretrained(result.output_dir).state_dict()
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(base[k], trained[k]) for k in base if "layers" in k)
    assert json.loads((Path(result.output_dir) / "gym_manifest.json").read_text())["what"] == "model"
    # The reference stayed as loaded.
    ref_state = trainer.ref_model.state_dict()
    assert all(torch.equal(base[k], ref_state[k]) for k in base)


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize(
    ("overrides", "match"),
    [({"stage": "simpo", "ref_model": "REF"}, "'ref_model' has no effect: simpo"),
     ({"stage": "orpo", "precompute_ref_log_probs": True}, "'precompute_ref_log_probs' has no effect"),
     ({"stage": "cpo", "ref_model": "REF"}, "'ref_model' has no effect: cpo"),
     ({"dpo_label_smoothing": 0.7}, r"'dpo_label_smoothing' must be in \[0, 0.5\)"),
     ({"dpo_label_smoothing": 0.5}, r"'dpo_label_smoothing' must be in \[0, 0.5\)"),
     ({"pref_beta": 0.0}, "'pref_beta' must be positive"),
     ({"stage": "orpo", "pref_loss": "ipo"}, "stage: orpo uses pref_loss orpo"),
     ({"stage": "simpo", "pref_loss": "hinge"}, "stage: simpo uses pref_loss simpo"),
     ({"stage": "orpo", "pref_ftx": 0.5}, "'pref_ftx' does not apply to orpo")],
    ids=["simpo-ref", "orpo-precompute", "cpo-ref", "smoothing-0.7", "smoothing-0.5", "beta-0", "orpo-ipo",
         "simpo-hinge", "orpo-ftx"],
)
def test_preference_config_errors(pairs_config, tiny_model_dir, overrides, match):
    overrides = {k: (str(tiny_model_dir) if v == "REF" else v) for k, v in overrides.items()}
    with pytest.raises(ConfigError, match=match):
        run_exp(pairs_config(**overrides))


def test_preference_keys_are_refused_under_other_stages(train_config):
    from gym.config.parser import get_train_args

    with pytest.raises(ConfigError, match=r"'pref_beta' applies to stage .*dpo.*, not 'sft'"):
        get_train_args(train_config(pref_beta=0.1))
    with pytest.raises(ConfigError, match=r"'simpo_gamma' applies to stage .*simpo.*, not 'kto'"):
        get_train_args(train_config(stage="kto", simpo_gamma=0.5))
    with pytest.raises(ConfigError, match="Unknown config key 'pref_betta'"):
        get_train_args(train_config(stage="dpo", pref_betta=0.1))
    with pytest.raises(ConfigError, match="'pref_loss' expects one of .*got 'kto'"):
        get_train_args(train_config(stage="dpo", pref_loss="kto"))


def test_pairwise_stage_on_data_without_pairs_says_how_to_fix_it(train_config):
    from gym.core.errors import DataError

    with pytest.raises(DataError, match=r"no preference pairs .*dataset_info\.json.*\"ranking\": true"):
        run_exp(train_config(stage="dpo"))


def _tdpo_reference(logits, ref_logits, ids, mask, beta, alpha):
    """TDPO2 written out position by position, as in the paper's equations."""
    losses = []
    half = ids.shape[0] // 2
    terms = []
    for row in range(ids.shape[0]):
        ratio, kl = 0.0, 0.0
        for t in range(1, ids.shape[1]):
            if not mask[row, t]:
                continue
            p, q = logits[row, t - 1].log_softmax(-1), ref_logits[row, t - 1].log_softmax(-1)
            ratio += float(p[ids[row, t]] - q[ids[row, t]])
            kl += float((q.exp() * (q - p)).sum())
        terms.append((ratio, kl))
    for pair in range(half):
        (rw, kw), (rl, kl) = terms[pair], terms[half + pair]
        losses.append(-math.log(1 / (1 + math.exp(-(beta * (rw - rl) - alpha * beta * (kl - kw))))))
    return losses


def test_tdpo_loss_matches_its_equations():
    from gym.train.tdpo import tdpo_loss, tdpo_terms

    torch.manual_seed(0)
    ids = torch.randint(0, 11, (4, 7))
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0]] * 2 + [[0, 0, 0, 1, 1, 1, 1]] * 2)
    logits, ref_logits = torch.randn(4, 7, 11), torch.randn(4, 7, 11)
    ratio, kl = tdpo_terms(logits, ref_logits, ids, mask)
    ours = tdpo_loss(ratio, kl, beta=0.3, alpha=0.5)
    assert ours.tolist() == pytest.approx(_tdpo_reference(logits, ref_logits, ids, mask, 0.3, 0.5), abs=1e-5)
    # The chosen answer's KL is held fixed (stop-gradient): only the rejected one's is pushed.
    logits.requires_grad_(True)
    ratio, kl = tdpo_terms(logits, ref_logits, ids, mask)
    assert torch.autograd.grad(kl[:2].sum(), logits, retain_graph=True)[0].abs().sum() > 0  # it has a gradient...
    chosen_kl_grad = torch.autograd.grad(tdpo_loss(ratio.detach(), kl, 0.3, 0.5).sum(), logits)[0][:2]
    assert chosen_kl_grad.abs().sum() == 0  # ...which the loss does not use


@pytest.mark.parametrize("keys", [{"stage": "tdpo"}, {"pref_loss": "tdpo", "tdpo_alpha": 1.0}])
def test_tdpo_starts_at_ln2_and_trains_the_adapter(pairs_config, captured, assert_only_adapter_trained, keys):
    result = run_exp(pairs_config(**keys))
    assert _step_loss(result, 1) == pytest.approx(LN2, abs=1e-4)  # policy == reference: u = 0 and both KL = 0
    assert_only_adapter_trained(Path(result.output_dir))
    logged = [e for e in read_log(result.output_dir) if "kl/rejected" in e]
    assert logged and logged[0]["kl/rejected"] == pytest.approx(0, abs=1e-6)
    assert type(captured["trainer"]).__name__ == "TDPOTrainer"
