"""The packed-weight cache (gym.infer.fast.pack_cache): written on the first start, read on the next without
packing anything, bit-identical to packing, and never trusted when the weights, the file or the folder say
otherwise."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from gym.infer.fast import kernels, pack_cache
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.linear import FastLinear
from gym.infer.fast.pack_cache import FOLDER, PackCache, cache_folders

PROMPT = [1, 400, 1200, 87, 3000, 25]


@pytest.fixture()
def model_dir(tiny_model_dir, tmp_path, monkeypatch) -> Path:
    """A private copy of the tiny model (its folder receives the cache) and a private $GYM_HOME (the kernels
    loaded first from the real one, where they are built once per machine)."""
    kernels.kernel_status()
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GYM_PACK_CACHE", raising=False)
    # Without any cache that another test's engine wrote beside the shared tiny model.
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model", ignore=shutil.ignore_patterns(FOLDER)))


@pytest.fixture()
def pack_calls(monkeypatch) -> list[str]:
    """The names of the kernels' packing functions, once per call."""
    calls: list[str] = []
    for name in ("pack_int8", "pack_int4"):
        original = getattr(kernels, name)

        def counting(weight: torch.Tensor, _name: str = name, _original: Callable = original):
            calls.append(_name)
            return _original(weight)

        monkeypatch.setattr(kernels, name, counting)
    return calls


def load(folder: Path):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def start(folder: Path, dtype: str) -> tuple[FastDecoder, PackCache]:
    """What an engine start does: the model from its folder, its decoder through the folder's cache."""
    packed = PackCache.for_model(folder, dtype)
    assert packed is not None
    return FastDecoder(load(folder), dtype, slots=1, packed=packed), packed


def linears(decoder: FastDecoder) -> list[FastLinear]:
    return [decoder.head] + [lin for layer in decoder.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]


def greedy(decoder: FastDecoder, tokens: int = 8) -> list[int]:
    logits = decoder.prefill(0, PROMPT, 0)
    answer = [int(logits.argmax())]
    for _ in range(tokens - 1):
        logits = decoder.decode([answer[-1]], [len(PROMPT) + len(answer) - 1])[0]
        answer.append(int(logits.argmax()))
    return answer


def cache_files(folder: Path) -> list[Path]:
    return sorted(path for place in cache_folders(folder) for path in place.glob("*.safetensors"))


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_cache_is_written_once_then_read_without_packing_bit_identical(model_dir, pack_calls, dtype):
    fresh, first = start(model_dir, dtype)
    assert pack_calls and first.packed == 0  # packed this time, and saved
    (written,) = cache_files(model_dir)
    assert written.parent == model_dir / pack_cache.FOLDER
    stamp = written.stat().st_mtime_ns

    pack_calls.clear()
    cached, second = start(model_dir, dtype)
    assert pack_calls == []
    assert second.hits == len(linears(cached))
    assert cache_files(model_dir) == [written] and written.stat().st_mtime_ns == stamp  # not written again
    for a, b in zip(linears(fresh), linears(cached), strict=True):
        assert (a.dtype, a.in_features, a.out_features) == (b.dtype, b.in_features, b.out_features)
        assert a.weight.dtype == b.weight.dtype and torch.equal(a.weight, b.weight)
        assert a.scale is not None and b.scale is not None and torch.equal(a.scale, b.scale)
    assert greedy(cached) == greedy(fresh)
    assert torch.equal(cached.prefill(0, PROMPT, 0, every_position=True),
                       fresh.prefill(0, PROMPT, 0, every_position=True))


def test_a_changed_weight_file_invalidates_the_cache(model_dir, pack_calls):
    before, _ = start(model_dir, "int8")
    (old,) = cache_files(model_dir)
    weights_file = model_dir / "model.safetensors"
    tensors = load_file(weights_file)
    name = next(key for key in tensors if key.endswith("layers.0.mlp.down_proj.weight"))
    tensors[name] = tensors[name] + 0.05
    save_file(tensors, weights_file, metadata={"format": "pt"})

    pack_calls.clear()
    after, packed = start(model_dir, "int8")
    assert len(pack_calls) == len(linears(after)) and packed.hits == 0
    (new,) = cache_files(model_dir)  # the stale file is gone, the new one keyed by the new weights
    assert new != old
    assert not torch.equal(after.layers[0].down.weight, before.layers[0].down.weight)
    pack_calls.clear()
    start(model_dir, "int8")
    assert pack_calls == []


