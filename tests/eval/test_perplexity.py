"""Perplexity is exp of the training loss on the same rows, counted per token."""

from __future__ import annotations

import math

import pytest

from gym.eval.model import load_eval_model
from gym.eval.perplexity import perplexity
from gym.workflows.training import run_exp


def test_perplexity_is_exp_of_the_trainers_eval_loss(train_config, data_dir):
    # One eval batch holding every row: the trainer's eval_loss is then the mean over all supervised tokens.
    result = run_exp(train_config(eval_dataset="tiny_alpaca", per_device_eval_batch_size=64, max_steps=2,
                                  learning_rate=1e-3))
    trained = load_eval_model({"output_dir": result.output_dir})
    try:
        scored = perplexity(trained, "tiny_alpaca", str(data_dir), cutoff_len=64, batch_size=5, log_samples=True)
    finally:
        trained.close()
    assert scored["scored"] == "answers" and scored["items"] == 24
    assert scored["metrics"]["loss"] == pytest.approx(result.metrics["eval_loss"], rel=1e-4)
    # exp of that loss, to the same tolerance: a relative 1e-4 on a loss of ~10.8 is ~1e-3 of its exp (an AVX512-BF16
    # EPYC gave losses 2.8e-5 apart, perplexities 3e-4 apart).
    assert scored["metrics"]["perplexity"] == math.exp(scored["metrics"]["loss"])
    assert math.log(scored["metrics"]["perplexity"]) == pytest.approx(result.metrics["eval_loss"], rel=1e-4)
    assert scored["tokens"] == sum(s["tokens"] for s in scored["samples"]) > 24


def test_plain_text_scores_every_token(tiny_eval_model, data_dir, tokenizer):
    scored = perplexity(tiny_eval_model, "tiny_text", str(data_dir), cutoff_len=64)
    assert scored["scored"] == "text" and scored["items"] == 20
    # every token after the first of each document, its EOS included
    documents = [f"Document {i}: the number {i} squared is {i * i}." for i in range(20)]
    assert scored["tokens"] == sum(len(tokenizer.encode(d)) for d in documents)
