"""The seeds' `quantization:` and `serving:` blocks and their spellings, as the parser reads them."""

from __future__ import annotations

import pytest

from gym.config import aliases
from gym.config.parser import get_train_args
from gym.core.errors import ConfigError


@pytest.mark.parametrize(("value", "expected"), [
    ("bitdelta", {"delta_compression": "bitdelta"}),
    ("int4", {"delta_compression": "int4"}),
    ({"method": "deltaquant", "bits": 2}, {"delta_compression": "int2"}),
    ({"method": "deltaquant"}, {"delta_compression": "int8"}),
    ({"method": "bitdelta", "bits": 1, "group_size": 128, "safety_threshold": 0.6, "enable_deltasoup": True,
      "distill_steps": 5},
     {"delta_compression": "bitdelta", "delta_group_size": 128, "delta_safety_threshold": 0.6,
      "delta_enable_deltasoup": True, "delta_distill_steps": 5}),
])
def test_quantization_becomes_the_delta_keys(value, expected):
    assert aliases.canonical({"quantization": value, "stage": "sft"}) == {"stage": "sft", **expected}


@pytest.mark.parametrize(("config", "match"), [
    ({"quantization": 4}, "quantization_bit: 4"),
    ({"quantization": {"method": "bitdelta", "bits": 4}}, "method: deltaquant"),
    ({"quantization": {"method": "int4", "bits": 8}}, "disagree"),
    ({"quantization": {"method": "bitdetla"}}, "Did you mean 'bitdelta'"),
    ({"quantization": {"metod": "bitdelta"}}, "Unknown key 'quantization.metod'. Did you mean 'method'"),
    ({"quantization": {"bits": 1}}, "needs a method"),
    ({"quantization": "bitdelta", "delta_compression": "int8"}, "keep one"),
    ({"delta_enable_deltasoup": True}, "set delta_compression"),
    ({"quantization": {"method": "int8", "safety_threshold": 0.5}}, "applies to delta_compression: bitdelta"),
])
def test_quantization_mistakes_are_named(config, match):
    with pytest.raises(ConfigError, match=match):
        get_train_args(config)


def test_serving_becomes_engine_keys_and_server_options():
    block = {"model_format": "gguf", "quantization": "int8", "batch_size": 8, "max_concurrent": 20,
             "cache_size": "512MB"}
    assert aliases.canonical({"serving": block}) == {"infer_backend": "llamacpp", "infer_dtype": "int8",
                                                  "infer_prefix_cache_mb": 512}
    assert aliases.server_options({"serving": block}) == {"batch_size": 8, "max_concurrent": 20}
    assert aliases.canonical({"serving": {"model_format": "hf"}}) == {}  # the default engine choice stands
    assert aliases.megabytes("1.5GB") == 1536 and aliases.megabytes(300) == 300


def test_a_key_on_the_command_line_wins_over_a_block_in_the_file(tmp_path):
    """In one file two spellings must agree; a flag given on the command line overrides the file, blocks included."""
    from gym.config.files import parse_cli_args

    config = tmp_path / "serve.yaml"
    config.write_text("serving: {quantization: int4, cache_size: 10GB, batch_size: 32}\n"
                      "quantization: {method: deltaquant, bits: 4, group_size: 64}\n")
    with pytest.raises(ConfigError, match="'serving:' sets 'infer_dtype: int4', and the config also has"):
        aliases.canonical({**parse_cli_args([str(config)]), "infer_dtype": "int8"})
    given = parse_cli_args([str(config), "--infer_dtype", "int8", "--infer-prefix-cache-mb", "64",
                            "delta_compression=int8"])
    flat = aliases.canonical(given)
    assert (flat["infer_dtype"], flat["infer_prefix_cache_mb"]) == ("int8", 64)
    assert (flat["delta_compression"], flat["delta_group_size"]) == ("int8", 64)  # the block's other entries stand
    assert aliases.server_options(given) == {"batch_size": 32}
    only_block = parse_cli_args([str(config), "delta_compression=int8", "delta_group_size=32", "infer_dtype=int8",
                                 "infer_prefix_cache_mb=1"])
    assert "quantization" not in only_block and set(only_block["serving"]) == {"batch_size"}


@pytest.mark.parametrize(("block", "match"), [
    ({"cache": "1GB"}, "Unknown key 'serving.cache'. Did you mean 'cache_size'"),
    ({"cache_size": "lots"}, "a size such as 10GB"),
    ({"quantization": "int3"}, "serving.quantization' is one of"),
    ({"model_format": "onnx"}, "serving.model_format' is one of"),
    ({"batch_size": 0}, "at least 1"),
])
def test_serving_mistakes_are_named(block, match):
    with pytest.raises(ConfigError, match=match):
        get_train_args({"serving": block})


@pytest.mark.parametrize("value", [False, 1, "false"])
def test_sequence_parallel_off_is_accepted(value):
    get_train_args({"sequence_parallel": value})


@pytest.mark.parametrize(("key", "value"), [("sequence_parallel", True), ("sequence_parallel_size", 4)])
def test_sequence_parallel_on_names_what_would_provide_it(key, value):
    with pytest.raises(ConfigError, match="DeepSpeed-Ulysses"):
        get_train_args({key: value})


def test_seed_spellings():
    args = get_train_args({"stage": "grpo", "group_size": 4, "reward_funcs": ["accuracy"],
                           "per_device_train_batch_size": 4, "quantization_method": "bitsandbytes"})
    assert args.options.num_generations == 4 and args.model.quantization_method == "bnb"