def test_weights_that_differ_from_the_files_are_packed_not_read_from_the_cache(model_dir, pack_calls):
    """The key names the files; an in-memory model that is not them (an adapter merged by a caller that did not
    say so) still misses, by the sampled values each entry keeps."""
    start(model_dir, "int8")
    model = load(model_dir)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(1.5)
    pack_calls.clear()
    packed = PackCache.for_model(model_dir, "int8")
    decoder = FastDecoder(model, "int8", slots=1, packed=packed)
    assert pack_calls == ["pack_int8"]  # the changed product only
    assert torch.equal(decoder.layers[1].o.weight, kernels.pack_int8(model.model.layers[1].self_attn.o_proj.weight)[0])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # in the last tensor's bytes: the header still parses
    path.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a safetensors file")


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte, _garbage], ids=["truncated", "flipped", "garbage"])
def test_a_corrupt_cache_file_is_packed_again_without_error(model_dir, pack_calls, damage):
    reference, _ = start(model_dir, "int8")
    (written,) = cache_files(model_dir)
    damage(written)

    pack_calls.clear()
    rebuilt, packed = start(model_dir, "int8")
    assert len(pack_calls) == len(linears(rebuilt)) and packed.hits == 0
    for a, b in zip(linears(reference), linears(rebuilt), strict=True):
        assert torch.equal(a.weight, b.weight)
    pack_calls.clear()
    start(model_dir, "int8")  # and the file written again is whole
    assert pack_calls == []


def test_an_unwritable_model_folder_falls_back_to_gym_home(model_dir, pack_calls, monkeypatch):
    mkstemp = tempfile.mkstemp

    def refusing(*args, dir=None, **options):
        # chmod does not stop root, who runs these tests in CI: refuse the model's folder as EACCES would.
        if dir is not None and Path(dir).is_relative_to(model_dir):
            raise PermissionError(13, "Permission denied", str(dir))
        return mkstemp(*args, dir=dir, **options)

    monkeypatch.setattr(tempfile, "mkstemp", refusing)
    start(model_dir, "int8")
    (written,) = cache_files(model_dir)
    assert written.parent == cache_folders(model_dir)[1]
    assert written.is_relative_to(Path(str(pack_cache.gym_home())))
    assert not list((model_dir / pack_cache.FOLDER).glob("*.safetensors"))

    pack_calls.clear()
    start(model_dir, "int8")
    assert pack_calls == []


def test_the_cache_is_off_for_float_formats_foreign_folders_and_GYM_PACK_CACHE_0(model_dir, tmp_path, monkeypatch):
    assert PackCache.for_model(model_dir, "float32") is None
    assert PackCache.for_model(None, "int8") is None
    assert PackCache.for_model(tmp_path / "no-such-model", "int8") is None
    monkeypatch.setenv("GYM_PACK_CACHE", "0")
    assert PackCache.for_model(model_dir, "int8") is None


def test_chat_caches_a_plain_model_beside_it(model_dir, pack_calls):
    """The door: ChatModel hands the fast engine its model folder, and a second ChatModel packs nothing."""
    from gym.infer.chat import ChatModel

    config = {"model_name_or_path": str(model_dir), "infer_backend": "fast", "infer_dtype": "int8",
              "do_sample": False, "max_new_tokens": 4}
    first = ChatModel(config)
    try:
        answer = first.chat([{"role": "user", "content": "Hi"}])
    finally:
        first.close()
    assert pack_calls and cache_files(model_dir)
    pack_calls.clear()
    second = ChatModel(config)
    try:
        assert second.chat([{"role": "user", "content": "Hi"}]) == answer
    finally:
        second.close()
    assert pack_calls == []


@pytest.mark.parametrize("model_mode", [0o644, 0o640, 0o600])
def test_the_cache_file_is_readable_by_whoever_may_read_the_model(model_dir, model_mode):
    (model_dir / "model.safetensors").chmod(model_mode)
    start(model_dir, "int8")
    (written,) = cache_files(model_dir)
    assert written.stat().st_mode & 0o777 == 0o600 | (model_mode & 0o444)
