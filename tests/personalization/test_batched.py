"""The correctness oracle of batched variants: in one decode step (and one prefill) mixing the base and
several variants - 1-bit (BitDelta, per matrix and per group), DeltaQuant int4, a LoRA adapter - every
row's logits equal those of its own merged model (gym delta apply / PEFT merge), whichever rows share
the batch; and the packed kernel, the unpacked cache and an evicting cache all give the same numbers."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from gym.delta.apply import apply_delta
from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.delta.format import load_delta
from gym.infer.fast import kernels
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.deltas import UnpackedCache, compile_variant
from gym.personalization.loading import deltas_from_adapter, deltas_from_file

TOKENS = [[11, 205, 3001, 42, 7], [500, 501, 502], [9, 8, 7, 6, 5, 4], [1234, 77], [300, 301, 302, 303]]


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _finetune(base, seed: int):
    """The base with every parameter moved (linears, embedding, norms): what a full fine-tune changes."""
    tuned = _load(base.config._name_or_path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in tuned.named_parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.02)
    return tuned


@pytest.fixture(scope="module")
def variants(tiny_model_dir, tmp_path_factory):
    """name -> (per-parameter deltas, the merged model) for four variants of the tiny base."""
    folder = tmp_path_factory.mktemp("variants")
    base = _load(tiny_model_dir)
    made = {}
    for name, quantizer, seed in (
            ("bit", BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)), 1),
            ("bit-groups", BitDeltaQuantizer(BitDeltaConfig(distill_steps=0, group_size=32)), 2),
            ("int4", DeltaQuantizer(DeltaQuantConfig(method="int4")), 3)):
        path = quantizer.compress(base, _finetune(base, seed), progress=False).save(folder / f"{name}.safetensors")
        entries, header = load_delta(path)
        made[name] = (deltas_from_file(path)[0], apply_delta(_load(tiny_model_dir), entries, header, path))
    torch.manual_seed(4)
    lora = get_peft_model(_load(tiny_model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                                               "down_proj"]))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    lora.save_pretrained(folder / "lora")
    made["lora"] = (deltas_from_adapter(folder / "lora"), lora.merge_and_unload().eval())
    return base, made


def _decoders(base, made, cache_mb: int):
    cache = UnpackedCache(cache_mb << 20)
    compiled = {name: compile_variant(name, "1", deltas, base, cache) for name, (deltas, _) in made.items()}
    return FastDecoder(base, "float32", slots=8), compiled, cache


def _decode_all(decoder, rows):
    """Prefill each row's prompt into its own slot, then one decode step for all: the logits of both."""
    first = [decoder.prefill(slot, tokens, 0, variant=variant) for slot, (tokens, variant) in enumerate(rows)]
    step = decoder.decode([tokens[-1] for tokens, _ in rows], [len(tokens) for tokens, _ in rows],
                          [variant for _, variant in rows])
    return torch.stack(first), step


def _alone(model, tokens):
    decoder = FastDecoder(model, "float32", slots=1)
    return _decode_all(decoder, [(tokens, None)])


