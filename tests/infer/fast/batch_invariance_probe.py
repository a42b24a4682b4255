"""Run by tests/infer/fast/test_batch_invariance.py in a process of its own, once per kernel path (the best
variant this CPU runs, the AVX2 variant, the torch reference): a row's logits, bit for bit, alone and in every
kind of batch.

    python batch_invariance_probe.py MODEL_DIR WORK_DIR      -> prints one JSON line: the path and what was checked

BATCH_PROBE_ENGINE=0 leaves out the checks through the engine (its scheduling is the same on every path).

Each check compares a row's logits with torch.equal, not a tolerance: batch invariance means the same
numbers, so that a greedy answer never changes with the load.

Every decoder of a format takes its packed weights through the engine's pack cache, as a warm start does: the
first packs and writes them, the others read them back. Packing each decoder anew was 40% of the torch
reference's run (its packer is torch code), and a row's logits must not depend on which of the two it got either.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.infer.fast import kernels
from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.deltas import UnpackedCache, compile_variant
from gym.infer.fast.pack_cache import PACKED_DTYPES, PackCache
from gym.personalization.loading import deltas_from_adapter, deltas_from_file

PROMPTS = {"alice": [11, 205, 3001, 42, 7, 300, 301, 302, 303, 9, 8], "bob": [500, 501, 502],
           "carol": [9, 8, 7, 6, 5, 4, 1234], "dave": [70, 71, 72, 73, 74, 75, 76, 77, 78, 79],
           "base": [1234, 77, 12, 13]}


def _load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _tuned(model_dir: Path, seed: int) -> torch.nn.Module:
    tuned = _load(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in tuned.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.02)
    return tuned


def variants(model_dir: Path, work: Path) -> dict[str, dict]:
    """alice: 1-bit per row (the table-lookup kernel where AVX-512 runs it); carol: 1-bit in groups of 16 inputs
    (the masked-sum kernel everywhere); dave: DeltaQuant int4 (an expanded matrix); bob: a LoRA adapter."""
    base = _load(model_dir)
    made = {}
    for name, quantizer, seed in (("alice", BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)), 1),
                                  ("carol", BitDeltaQuantizer(BitDeltaConfig(distill_steps=0, group_size=16)), 2),
                                  ("dave", DeltaQuantizer(DeltaQuantConfig(method="int4")), 3)):
        path = quantizer.compress(base, _tuned(model_dir, seed), progress=False).save(work / f"{name}.safetensors")
        made[name] = deltas_from_file(path)[0]
    torch.manual_seed(4)
    lora = get_peft_model(_load(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                                               "down_proj"]))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    lora.save_pretrained(work / "bob")
    made["bob"] = deltas_from_adapter(work / "bob")
    return made


def run(decoder: FastDecoder, rows: list[tuple[str, object]], chunks: dict[str, list[int]] | None = None,
        steps: int = 3) -> dict[int, list[torch.Tensor]]:
    """Prefill each row's prompt into its own slot (in the chunks given, else whole), then decode `steps` tokens
    for all rows together (greedy on row 0's logits for everyone, so every batch feeds the same tokens). Returns
    per row: the logits after its prefill, then after each decode step."""
    out: dict[int, list[torch.Tensor]] = {}
    for slot, (name, variant) in enumerate(rows):
        prompt, start = PROMPTS[name], 0
        for size in (chunks or {}).get(name, [len(PROMPTS[name])]):
            logits = decoder.prefill(slot, prompt[start:start + size], start, variant=variant)
            start += size
        out[slot] = [logits]
    lengths = [len(PROMPTS[name]) for name, _ in rows]
    tokens = [int(out[slot][0].argmax()) for slot in range(len(rows))]
    for _ in range(steps):
        step = decoder.decode(tokens, lengths, [variant for _, variant in rows])
        for slot in range(len(rows)):
            out[slot].append(step[slot])
        tokens = [int(step[slot].argmax()) for slot in range(len(rows))]
        lengths = [length + 1 for length in lengths]
    return out


def main() -> None:
    model_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    status = kernels.kernel_status()
    base = _load(model_dir)
    deltas = variants(model_dir, work)
    # A copy of the model's folder holds the pack cache: the shared test model's folder stays as it was.
    packed_dir = Path(shutil.copytree(model_dir, work / "model"))
    checked = []
    for dtype in ("float32", "int8", "int4"):
        cache = UnpackedCache(64 << 20)
        compiled = {name: compile_variant(name, "1", d, base, cache) for name, d in deltas.items()}
        alice, bob, carol, dave = (compiled[n] for n in ("alice", "bob", "carol", "dave"))

        def fresh(slots: int, dtype: str = dtype) -> FastDecoder:
            packed = PackCache(packed_dir, dtype) if dtype in PACKED_DTYPES else None
            return FastDecoder(base, dtype, slots=slots, packed=packed)

        for who, variant in (("alice", alice), ("carol", carol), ("bob", bob), ("dave", dave), ("base", None)):
            alone = run(fresh(1), [(who, variant)])[0]
            batches = {
                "mixed": [("base", None), (who, variant), ("bob", bob), ("carol", carol)],
                "same variant twice": [(who, variant), (who, variant), ("dave", dave)],
                "four of it": [(who, variant)] * 4,
                "over 16 rows": [("base", None)] * 9 + [(who, variant)] + [("bob", bob)] * 8,
            }
            for label, rows in batches.items():
                together = run(fresh(len(rows)), rows)
                position = rows.index((who, variant))
                for i, (a, b) in enumerate(zip(alone, together[position])):
                    assert torch.equal(a, b), f"{dtype} {who} {label}: logits differ at output {i} " \
                                              f"(max |diff| {float((a - b).abs().max()):.3g})"
                checked.append(f"{dtype}/{who}/{label}")
            # A prompt prefilled in other chunks (as under load, or after the prefix cache restored its start):
            chunked = run(fresh(2), [(who, variant), ("bob", bob)], chunks={who: [3, 5, len(PROMPTS[who]) - 8]}
                          if len(PROMPTS[who]) > 8 else {who: [1, len(PROMPTS[who]) - 1]})[0]
            for i, (a, b) in enumerate(zip(alone, chunked)):
                assert torch.equal(a, b), f"{dtype} {who} chunked prefill: logits differ at output {i}"
            checked.append(f"{dtype}/{who}/chunked prefill")
    if os.environ.get("BATCH_PROBE_ENGINE", "1") == "1":  # the scheduling is the same on every path: checked once
        checked += engine_checks(model_dir, base, deltas)
    print(json.dumps({"kernels": status or "compiled", "isa": kernels.kernel_isa(), "checked": checked}))


class _Source:
    """A VariantSource over deltas in memory."""

    def __init__(self, deltas: dict[str, dict]) -> None:
        self.deltas = deltas

    def names(self) -> list[str]:
        return list(self.deltas)

    def version(self, name: str) -> str | None:
        return "1" if name in self.deltas else None

    def load(self, name: str) -> dict:
        return self.deltas[name]


def engine_checks(model_dir: Path, base: torch.nn.Module, deltas: dict[str, dict]) -> list[str]:
    """Through the engine, as `gym api --variants` serves: alice's greedy answer alone, then while the base, bob
    and another alice request arrive at the same moment (sharing her system prompt, so the prefix cache serves
    part of her prompt the second time, and prompts are chunked by 7 tokens)."""
    from transformers import AutoTokenizer

    from gym.infer.fast.bank import VariantBank
    from gym.infer.fast.engine import FastEngine
    from gym.infer.requests import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    system = list(range(1000, 1140))  # two whole prefix-cache blocks
    asks = {"alice": system + [11, 12, 13], "bob": system + [21, 22], "base": [5, 6, 7, 8], "alice2": [31, 32]}
    names = {"alice": "alice", "bob": "bob", "base": None, "alice2": "alice"}
    checked = []
    for dtype in ("float32", "int8"):
        def answer(engine: FastEngine, who: str) -> list[int]:
            request = engine.submit(asks[who], SamplingParams(max_new_tokens=10, do_sample=False, variant=names[who]))
            list(request.events())
            return list(request.generated)

        def fresh(dtype: str = dtype) -> FastEngine:
            return FastEngine(base, tokenizer, [], dtype=dtype, prefill_chunk=7, prefix_cache_mb=64,
                              variants=VariantBank(_Source(deltas), base))

        engine = fresh()
        try:
            alone = answer(engine, "alice")
        finally:
            engine.shutdown()
        engine = fresh()
        try:
            answer(engine, "bob")  # fills the prefix cache with bob's system blocks (his own namespace)
            answer(engine, "alice")  # and alice's: her next request restores them
            requests = {who: engine.submit(asks[who], SamplingParams(max_new_tokens=10, do_sample=False,
                                                                     variant=names[who]))
                        for who in ("base", "bob", "alice", "alice2")}
            for request in requests.values():
                list(request.events())
            assert engine.prefix.hits > 0
            assert list(requests["alice"].generated) == alone, (dtype, alone, requests["alice"].generated)
        finally:
            engine.shutdown()
        checked.append(f"{dtype}/engine: alice alone == alice among base, bob and alice, prefix cache warm")
    return checked


if __name__ == "__main__":
    main()
