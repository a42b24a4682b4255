"""Grammar libraries for constrained decoding, measured on the embedded tokenizer (SmolLM2, 49k tokens):
the one-off cost of preparing the tokenizer, the cost of compiling a JSON schema, and the cost of one
token's mask while a schema-valid JSON answer is produced token by token (mask, then accept the token).

  llguidance     Microsoft's Rust library (Gym's choice, gym.infer.grammar); masks computed lazily
  xgrammar       MLC's C++ library; precomputes context-independent tokens per grammar state
  outlines-core  the Rust core of Outlines; a regex (from the schema) compiled to a token-level DFA

Each library is measured when importable. xgrammar and outlines-core are not Gym dependencies; to
compare, install them next to it without their dependencies (xgrammar pulls triton and torch):

    pip install --no-deps --target /tmp/gram-eval xgrammar outlines-core apache-tvm-ffi
    PYTHONPATH=/tmp/gram-eval:src HF_HUB_OFFLINE=1 .venv/bin/python bench/grammar_libraries.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
# llguidance's JSON layout as Gym sets it (gym.infer.grammar): one space after ':' and ',', no other whitespace.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANSWER = '{"name": "Ada Lovelace", "age": 36, "color": "green", "tags": ["mathematics", "engines", "poetry"]}'


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_llguidance(tokenizer, tokens: list[int], repeats: int) -> dict[str, float]:
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    lltok, prepare = timed(lambda: llguidance.hf.from_tokenizer(tokenizer))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_STYLE)
    _, compile_s = timed(lambda: llguidance.LLMatcher(lltok, grammar, log_level=0))
    mask = llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size)
    per_token = []
    for _ in range(repeats):
        matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        for token in tokens:
            start = time.perf_counter()
            llguidance.numpy.fill_next_token_bitmask(matcher, mask)
            assert mask[0, token // 32] >> (token % 32) & 1, "the answer's token is not allowed"
            assert matcher.consume_token(token), matcher.get_error()
            per_token.append(time.perf_counter() - start)
        assert matcher.is_accepting()
    return {"prepare_s": prepare, "compile_s": compile_s, "mask_us": 1e6 * statistics.median(per_token),
            "mask_p99_us": 1e6 * float(np.percentile(per_token, 99))}


def bench_xgrammar(tokenizer, tokens: list[int], repeats: int) -> dict[str, float]:
    import torch
    import xgrammar as xgr

    info, prepare = timed(lambda: xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer)))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    per_token = []
    for _ in range(repeats):
        matcher = xgr.GrammarMatcher(compiled)
        for token in tokens:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            assert int(mask[0, token // 32]) >> (token % 32) & 1, "the answer's token is not allowed"
            assert matcher.accept_token(token)
            per_token.append(time.perf_counter() - start)
        assert matcher.is_terminated() or matcher.accept_token(tokenizer.eos_token_id)
    del torch
    return {"prepare_s": prepare, "compile_s": compile_s, "mask_us": 1e6 * statistics.median(per_token),
            "mask_p99_us": 1e6 * float(np.percentile(per_token, 99))}


def _byte_vocabulary(tokenizer) -> dict[bytes, list[int]]:
    """Token id -> the bytes it stands for, undoing byte-level BPE's printable-character mapping (GPT-2's)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decoder = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab: dict[bytes, list[int]] = {}
    special = set(tokenizer.all_special_ids)
    for piece, index in tokenizer.get_vocab().items():
        if index in special:
            continue
        vocab.setdefault(bytes(decoder[c] for c in piece), []).append(index)
    return vocab


def bench_outlines_core(tokenizer, tokens: list[int], repeats: int) -> dict[str, float]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    vocabulary, prepare = timed(lambda: Vocabulary(tokenizer.eos_token_id, _byte_vocabulary(tokenizer)))
    # The schema's regex with single spaces after ':' and ',' as in ANSWER (outlines' whitespace option).
    regex = build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?")
    index, compile_s = timed(lambda: Index(regex, vocabulary))
    mask = np.zeros(((len(tokenizer) + 31) // 32,), dtype=np.int32)
    per_token = []
    for _ in range(repeats):
        guide = Guide(index)
        for token in tokens:
            start = time.perf_counter()
            guide.write_mask_into(mask.ctypes.data, mask.size, 4)
            assert mask[token // 32] >> (token % 32) & 1, "the answer's token is not allowed"
            guide.advance(token)
            per_token.append(time.perf_counter() - start)
        assert guide.is_finished()
    return {"prepare_s": prepare, "compile_s": compile_s, "mask_us": 1e6 * statistics.median(per_token),
            "mask_p99_us": 1e6 * float(np.percentile(per_token, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="times the answer is walked per library")
    args = parser.parse_args()
    from gym.models.loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("smollm2-135m"))
    tokens = tokenizer.encode(ANSWER, add_special_tokens=False)
    print(f"tokenizer: {len(tokenizer)} tokens; answer: {len(tokens)} tokens; schema: {json.dumps(SCHEMA)}")
    print(f"{'library':<16}{'version':<10}{'prepare tokenizer':>18}{'compile schema':>16}"
          f"{'mask/token (median)':>21}{'p99':>10}")
    for name, module, fn in (("llguidance", "llguidance", bench_llguidance), ("xgrammar", "xgrammar", bench_xgrammar),
                             ("outlines-core", "outlines_core", bench_outlines_core)):
        try:
            from importlib.metadata import version

            __import__(module)
            release = version(name)
        except ImportError:
            print(f"{name:<16}not installed")
            continue
        row = fn(tokenizer, tokens, args.repeats)
        print(f"{name:<16}{release:<10}{row['prepare_s'] * 1e3:>15.0f} ms{row['compile_s'] * 1e3:>13.1f} ms"
              f"{row['mask_us']:>18.1f} µs{row['mask_p99_us']:>7.0f} µs")


if __name__ == "__main__":
    main()
