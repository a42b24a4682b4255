"""Gym's fast CPU decoding path: own matrix-vector kernels, weights at the served precision, a KV cache
of per-request slots, chunked prefill and prefix caching, behind the same Engine interface.

    kernels.py  the C++ kernels (compiled once per machine into $GYM_HOME) and their torch references
    linear.py   a linear layer at float32 / bfloat16 / float16 / int8 / int4 and how weights are packed
    model.py    a decoder for Llama-family models (Llama, Mistral, Qwen2, Qwen3, SmolLM) on those layers
    prefix.py   the prefix cache: KV of prompt blocks already seen, shared across requests
    engine.py   FastEngine: the scheduler (dynamic batching, chunked prefill, batched sampling)
"""
