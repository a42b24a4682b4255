"""`gym merge` against hostile configs (issue #39): a merge that would be inf or NaN is refused before anything is
written, numbers YAML reads as strings are numbers, and an output that is or holds an input is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tests.gym_cli import assert_one_line_error, gym_here

from gym.core.errors import ConfigError
from gym.core.files import MANIFEST_FILE
from gym.merge.config import parse_merge_config


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def finetunes(make_finetune) -> list[Path]:
    """Two full fine-tunes of the tiny base: every block matrix moved by its own seeded Gaussian."""

    def moved(seed: int):
        generator = torch.Generator().manual_seed(seed)

        def change(name: str, param: torch.Tensor) -> None:
            if ".layers." in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)

        return change

    return [make_finetune(moved(1), "a"), make_finetune(moved(2), "b")]


def _write(tmp_path: Path, config: dict, name: str = "merge.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _config(base: Path, models: list[tuple[Path, dict]], out: Path, method: str, **top) -> dict:
    return {"merge_method": method, "base_model": str(base), "output_dir": str(out),
            "models": [{"model": str(m), "parameters": p} for m, p in models], **top}


def test_ties_with_cancelling_weights_at_float16_is_refused_and_writes_nothing(finetunes, tiny_model_dir, tmp_path):
    # The case: inf in half the tensors, and exit 0. normalize divided by 1 - 0.9999999.
    out = tmp_path / "merged"
    file = _write(tmp_path, _config(tiny_model_dir, [(finetunes[0], {"weight": 1}), (finetunes[1],
                                                                                     {"weight": -0.9999999})],
                                    out, "ties", dtype="float16"))
    done = gym_here("merge", file)
    assert_one_line_error(done, "ties with normalize divides each entry by the sum of the weights",
                          "weights of both signs (1.0, -0.9999999)")
    assert not out.exists()


def test_cancelling_weights_are_refused_for_every_normalized_method():
    for method in ("linear", "task_arithmetic", "ties", "dare_ties"):
        config = {"merge_method": method, "base_model": "base", "output_dir": "out",
                  "parameters": {"normalize": True},
                  "models": [{"model": "a", "parameters": {"weight": 1}},
                             {"model": "b", "parameters": {"weight": -0.9999999}}]}
        with pytest.raises(ConfigError, match="normalize divides"):
            parse_merge_config(config)
        parse_merge_config({**config, "parameters": {"normalize": False}})  # subtracting a model is fine


def test_dare_with_a_vanishing_density_is_refused_before_loading(tmp_path):
    # 1e-300 is 0 in float32: every kept entry was divided by 0 (NaN everywhere), and the merge exited 0.
    file = _write(tmp_path, {"merge_method": "dare", "base_model": str(tmp_path / "no-such-base"),
                             "models": [{"model": "a", "parameters": {"density": 1e-300}}],
                             "output_dir": str(tmp_path / "out")})
    done = gym_here("merge", file)
    assert_one_line_error(done, "'models[0].parameters.density' is 1e-300: below 1e-06")
    assert not (tmp_path / "out").exists()


def test_numbers_yaml_reads_as_strings_are_numbers(tmp_path):
    # YAML 1.1 reads 1.0e308, 1e-1 and 5e-1 as strings; mergekit users write them.
    text = ("merge_method: dare\nbase_model: base\noutput_dir: out\nmodels:\n"
            "  - model: a\n    parameters: {weight: 5e-1, density: 1e-1}\nparameters:\n  lambda: 2.0e-1\n")
    args = parse_merge_config(yaml.safe_load(text))
    assert args.lambda_ == 0.2 and args.models[0].weight == 0.5 and args.models[0].density == 0.1
    huge = yaml.safe_load(text.replace("2.0e-1", "1.0e308"))
    assert huge["parameters"]["lambda"] == "1.0e308"  # what PyYAML gives
    with pytest.raises(ConfigError, match=r"'parameters.lambda' is 1e\+308, beyond float32's largest number"):
        parse_merge_config(huge)
    for bad in ("1e308", "nan", ".inf", "-1e39", "lots"):
        with pytest.raises(ConfigError, match="parameters.lambda"):
            parse_merge_config(yaml.safe_load(text.replace("2.0e-1", bad)))


def test_a_merge_past_the_saved_dtype_is_refused_and_the_old_output_kept(finetunes, tiny_model_dir, tmp_path):
    out = tmp_path / "merged"
    good = _write(tmp_path, _config(tiny_model_dir, [(finetunes[0], {})], out, "task_arithmetic", dtype="float16"))
    assert gym_here("merge", good).returncode == 0
    before = _snapshot(out)
    # lambda 1e7 (a string to YAML) times deltas of ~0.02: finite in float32, past float16's 65504.
    file = _write(tmp_path, _config(tiny_model_dir, [(finetunes[0], {})], out, "task_arithmetic",
                                    dtype="float16", overwrite=True, parameters={"lambda": "1e7"}), "huge.yaml")
    done = gym_here("merge", file)
    assert_one_line_error(done, "exceed float16's largest number (6.55e+04) and would be saved as inf",
                          "nothing was written")
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    # Past float32 itself: weights and lambda each finite, their product not.
    file = _write(tmp_path, _config(tiny_model_dir, [(finetunes[0], {"weight": 1e38})], out, "task_arithmetic",
                                    dtype="float32", overwrite=True, parameters={"lambda": 1e38}), "inf.yaml")
    done = gym_here("merge", file)
    assert_one_line_error(done, "gives inf or NaN in model.layers.0")
    assert _snapshot(out) == before


def test_an_output_that_is_or_holds_an_input_is_refused_with_overwrite(finetunes, tiny_model_dir, tmp_path):
    before = _snapshot(finetunes[0])
    for out in (finetunes[0], finetunes[0].parent):
        file = _write(tmp_path, _config(tiny_model_dir, [(finetunes[0], {}), (finetunes[1], {})], out, "ties",
                                        overwrite=True))
        done = gym_here("merge", file)
        assert_one_line_error(done, f"the input {finetunes[0]}: writing it would replace what this command reads")
    assert _snapshot(finetunes[0]) == before


def test_overwrite_replaces_a_merge_but_not_a_folder_with_the_users_files(finetunes, tiny_model_dir, tmp_path):
    out = tmp_path / "merged"
    config = _config(tiny_model_dir, [(finetunes[0], {}), (finetunes[1], {})], out, "ties", overwrite=True)
    assert gym_here("merge", _write(tmp_path, config)).returncode == 0
    listed = json.loads((out / MANIFEST_FILE).read_text())["files"]
    assert "model.safetensors" in listed and "tokenizer.json" in listed
    assert gym_here("merge", _write(tmp_path, config)).returncode == 0  # Gym's own merge: replaced
    (out / "NOTES.md").write_text("my notes on this merge")
    before = _snapshot(out)
    done = gym_here("merge", _write(tmp_path, config))
    assert_one_line_error(done, "holds NOTES.md, which Gym did not write there")
    assert _snapshot(out) == before
    assert set(load_file(out / "model.safetensors")) == set(load_file(tiny_model_dir / "model.safetensors"))


@pytest.mark.parametrize("method", ["slerp", "della", "model_stock", "passthrough"])
def test_mergekits_other_methods_are_named_as_not_implemented(method):
    config = {"merge_method": method, "base_model": "base", "output_dir": "out",
              "models": [{"model": "a"}, {"model": "b"}, {"model": "c"}], "parameters": {"t": 0.5}}
    with pytest.raises(ConfigError, match=f"merge_method {method} is mergekit's, and gym merge does not implement it"):
        parse_merge_config(config)


def test_an_adapter_as_base_model_is_refused_naming_its_own_base(finetunes, tmp_path, capsys):
    from gym.cli import main

    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "base"}))
    file = _write(tmp_path, _config(adapter, [(finetunes[0], {}), (finetunes[1], {})], tmp_path / "out", "ties"))
    assert main(["merge", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert f"base_model {adapter} is a LoRA adapter, not a model: set base_model to the model it was trained on " \
           "(base)" in err
    assert not (tmp_path / "out").exists()
