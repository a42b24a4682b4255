"""`gym merge`: every method against a merge computed by hand on the tiny model's tensors, LoRA adapters merged
exactly (peft's `cat` path and the fold-into-the-base path), a loadable output, and the errors a user meets.

The expected values are written here with plain torch, from the saved files, never through gym.merge: a
change in what a method computes fails a test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from gym.cli.merge import main
from gym.core.errors import ConfigError, OutputError
from gym.core.files import MANIFEST_FILE
from gym.merge.config import parse_merge_config
from gym.merge.methods import merge_parameter
from gym.merge.run import PEFT_PATH, STATE_DICT_PATH, merge_models

REPO = Path(__file__).resolve().parents[2]
Q0 = "model.layers.0.self_attn.q_proj.weight"
UP1 = "model.layers.1.mlp.up_proj.weight"


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def base(tiny_model_dir) -> dict[str, torch.Tensor]:
    return weights(tiny_model_dir)


@pytest.fixture(scope="module")
def full(tiny_model_dir, tmp_path_factory) -> list[Path]:
    """Two full fine-tunes: every block matrix and norm moved by its own seeded Gaussian (embeddings untouched),
    so the two disagree in sign on about half the entries. Saved with the tokenizer, as `gym train` saves them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folders = []
    for seed in (1, 2):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".layers." in name:
                    param.add_(torch.randn(param.shape, generator=generator) * 0.02)
        folder = tmp_path_factory.mktemp(f"full{seed}")
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
        folders.append(folder)
    return folders


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> list[tuple[Path, float]]:
    """Two LoRA adapters on q_proj and v_proj (ranks 4 and 2, scales 2 and 0.5) with seeded nonzero A and B,
    trained (says their gym_config.yaml) with the llama3 template: (folder, alpha / r)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    made = []
    for seed, rank, alpha in ((1, 4, 8), (2, 2, 1)):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                               LoraConfig(r=rank, lora_alpha=alpha, target_modules=["q_proj", "v_proj"]))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        folder = tmp_path_factory.mktemp(f"lora{seed}")
        model.save_pretrained(folder)
        (folder / "gym_config.yaml").write_text(yaml.safe_dump({"template": "llama3", "stage": "sft"}))
        made.append((folder, alpha / rank))
    return made


def lora_delta(folder: Path, scale: float, module: str) -> torch.Tensor:
    """scale * B @ A of `module` (e.g. model.layers.0.self_attn.q_proj), from the adapter file."""
    tensors = load_file(folder / "adapter_model.safetensors")
    prefix = f"base_model.model.{module}"
    return scale * tensors[f"{prefix}.lora_B.weight"] @ tensors[f"{prefix}.lora_A.weight"]


def config(out: Path, method: str, models: list[tuple[Path, dict]], base_model: Path | None, **extra) -> dict:
    return {"merge_method": method, "models": [{"model": str(m), "parameters": p} for m, p in models],
            "output_dir": str(out), "dtype": "float32", **({"base_model": str(base_model)} if base_model else {}),
            **extra}


# -- TIES by hand, on small known tensors ------------------------------------------------------------------
T1 = torch.tensor([1.0, -2.0, 0.5, 3.0, -0.1])
T2 = torch.tensor([-1.5, 1.0, 0.4, 2.0, -0.3])
T3 = torch.tensor([2.0, -0.5, -3.0, 0.2, -0.2])


def small(method: str, weights: list[float], density: float, **parameters) -> dict:
    return {"merge_method": method, "base_model": "base", "output_dir": "unused", "parameters": parameters,
            "models": [{"model": f"m{i}", "parameters": {"weight": w, "density": density}}
                       for i, w in enumerate(weights)]}


def test_ties_trims_elects_and_takes_the_disjoint_mean_by_hand():
    base = torch.full((5,), 10.0)
    # density 0.6 keeps 3 of 5: T1 -> [1, -2, 0, 3, 0], T2 -> [-1.5, 1, 0, 2, 0], T3 -> [2, -0.5, -3, 0, 0].
    # Signs elected by the sums [1.5, -1.5, -3, 5, 0] -> + - - + +; agreeing values averaged:
    # (1 + 2) / 2, (-2 - 0.5) / 2, -3, (3 + 2) / 2, nothing (0).
    merged = merge_parameter(parse_merge_config(small("ties", [1, 1, 1], 0.6)), "w", base,
                             [base + T1, base + T2, base + T3])
    assert torch.allclose(merged - base, torch.tensor([1.5, -1.25, -3.0, 2.5, 0.0]))

    # Weights 0.5, 1, 0.25: the weighted trimmed deltas are [0.5, -1, 0, 1.5, 0], [-1.5, 1, 0, 2, 0] and
    # [0.5, -0.125, -0.75, 0, 0]; their sums [-0.5, -0.125, -0.75, 3.5, 0] elect - - - + (entry 0 flips: the
    # unweighted sum was +1.5). Without normalize: the sum of the agreeing weighted values.
    weighted = [0.5, 1.0, 0.25]
    merged = merge_parameter(parse_merge_config(small("ties", weighted, 0.6, normalize=False)), "w", base,
                             [base + T1, base + T2, base + T3])
    assert torch.allclose(merged - base, torch.tensor([-1.5, -1.125, -0.75, 3.5, 0.0]))
    # With normalize (ties' default): divided by the agreeing weights 1, 0.75, 0.25, 1.5.
    merged = merge_parameter(parse_merge_config(small("ties", weighted, 0.6)), "w", base,
                             [base + T1, base + T2, base + T3])
    assert torch.allclose(merged - base, torch.tensor([-1.5, -1.5, -3.0, 3.5 / 1.5, 0.0]))


def test_linear_task_arithmetic_and_dare_by_hand_on_small_tensors():
    base = torch.full((5,), 1.0)
    models = [base + T1, base + T2]
    linear = merge_parameter(parse_merge_config(small("linear", [1, 3], 1.0)), "w", base, models)
    assert torch.allclose(linear, (models[0] + 3 * models[1]) / 4)
    task = merge_parameter(parse_merge_config(small("task_arithmetic", [1, 3], 1.0, **{"lambda": 0.5})), "w",
                           base, models)
    assert torch.allclose(task, base + 0.5 * (T1 + 3 * T2))
    # DARE at density 1 drops nothing: task arithmetic exactly; dare_ties at density 1 is ties without trimming.
    assert torch.equal(merge_parameter(parse_merge_config(small("dare", [1, 3], 1.0, **{"lambda": 0.5})), "w",
                                       base, models), task)
    dare_ties = merge_parameter(parse_merge_config(small("dare_ties", [1, 1], 1.0, normalize=True)), "w", base,
                                models)
    assert torch.allclose(dare_ties - base, torch.tensor([-1.5, -2.0, 0.45, 2.5, -0.2]))


def test_dare_drops_with_the_density_rescales_and_is_reproducible():
    delta = torch.randn(200, 100, generator=torch.Generator().manual_seed(0))
    base = torch.zeros_like(delta)
    args = parse_merge_config(small("dare", [1.0], 0.3))
    merged = merge_parameter(args, "w", base, [base + delta])
    kept = merged != 0
    assert abs(kept.float().mean().item() - 0.3) < 0.02
    assert torch.allclose(merged[kept], delta[kept] / 0.3)  # each kept entry rescaled by 1 / density
    assert torch.equal(merge_parameter(args, "w", base, [base + delta]), merged)  # same seed, same merge
    other = merge_parameter(parse_merge_config({**small("dare", [1.0], 0.3), "seed": 1}), "w", base, [base + delta])
    assert not torch.equal(other, merged)
    assert not torch.equal(merge_parameter(args, "other-name", base, [base + delta]), merged)  # a mask per tensor


# -- whole-model merges of full fine-tunes -----------------------------------------------------------------
def test_linear_merge_of_full_models_loads_generates_and_chats(full, base, tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file = tmp_path / "linear.yaml"
    file.write_text(yaml.safe_dump(config(tmp_path / "unused", "linear", [(full[0], {"weight": 1}),
                                                                        (full[1], {"weight": 3})], None)))
    out = tmp_path / "merged"
    assert main([str(file), f"output_dir={out}"]) == 0
    assert f"Merged into {out}" in capsys.readouterr().out
    merged, a, b = weights(out), weights(full[0]), weights(full[1])
    assert set(merged) == set(base)
    for name in base:
        assert torch.allclose(merged[name], (a[name] + 3 * b[name]) / 4, atol=1e-6), name
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["merged_with"] == STATE_DICT_PATH and manifest["merge"]["merge_method"] == "linear"

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    generated = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert generated.shape == (1, ids.shape[1] + 3)

    with pytest.raises(OutputError, match="overwrite: true"):  # refused before any model loads
        main([str(file), f"output_dir={out}"])
    assert main([str(file), f"output_dir={out}", "merge_method=task_arithmetic", f"base_model={tiny_model_dir}",
                 "--overwrite"]) == 0
    assert json.loads((out / MANIFEST_FILE).read_text())["merge"]["merge_method"] == "task_arithmetic"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def reference_ties(base: torch.Tensor, models: list[torch.Tensor], weights: list[float],
                   densities: list[float]) -> torch.Tensor:
    """TIES as the paper states it, weighted as mergekit weights it (normalize on), with a sorted threshold."""
    kept = []
    for theta, w, density in zip(models, weights, densities):
        delta = theta - base
        threshold = delta.abs().flatten().sort(descending=True).values[int(density * delta.numel()) - 1]
        kept.append(w * torch.where(delta.abs() >= threshold, delta, torch.zeros_like(delta)))
    sign = torch.where(sum(kept) >= 0, 1.0, -1.0)
    agree = [torch.sign(k) == sign for k in kept]
    total = sum(torch.where(a, k, 0.0) for a, k in zip(agree, kept))
    mass = sum(torch.where(a, w, 0.0) for a, w in zip(agree, weights))
    return base + total / torch.where(mass == 0, 1.0, mass)


def test_ties_and_dare_on_the_whole_model(full, base, tiny_model_dir, tmp_path):
    models = [(full[0], {"weight": 0.6, "density": 0.5}), (full[1], {"weight": 0.4, "density": 0.7})]
    out = merge_models(config(tmp_path / "ties", "ties", models, tiny_model_dir))
    merged, a, b = weights(out), weights(full[0]), weights(full[1])
    for name in (Q0, UP1, "model.norm.weight"):
        expected = reference_ties(base[name], [a[name], b[name]], [0.6, 0.4], [0.5, 0.7])
        assert torch.allclose(merged[name], expected, atol=1e-6), name
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # no delta

    out = merge_models(config(tmp_path / "dare", "dare", models, tiny_model_dir, seed=3))
    merged = weights(out)
    for name in (Q0, UP1):
        da, db = a[name] - base[name], b[name] - base[name]
        got = merged[name] - base[name]
        # Each entry keeps model a's rescaled term or not, and model b's or not: one of four values.
        options = torch.stack([torch.zeros_like(da), 0.6 * da / 0.5, 0.4 * db / 0.7, 0.6 * da / 0.5 + 0.4 * db / 0.7])
        closest = (options - got).abs().argmin(dim=0)
        assert torch.allclose(options.gather(0, closest[None])[0], got, atol=1e-6), name
        kept_a, kept_b = (closest % 2 == 1).float().mean().item(), (closest >= 2).float().mean().item()
        assert abs(kept_a - 0.5) < 0.05 and abs(kept_b - 0.7) < 0.05, (kept_a, kept_b)


def test_task_arithmetic_of_full_models(full, base, tiny_model_dir, tmp_path):
    models = [(full[0], {"weight": 0.7}), (full[1], {"weight": -0.2})]
    out = merge_models(config(tmp_path / "ta", "task_arithmetic", models, tiny_model_dir,
                              parameters={"lambda": 2.0}))
    merged, a, b = weights(out), weights(full[0]), weights(full[1])
    for name in base:
        expected = base[name] + 2.0 * (0.7 * (a[name] - base[name]) - 0.2 * (b[name] - base[name]))
        assert torch.allclose(merged[name], expected, atol=1e-6), name


# -- LoRA adapters -----------------------------------------------------------------------------------------
MODULES = [f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")]


def test_lora_adapters_merge_linearly_through_peft_exactly(adapters, base, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    (first, scale1), (second, scale2) = adapters
    out = merge_models(config(tmp_path / "lora", "linear", [(first, {"weight": 0.6}), (second, {"weight": 1.4})],
                              tiny_model_dir))
    merged = weights(out)
    for module in MODULES:
        name = f"{module}.weight"
        expected = base[name] + 0.3 * lora_delta(first, scale1, module) + 0.7 * lora_delta(second, scale2, module)
        assert torch.allclose(merged[name], expected, atol=1e-6), name
    for name in set(base) - {f"{m}.weight" for m in MODULES}:
        assert torch.equal(merged[name], base[name]), name
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["merged_with"] == PEFT_PATH and manifest["chat_template"] == "llama3"
    text = AutoTokenizer.from_pretrained(out).apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert "<|start_header_id|>user<|end_header_id|>" in text  # prompted as the adapters were trained


def test_lora_adapters_fold_into_the_base_for_ties(adapters, base, tiny_model_dir, tmp_path):
    (first, scale1), (second, scale2) = adapters
    models = [(first, {"weight": 1.0, "density": 0.4}), (second, {"weight": 1.0, "density": 0.4})]
    out = merge_models(config(tmp_path / "lora-ties", "ties", models, tiny_model_dir))
    merged = weights(out)
    for module in MODULES[:2]:
        name = f"{module}.weight"
        folded = [base[name] + lora_delta(first, scale1, module), base[name] + lora_delta(second, scale2, module)]
        expected = reference_ties(base[name], folded, [1.0, 1.0], [0.4, 0.4])
        assert torch.allclose(merged[name], expected, atol=1e-6), name
    assert torch.equal(merged[UP1], base[UP1])
    assert json.loads((out / MANIFEST_FILE).read_text())["merged_with"] == STATE_DICT_PATH


# -- errors ------------------------------------------------------------------------------------------------
def test_unknown_keys_are_refused_with_the_closest_valid_one():
    good = small("ties", [1, 1], 0.5)
    with pytest.raises(ConfigError, match="'merge_methd'.*Did you mean 'merge_method'"):
        parse_merge_config({**{k: v for k, v in good.items() if k != "merge_method"}, "merge_methd": "ties"})
    with pytest.raises(ConfigError, match="Did you mean 'weight'"):
        parse_merge_config({**good, "models": [{"model": "a", "parameters": {"wieght": 1}}]})
    with pytest.raises(ConfigError, match="Did you mean 'normalize'"):
        parse_merge_config({**good, "parameters.normalise": True})
    with pytest.raises(ConfigError, match="Did you mean 'ties'"):
        parse_merge_config({**good, "merge_method": "tie"})
    with pytest.raises(ConfigError, match="set base_model"):
        parse_merge_config({k: v for k, v in good.items() if k != "base_model"})
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        parse_merge_config({**good, "parameters": {"density": 0}})
    assert parse_merge_config({**good, "parameters.normalize": False}).normalize is False


def test_a_model_of_another_shape_is_refused_naming_it_and_the_tensor(full, tiny_model_dir, tmp_path):
    odd = tmp_path / "odd"
    odd.mkdir()
    shutil.copy(full[0] / "config.json", odd / "config.json")
    tensors = weights(full[0])
    tensors[UP1] = tensors[UP1][:96]
    save_file(tensors, odd / "model.safetensors")
    with pytest.raises(ConfigError, match=f"{odd}: {UP1} has shape \\(96, 64\\)"):
        merge_models(config(tmp_path / "out", "ties", [(full[0], {}), (odd, {})], tiny_model_dir))
    assert not (tmp_path / "out").exists()


def test_an_adapter_of_another_base_is_refused(adapters, tiny_model_dir, tmp_path):
    moved = tmp_path / "other-base-adapter"
    shutil.copytree(adapters[0][0], moved)
    settings = json.loads((moved / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = "someone/another-model"
    (moved / "adapter_config.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match="trained on someone/another-model"):
        merge_models(config(tmp_path / "out", "linear", [(adapters[1][0], {}), (moved, {})], tiny_model_dir))


def test_an_existing_output_is_kept(tmp_path):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "model.safetensors").write_text("precious")
    with pytest.raises(OutputError, match="overwrite: true"):
        merge_models(config(out, "linear", [(tmp_path / "a", {})], None))
    assert (out / "model.safetensors").read_text() == "precious"


def test_the_example_config_parses():
    args = parse_merge_config(yaml.safe_load((REPO / "examples" / "merge" / "ties.yaml").read_text()))
    assert args.merge_method.value == "ties" and len(args.models) == 2