@pytest.mark.parametrize("cache_mb", [256, 0])
def test_mixed_batch_rows_equal_their_merged_models(variants, cache_mb):
    base, made = variants
    decoder, compiled, _ = _decoders(base, made, cache_mb)
    names = [None, "bit", "bit-groups", "int4", "lora"]
    rows = [(tokens, compiled[name] if name else None) for tokens, name in zip(TOKENS, names)]
    prefill, step = _decode_all(decoder, rows)
    for index, (tokens, name) in enumerate(zip(TOKENS, names)):
        merged = base if name is None else made[name][1]
        want_prefill, want_step = _alone(merged, tokens)
        torch.testing.assert_close(prefill[index], want_prefill[0], atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(step[index], want_step[0], atol=2e-4, rtol=1e-4)
        if name is not None:  # and the variant really answers differently from the base
            assert (step[index] - _alone(base, tokens)[1][0]).abs().max() > 1e-2


def test_consecutive_steps_reuse_their_plans_only_while_the_rows_variants_stay(variants):
    """A decode step keeps the previous step's per-projection plans while every row has the same variant; a
    reordered batch, or a variant switched to its unpacked matrices, gets new ones and the right numbers."""
    base, made = variants
    decoder, compiled, _ = _decoders(base, made, 256)
    bit, lora = compiled["bit"], compiled["lora"]
    _decode_all(decoder, [(TOKENS[0], bit), (TOKENS[1], lora)])
    kept = decoder._last_deltas
    decoder.decode([5, 6], [len(TOKENS[0]) + 1, len(TOKENS[1]) + 1], [bit, lora])
    assert decoder._last_deltas is kept
    swapped = decoder.decode([5, 6], [len(TOKENS[0]) + 2, len(TOKENS[1]) + 2], [lora, bit])
    assert decoder._last_deltas is not kept
    fresh, compiled_again, _ = _decoders(base, made, 256)
    _decode_all(fresh, [(TOKENS[0], compiled_again["bit"]), (TOKENS[1], compiled_again["lora"])])
    fresh.decode([5, 6], [len(TOKENS[0]) + 1, len(TOKENS[1]) + 1], [compiled_again["bit"], compiled_again["lora"]])
    want = fresh.decode([5, 6], [len(TOKENS[0]) + 2, len(TOKENS[1]) + 2],
                        [compiled_again["lora"], compiled_again["bit"]])
    torch.testing.assert_close(swapped, want, atol=1e-5, rtol=1e-5)
    kept = decoder._last_deltas
    bit.packed = False  # the same objects, another path: the plans must not be reused
    try:
        unpacked = decoder.decode([7, 8], [len(TOKENS[0]) + 3, len(TOKENS[1]) + 3], [lora, bit])
    finally:
        bit.packed = True
    assert decoder._last_deltas is not kept
    compiled_again["bit"].packed = False
    want = fresh.decode([7, 8], [len(TOKENS[0]) + 3, len(TOKENS[1]) + 3],
                        [compiled_again["lora"], compiled_again["bit"]])
    torch.testing.assert_close(unpacked, want, atol=1e-5, rtol=1e-5)


def test_a_rows_answer_does_not_depend_on_its_neighbours(variants):
    base, made = variants
    decoder, compiled, _ = _decoders(base, made, 256)
    together = _decode_all(decoder, [(TOKENS[0], compiled["bit"]), (TOKENS[1], compiled["lora"]),
                                     (TOKENS[2], compiled["bit"])])[1]
    decoder, compiled, _ = _decoders(base, made, 256)
    alone = _decode_all(decoder, [(TOKENS[2], compiled["bit"])])[1]
    torch.testing.assert_close(together[2], alone[0], atol=1e-5, rtol=1e-5)


def test_merged_model_matches_transformers(variants):
    """The oracle's own footing: the fast decoder on a merged model gives transformers' logits."""
    _, made = variants
    model = made["bit"][1]
    with torch.no_grad():
        want = model(torch.tensor([TOKENS[0]])).logits[0, -1]
    torch.testing.assert_close(_alone(model, TOKENS[0])[0][0], want, atol=2e-4, rtol=1e-4)


def test_an_evicting_cache_keeps_answers_identical(variants):
    """A cache smaller than one variant's expanded matrices evicts on every step; the numbers stay the same."""
    base, made = variants
    decoder, compiled, cache = _decoders(base, made, 256)
    roomy = _decode_all(decoder, [(TOKENS[0], compiled["int4"]), (TOKENS[1], compiled["lora"])])[1]
    decoder, compiled, cache = _decoders(base, made, 0)
    cache.budget = 40_000  # a few of the tiny model's matrices
    tight = _decode_all(decoder, [(TOKENS[0], compiled["int4"]), (TOKENS[1], compiled["lora"])])[1]
    assert cache.evictions > 0 and cache.used <= cache.budget
    torch.testing.assert_close(tight, roomy, atol=0, rtol=0)


@pytest.fixture(params=["auto", "avx2", "portable"])
def kernel_variant(request):
    """The best variant, then AVX2's table lookups (eight outputs at a time) and the portable masked sums, where
    this CPU runs them (kernels.use_isa switches the loaded library)."""
    from gym.infer.fast import kernels as loaded

    if loaded.kernel_status() is not None:
        if request.param != "auto":
            pytest.skip(f"the kernels are not available here ({loaded.kernel_status()})")
        yield request.param
        return
    if request.param not in ("auto", *loaded.runnable_isas()):
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    loaded.use_isa(request.param)
    yield request.param
    loaded.use_isa("auto")


@pytest.mark.parametrize(("out_features", "in_features", "group"), [
    (48, 64, 16),  # whole tiles of four outputs, 16-wide steps only
    (50, 72, 72),  # two outputs past the last four, and a row that ends eight activations into a 16-wide step
    (50, 72, 24),  # groups that each end eight into a step
    (36, 576, 576),  # the embedded model's width, one scale per row (table lookups: whole blocks of 32)
    (40, 96, 96),  # table lookups: sixteen outputs, sixteen more, then the last eight
    (40, 192, 64),  # table lookups with three groups per row, scales gathered per group
    (16, 64, 32),  # table lookups, one block per group
    (20, 64, 64),  # table lookups ending four outputs into a block of eight (AVX2) or sixteen (AVX-512)
])
@pytest.mark.parametrize("rows", [[0, 1, 3, 4], [0, 3, 3, 4]], ids=["a row each", "two on one row"])
def test_packed_kernel_equals_unpacked_reference(out_features, in_features, group, rows, kernel_variant):
    """Rows of one variant alone, and runs of rows sharing a variant, against x @ W.T (AVX-512 and AVX2 take
    rows of whole blocks of 32 through table lookups, the portable path through masked sums). With a row
    each, AVX2 and AVX-512 split the entries between their threads; two entries adding into one row take the
    split by output tiles instead."""
    g = torch.Generator().manual_seed(out_features + in_features + group)
    x = torch.randn(5, in_features, generator=g)
    bits = [torch.randint(0, 256, (out_features * in_features // 8,), dtype=torch.uint8, generator=g)
            for _ in range(3)]
    per_row, grouped = torch.rand(out_features, 1, generator=g), torch.rand(out_features, -(-in_features // group),
                                                                           generator=g)
    rows = torch.tensor(rows)
    entries = ([bits[0], bits[2], bits[1], bits[1]], [per_row, grouped, grouped, grouped],
               [in_features, group, group, group])
    tiled = [kernels.tile_signs(b, out_features, in_features) for b in entries[0]]
    assert all(torch.equal(kernels.untile_signs(t, out_features, in_features), b) for t, b in zip(tiled, entries[0]))
    y = torch.zeros(5, out_features)
    kernels.sign_matmul_add_(y, x, rows, tiled, *entries[1:])
    want = torch.zeros(5, out_features)
    for e, row in enumerate(rows.tolist()):
        matrix = kernels.unpack_signs(entries[0][e], out_features, in_features) * kernels.expand_groups(
            entries[1][e], entries[2][e], in_features)
        want[row] += x[row].double() @ matrix.double().T
    torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-5)
    assert y[2].abs().sum() == 0


@pytest.mark.parametrize(("out_features", "in_features", "group"), [(40, 96, 96), (40, 192, 64), (36, 576, 576)])
def test_a_row_each_gives_the_same_bits_as_the_split_by_tiles(out_features, in_features, group, kernel_variant):
    """With a row each, AVX2 and AVX-512 split the (entry, tile) pairs between the threads in one pass; once two
    entries share a row, they split the output tiles instead. A fifth entry adding zero to the last row switches
    one call to the other path: every row gets the same bits either way."""
    g = torch.Generator().manual_seed(out_features + group)
    x = torch.randn(4, in_features, generator=g)
    tiled = [kernels.tile_signs(torch.randint(0, 256, (out_features * in_features // 8,), dtype=torch.uint8,
                                              generator=g), out_features, in_features) for _ in range(4)]
    scales = [torch.rand(out_features, -(-in_features // group), generator=g) for _ in range(4)]
    one_pass = torch.zeros(4, out_features)
    kernels.sign_matmul_add_(one_pass, x, torch.tensor([0, 1, 2, 3]), tiled, scales, [group] * 4)
    by_tiles = torch.zeros(4, out_features)
    kernels.sign_matmul_add_(by_tiles, x, torch.tensor([0, 1, 2, 3, 3]), [*tiled, tiled[0]],
                             [*scales, torch.zeros_like(scales[0])], [group] * 5)
    assert torch.equal(one_pass, by_tiles)
    assert one_pass.abs().sum() > 0


def _family(kind: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    if kind == "qwen2":  # biases on q, k and v
        return Qwen2ForCausalLM(Qwen2Config(**shape)).eval()
    return Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=32)).eval()  # q and k norms, an untied LM head


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
@pytest.mark.parametrize("decoder_kind", ["cpu", "gpu-code"])
def test_bias_and_head_norm_deltas_per_row(kind, decoder_kind, tmp_path):
    """A full fine-tune moves biases, q/k norms and an untied LM head too; each is applied per row, in the CPU
    decoder and in the GPU decoder's code (run eagerly on the CPU here)."""
    import copy

    from gym.infer.fast.gpu import GpuDecoder

    base = _family(kind)
    tuned = copy.deepcopy(base)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, param in tuned.named_parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.05)
    path = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)).compress(base, tuned, progress=False).save(
        tmp_path / "d.safetensors")
    entries, header = load_delta(path)
    merged = apply_delta(copy.deepcopy(base), entries, header, path)
    deltas = deltas_from_file(path)[0]
    assert any(name.endswith(("q_proj.bias", "q_norm.weight")) for name in deltas)
    variant = compile_variant("v", "1", deltas, base, UnpackedCache(64 << 20))

    def make(model):
        return FastDecoder(model, "float32", slots=4) if decoder_kind == "cpu" else GpuDecoder(model, slots=4)

    rows = [(TOKENS[0], variant), (TOKENS[1], None)]
    prefill, step = _decode_all(make(base), rows)
    for index, model in ((0, merged), (1, base)):
        want_prefill, want_step = _decode_all(make(model), [(TOKENS[index], None)])
        torch.testing.assert_close(prefill[index], want_prefill[0], atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(step[index], want_step[0], atol=2e-4, rtol=1e-4)
