"""Evaluation: multiple choice, perplexity, verified generation and lm-evaluation-harness, on any Gym model.

`gym eval CONFIG --task T` (gym.cli.eval) -> run_eval (gym.eval.runner): the model is loaded once
(gym.eval.model: base, adapters, delta, variant, export) and every task scores it:

    mc.py             multiple choice in MMLU's layout, by log-likelihood (loglik.py)
    perplexity.py     loss and perplexity, tokenized as training tokenizes
    generation.py     answers decoded by the inference engine, checked by the reward registry's verifiers
    lm_eval_bridge.py lm-eval's tasks through its HFLM wrapper around the same model object
    results.py        the table, the JSON result file, and --compare with a significance test
    after_training.py eval_tasks: in a training config, and the delta compressor's quality gate
"""
