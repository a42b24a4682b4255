"""The served weight formats hold the embedded model's quality: perplexity on the demo data within 1% of
float32 for int8 and bfloat16 and within 5% for int4 (issue #13's bounds), and int8's greedy answers
agree with float32's.

int4 is fitted on llama.cpp's Q4_1 grid (a step and a minimum per block of 32). The embedded model was
converted from a Q4_1 GGUF, so its weights are already on such a grid and come back exact: what int4
costs here is only the activations' rounding in the kernels (and the LM head at int8). On weights that
were never 4-bit the format costs more; tests/infer/fast/test_kernels.py bounds its error on Gaussian
weights, and docs/inference.md says so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from gym.data.templates import get_chat_format
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.engine import FastEngine
from gym.infer.requests import SamplingParams

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

# Everyday prompts, none chosen for how int8 does on it. Near-ties are common: with the first eight alone, four to
# six of them (depending on float summation order in the kernels) meet one within 16 tokens (float32's two best
# logits 0.006-0.08 apart; "What is the capital of France?" already at its first token), so the last four were
# added to keep the count of whole answers equal from hanging on one coin toss.
PROMPTS = ["Write a haiku about autumn leaves.", "Explain what a binary search does.", "List three uses of copper.",
           "Who wrote Romeo and Juliet?", "What is the capital of France?", "Give me a tip for learning Python.",
           "What is photosynthesis?", "Name a famous painter.", "How do I boil an egg?", "What does a compiler do?",
           "Describe the water cycle.", "Why is the sky blue?"]
# Logits: where float32's best two are this close, int8 may rank them the other way. Measured over the 192
# positions of these prompts' float32 answers, int8 moves the gap between float32's two best logits by 0.15 on
# average (90th percentile 0.29, largest 0.67): rounding each block of 32 activations to int8 is chaotic, and
# a 1-ulp change upstream (a vectorized exp in silu) moved one first-token gap from 0.24 to 0.08. A clear
# choice is a gap of more than 0.5 (1.6x the probability), which int8 must keep.
NEAR_TIE = 0.5


@pytest.fixture(scope="module")
def embedded(embedded_dir):
    return AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()


def demo_ids(tokenizer) -> list[int]:
    """1,000 tokens of the demo data's answers (data/alpaca_en_demo.json): natural English text."""
    rows = json.loads((REPO / "data" / "alpaca_en_demo.json").read_text())
    return tokenizer.encode("\n\n".join(row["output"] for row in rows[:40]), add_special_tokens=False)[:1000]


def perplexity(model, tokenizer, dtype: str) -> float:
    ids = demo_ids(tokenizer)
    with torch.inference_mode():
        logits = FastDecoder(model, dtype, slots=1).prefill(0, ids, 0, every_position=True)
    loss = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(float(loss))


def test_perplexity_of_each_format_against_float32(embedded, tokenizer):
    exact = perplexity(embedded, tokenizer, "float32")
    with torch.inference_mode():
        ids = torch.tensor([demo_ids(tokenizer)])
        reference = math.exp(float(embedded(ids, labels=ids).loss))
    assert exact == pytest.approx(reference, rel=1e-4)  # the fast decoder is the model
    assert perplexity(embedded, tokenizer, "int8") == pytest.approx(exact, rel=0.01)
    assert perplexity(embedded, tokenizer, "int4") == pytest.approx(exact, rel=0.05)
    assert perplexity(embedded, tokenizer, "bfloat16") == pytest.approx(exact, rel=0.01)


def greedy_answers(model, tokenizer, dtype: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, 16 greedy tokens) for each prompt, from the engine at `dtype`."""
    params = SamplingParams(max_new_tokens=16, do_sample=False)
    chat = get_chat_format(tokenizer)
    engine = FastEngine(model, tokenizer, [], dtype=dtype)
    try:
        answers = []
        for prompt in PROMPTS:
            ids = tokenizer.encode(chat.render_prompt([{"role": "user", "content": prompt}], None),
                                   add_special_tokens=False)
            request = engine.submit(ids, params)
            list(request.events())
            answers.append((ids, request.generated))
    finally:
        engine.shutdown()
    return answers


@pytest.fixture(scope="module")
def float32_answers(embedded, tokenizer):
    return greedy_answers(embedded, tokenizer, "float32")


def test_int8_greedy_answers_equal_float32s_up_to_a_near_tie(embedded, tokenizer, float32_answers):
    """Free-running, int8's greedy answer is float32's token for token, except that it may part from it at a
    near-tie of float32's (and then for good): on at least three prompts all 16 tokens are equal (issue #13),
    and no answer parts where float32 had a clear choice."""
    int8_answers = greedy_answers(embedded, tokenizer, "int8")
    reference = FastDecoder(embedded, "float32", slots=1)
    equal = 0
    for (ids, answer), (_, quantized) in zip(float32_answers, int8_answers, strict=True):
        with torch.inference_mode():
            logits = reference.prefill(0, ids + answer[:-1], 0, every_position=True)[len(ids) - 1:]
        best_two = logits.topk(2, dim=-1).values
        margins = (best_two[:, 0] - best_two[:, 1]).tolist()
        parted = next((i for i, (a, b) in enumerate(zip(answer, quantized)) if a != b), None)
        if parted is None:
            equal += 1
        else:
            assert min(margins[:parted + 1]) < NEAR_TIE, (
                f"int8 parted from float32 at token {parted} with no near-tie before it (margins {margins})")
    assert equal >= 3, f"only {equal} of {len(PROMPTS)} int8 answers equal float32's for 16 tokens"


def test_int8_picks_float32s_greedy_tokens(embedded, float32_answers):
    """Teacher-forced on float32's own 16-token greedy answers (so a near-tie costs one position, not the
    rest of the answer), int8 picks the same next token at >= 90% of the positions."""
    agree = total = 0
    int8 = FastDecoder(embedded, "int8", slots=1)
    with torch.inference_mode():
        for ids, answer in float32_answers:
            logits = int8.prefill(0, ids + answer[:-1], 0, every_position=True)[len(ids) - 1:]
            agree += int((logits.argmax(-1) == torch.tensor(answer)).sum())
            total += len(answer)
    assert agree / total >= 0.9, f"{agree}/{total}"
