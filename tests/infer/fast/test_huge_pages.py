"""The fast engine's weights in huge pages: copies equal to their originals in one mapping advised for huge pages,
nothing copied where huge pages are off, a decoder answering the same after its weights move (the model still held
once), and an engine moving them once it stands idle."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from gym.infer.fast import huge_pages
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.engine import FastEngine
from gym.infer.requests import SamplingParams

PROMPT = [1, 400, 1200, 87, 3000, 25]


def answer(engine: FastEngine) -> list[int]:
    request = engine.submit(PROMPT, SamplingParams(max_new_tokens=8, do_sample=False))
    list(request.events())
    return request.generated


@pytest.fixture()
def huge(monkeypatch) -> None:
    monkeypatch.setenv("GYM_HUGE_PAGES", "1")
    if not huge_pages.available():
        pytest.skip("this system grants no transparent huge pages")


def advised_for_huge_pages(address: int) -> bool:
    """Whether the mapping holding `address` may take huge pages, as /proc/self/smaps reports it."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "THPeligible:":
            return line.split()[1] == "1"
    raise AssertionError(f"no mapping holds {address:#x}")


def test_copies_equal_their_originals_in_one_aligned_mapping(huge):
    # 4 MB first: a mapping takes huge pages only where it spans a whole aligned 2 MB.
    originals = [torch.randn(1024, 1024), torch.randint(-127, 127, (64, 32), dtype=torch.int8), torch.randn(5).half()]
    placed = huge_pages.copies(originals)
    assert placed is not None
    for original, copy in zip(originals, placed):
        assert copy.dtype == original.dtype and copy.shape == original.shape and torch.equal(copy, original)
        assert copy.data_ptr() != original.data_ptr() and copy.data_ptr() % huge_pages.ALIGNMENT == 0
    assert placed[0].data_ptr() % huge_pages.HUGE_PAGE == 0
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in placed)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert advised_for_huge_pages(placed[0].data_ptr())


@pytest.mark.parametrize("off", ["GYM_HUGE_PAGES=0", "never", "no setting file"])
def test_nothing_is_copied_where_huge_pages_are_off(off, monkeypatch, tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n" if off == "never" else "always [madvise] never\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting if off != "no setting file" else tmp_path / "missing")
    monkeypatch.setenv("GYM_HUGE_PAGES", "0" if off == "GYM_HUGE_PAGES=0" else "1")
    assert huge_pages.copies([torch.ones(3)]) is None


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_decoder_answers_the_same_after_its_weights_move_with_the_model_held_once(huge, tiny_model_dir, dtype):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    decoder = FastDecoder(model, dtype, slots=1)
    assert not decoder.in_huge_pages
    with torch.inference_mode():
        before = decoder.prefill(0, PROMPT, 0), decoder.decode([5], [len(PROMPT)])
        assert decoder.into_huge_pages() and decoder.in_huge_pages
        assert not decoder.into_huge_pages()  # once only
        after = decoder.prefill(0, PROMPT, 0), decoder.decode([5], [len(PROMPT)])
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    layer, moved = model.model.layers[0], decoder.layers[0]
    assert advised_for_huge_pages(moved.qkv.weight.data_ptr())
    if dtype == "float32":
        # The model's own weights are (views of) the moved ones, the tied head and embedding one tensor.
        assert layer.self_attn.q_proj.weight.data_ptr() == moved.qkv.weight.data_ptr()
        assert layer.self_attn.o_proj.weight.data_ptr() == moved.o.weight.data_ptr()
        assert layer.mlp.down_proj.weight.data_ptr() == moved.down.weight.data_ptr()
        assert (model.model.embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()
                == decoder.head.weight.data_ptr() == decoder.embed.data_ptr())
    else:
        assert moved.qkv.scale is not None and advised_for_huge_pages(moved.qkv.scale.data_ptr())


def test_an_idle_engine_moves_its_weights_and_answers_the_same(huge, tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = FastEngine(model, tokenizer, [], dtype="int8", max_batch_size=1)
    try:
        first = answer(engine)
        deadline = time.monotonic() + 30
        while not engine.decoder.in_huge_pages and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.decoder.in_huge_pages
        assert answer(engine) == first
    finally:
        engine.shutdown()
