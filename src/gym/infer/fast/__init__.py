"""Gym's fast decoding path: on the CPU own matrix-vector kernels and weights at the served precision, on
a CUDA GPU decode steps replayed as CUDA graphs; on both a KV cache of per-request slots, chunked prefill
and prefix caching, behind the same Engine interface.

    kernels.py  the C++ kernels (compiled once per machine into $GYM_HOME) and their torch references
    linear.py   a linear layer at float32 / bfloat16 / float16 / int8 / int4 and how weights are packed
    pack_cache.py  int8/int4 weights packed once and kept beside the model, so a start does not pack again
    decoder.py  what a Llama-family decoder is (Llama, Mistral, Qwen2, Qwen3, SmolLM): its config, the
                weights of a layer and their keys, which models the fast decoders run
    cpu.py      the CPU decoder: that layer on those linear layers, over a KV cache of per-request slots
    gpu.py      the GPU decoder: that layer in torch ops, decode steps replayed as CUDA graphs
    cache.py    the per-slot KV cache both decoders keep
    prefix.py   the prefix cache: KV of prompt blocks already seen, shared across requests
    engine.py   FastEngine: the scheduler (dynamic batching, chunked prefill, batched sampling)
    deltas.py   per-row deltas: many fine-tunes of one base in one batch (bank.py keeps them loaded)
"""
