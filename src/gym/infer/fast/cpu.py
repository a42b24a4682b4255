"""The fast engine's decoder on the CPU: the Llama-family layer (gym.infer.fast.decoder) on FastLinear
products at the served weight format, over a KV cache of per-request slots.

The forward pass is written for decoding: no module dispatch, no attention-mask bookkeeping for
padding, one (slot, position) per row. Each slot is one request's cache, kept from column 0 (no left
padding), so a row's position is simply its length. A decode step of base rows runs every layer in one
call of the compiled kernels (gym.infer.fast.kernels), the same kernels in the same order as the
layer-by-layer walk.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import torch

from gym.infer.fast import huge_pages, kernels
from gym.infer.fast.cache import SlotCache
from gym.infer.fast.decoder import DecoderSpec, Layer, Weights, fuse, fuse_bias, rotary_tables, share
from gym.infer.fast.deltas import CompiledVariant, RowDeltas
from gym.infer.fast.linear import KERNEL_ROWS, FastLinear, Packer, pack
from gym.infer.fast.pack_cache import PACKED_DTYPES, PackCache

CpuLayer = Layer[FastLinear, torch.Tensor]


def _head_format(dtype: str) -> str:
    """The LM head's format: at int4 it stays int8, as llama.cpp keeps its output tensor at higher precision
    in its 4-bit types. Every logit reads it; on the embedded model (whose embedding is Q8_0) an int4 head
    costs 0.6% perplexity and an int8 one nothing measurable (tests/infer/fast/test_quality.py)."""
    return "int8" if dtype == "int4" else dtype


def _product(modules: list[Any], dtype: str, packed: PackCache | None = None, name: str = "") -> FastLinear:
    """One FastLinear computing the modules' outputs side by side (one kernel call instead of several).
    Where the fused weight is kept as it is (float, the served dtype), the modules' own weights become views
    into it, so the model is not held twice. `packed` (with the product's `name`): int8/int4 weights packed on
    an earlier start, found before fusing, since fusing copies every weight (~0.4 s of a warm start)."""
    packer: Packer = pack
    if packed is not None and dtype in PACKED_DTYPES:
        parts = [module.weight.detach() for module in modules]
        cached = packed.lookup(name, parts, dtype)
        if cached is not None:
            return FastLinear.prepacked(*cached, fuse_bias(modules), dtype, in_features=parts[0].shape[1])
        packer = partial(packed.pack, name, parts)
    weight, bias = fuse(modules)
    linear = FastLinear(weight, bias, dtype, packer)
    if linear.weight.dtype == weight.dtype and linear.weight.data_ptr() == weight.data_ptr():
        share(modules, linear.weight)
    return linear


def _into_huge_pages(products: list[tuple[FastLinear, list[Any]]], embed: torch.Tensor) -> torch.Tensor | None:
    """Every product's weight and scales moved into huge pages (gym.infer.fast.huge_pages); None where the system
    has none. A model's modules whose weights are (views of) a product's follow it, as does the embedding where the
    head is tied to it, so the model is still held once. Returns the embedding."""
    tensors = [t for linear, _ in products for t in (linear.weight, linear.scale) if t is not None]
    placed = huge_pages.copies(tensors)
    if placed is None:
        return None
    moved = iter(placed)
    for linear, modules in products:
        old = linear.weight
        linear.weight = next(moved)
        if linear.scale is not None:
            linear.scale = next(moved)
        first = modules[0].weight
        if first.data_ptr() != old.data_ptr() or first.dtype != old.dtype:
            continue  # the modules hold weights of their own (another dtype, or packed as int)
        if len(modules) == 1:
            modules[0].weight.data = linear.weight
        else:
            share(modules, linear.weight)
        if embed.data_ptr() == old.data_ptr() and embed.shape == old.shape:
            embed = linear.weight
    return embed


class FastDecoder(SlotCache):
    """Forward passes over a KV cache of `slots` rows; weights as `dtype` (gym.infer.fast.linear). `packed`: where
    int8/int4 weights packed on an earlier start are kept (gym.infer.fast.pack_cache); None packs them all."""

    # Prompt tokens per engine step: a 256-token chunk costs a couple of decode steps' time here, so running
    # rows are not held up for long by a prompt joining the batch.
    prefill_chunk = 256

    def __init__(self, model: Any, dtype: str, *, slots: int, max_length: int | None = None,
                 packed: PackCache | None = None) -> None:
        # The compiled kernels when they build (once per machine), else their torch reference.
        self.compiled = kernels.kernel_status() is None
        self._last_deltas: RowDeltas | None = None  # see _step_deltas
        self.spec = DecoderSpec.from_config(model.config)
        self.dtype = dtype
        self.max_length = self.spec.max_length(max_length)
        head_dtype = _head_format(dtype)
        # A product is cached under its modules' names ("model.layers.3.self_attn.q_proj+..."): the same on
        # every start, so the cache finds it again.
        names = {id(module): name for name, module in model.named_modules()}
        products: list[tuple[FastLinear, list[Any]]] = []

        def product(key: str, modules: list[Any]) -> FastLinear:
            linear = _product(modules, head_dtype if key == "head" else dtype, packed,
                              "+".join(names[id(m)] for m in modules))
            products.append((linear, modules))
            return linear

        weights = Weights.read(model, product, norm=lambda weight: weight.float())
        if packed is not None:
            packed.save()
        # Moved into huge pages later, once (into_huge_pages): the move costs more than a first answer should wait.
        self._unmoved: list[tuple[FastLinear, list[Any]]] | None = products if huge_pages.available() else None
        self._moving = threading.Lock()
        self.embed, self.norm, self.head = weights.embed, weights.norm, weights.head
        self.layers: list[CpuLayer] = weights.layers
        cos, sin = rotary_tables(model, self.max_length, torch.device("cpu"))
        self.cos, self.sin = cos.float().contiguous(), sin.float().contiguous()
        self.slots = slots
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.grow(min(256, self.max_length))
        self._step_tensors, self._step_formats = self._step_arguments()

    def _step_arguments(self) -> tuple[list[torch.Tensor], list[int]]:
        """The layers' tensors and product formats as the kernels' decode_layers takes them."""
        none = torch.empty(0)
        formats = {"int8": 1, "int4": 2}
        tensors: list[torch.Tensor] = []
        codes: list[int] = []
        for layer in self.layers:
            tensors += [layer.input_norm, layer.post_norm, none if layer.q_norm is None else layer.q_norm,
                        none if layer.k_norm is None else layer.k_norm]
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                tensors += [linear.weight, none if linear.scale is None else linear.scale,
                            none if linear.bias is None else linear.bias]
                codes.append(formats.get(linear.dtype, 0))
        return tensors, codes

    @property
    def in_huge_pages(self) -> bool:
        """Whether into_huge_pages has nothing (left) to do: the weights moved, or there are no huge pages here."""
        return self._unmoved is None

    def into_huge_pages(self) -> bool:
        """Move the weights into huge pages (gym.infer.fast.huge_pages), the first time only; True when this call
        moved them. It takes ~0.1-0.3 s for the embedded model at int8 and up to ~0.8 s at float32, mostly the
        system handing out fresh 2 MB pages, so the engine does it once it has stood idle for a moment
        (FastEngine.settle_after), never before a first answer. Not during a forward pass: the engine calls it
        from its own thread between steps (or before it has any request)."""
        with self._moving:
            if self._unmoved is None:
                return False
            products, self._unmoved = self._unmoved, None
            embed = _into_huge_pages(products, self.embed)
            if embed is None:
                return False
            self.embed = embed
            self._step_tensors, self._step_formats = self._step_arguments()
            return True

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the embedding row lookup aside)."""
        linears = [self.head] + [lin for layer in self.layers for lin in
                                 (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return sum(lin.nbytes for lin in linears)

    # -- the cache ---------------------------------------------------------------------------------------
    def grow(self, length: int) -> None:
        """Make room for `length` positions per slot (capacity doubles, up to max_length)."""
        if length <= self.capacity:
            return
        if length > self.max_length:
            raise ValueError(f"{length} positions exceed the model's {self.max_length}")
        capacity = min(self.max_length, max(length, 2 * self.capacity))
        shape = (self.slots, self.spec.kv_heads, capacity, self.spec.head_dim)
        for index in range(len(self.layers)):
            # The kernels read only the positions a slot has written, so their cache is never zeroed (16
            # slots at 2,048 positions are 1.5 GB on the embedded model); the torch reference masks the
            # positions past each row's length, and a masked garbage NaN would still poison its sum.
            keys, values = (torch.empty(shape), torch.empty(shape)) if self.compiled else (torch.zeros(shape),
                                                                                          torch.zeros(shape))
            self._install(index, keys, values)
        self.capacity = capacity

    # -- forward passes ----------------------------------------------------------------------------------
    def _qk_rope(self, qkv: torch.Tensor, layer: CpuLayer, cos: torch.Tensor, sin: torch.Tensor, index: int,
                 deltas: RowDeltas) -> None:
        """Norm (where the model norms q and k) and rotate q and k in place in qkv [tokens, heads, dim]."""
        heads, kv, dim = self.spec.heads, self.spec.kv_heads, self.spec.head_dim
        if layer.q_norm is not None and layer.k_norm is not None:
            tokens = qkv.shape[0]
            for name, weight, first, count in (("q_norm", layer.q_norm, 0, heads), ("k_norm", layer.k_norm, heads, kv)):
                part = qkv[:, first:first + count]
                normed = kernels.rms_norm(part.reshape(-1, dim), weight, self.spec.eps).view(tokens, count, dim)
                part.copy_(deltas.norm(f"{index}.{name}", part, normed, self.spec.eps) if deltas else normed)
        kernels.rope_(qkv, cos, sin, heads + kv)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, key: str, deltas: RowDeltas) -> torch.Tensor:
        normed = kernels.rms_norm(x, weight, self.spec.eps)
        return deltas.norm(key, x, normed, self.spec.eps) if deltas else normed

    @staticmethod
    def _linear(linear: FastLinear, x: torch.Tensor, key: str, deltas: RowDeltas) -> torch.Tensor:
        y = linear(x)
        return deltas.linear(key, x, y) if deltas else y

    def _mlp(self, x: torch.Tensor, layer: CpuLayer, index: int, deltas: RowDeltas) -> torch.Tensor:
        h = self._norm(x, layer.post_norm, f"{index}.post_norm", deltas)
        gate_up = self._linear(layer.gate_up, h, f"{index}.gate_up", deltas)
        return self._linear(layer.down, kernels.silu_mul(gate_up), f"{index}.down", deltas)

    def _embed(self, tokens: list[int], deltas: RowDeltas) -> torch.Tensor:
        ids = torch.tensor(tokens)
        x = self.embed[ids].float()
        return deltas.embed(ids, x) if deltas else x

    def _step_deltas(self, variants: list[CompiledVariant | None]) -> RowDeltas:
        """The step's RowDeltas; the previous step's while the rows' variants are the same (a decode's common
        case), so its per-projection plans are made once, not ~120 times a step."""
        last = self._last_deltas
        if last is None or not last.same_rows(variants):
            last = self._last_deltas = RowDeltas(variants)
        return last

    def decode(self, tokens: list[int], lengths: list[int],
               variants: list[CompiledVariant | None] | None = None) -> torch.Tensor:
        """One token for each of the first len(tokens) slots, slot i holding lengths[i] positions already,
        row i answering as variants[i] (None: the base; gym.infer.fast.deltas). Returns the logits [rows,
        vocab] float32; each slot's cache grows by one position."""
        rows = len(tokens)
        self.grow(max(lengths) + 1)
        positions = torch.tensor(lengths)
        heads, kv, dim = self.spec.heads, self.spec.kv_heads, self.spec.head_dim
        deltas = self._step_deltas(variants or [])
        x = self._embed(tokens, deltas)
        cos, sin = self.cos[positions], self.sin[positions]
        scale = dim ** -0.5
        if self.compiled and not deltas and rows <= KERNEL_ROWS:
            # Base rows only: every layer in one kernel call, the same kernels in the same order as below.
            x = kernels.decode_layers(x, self._step_tensors, self._step_formats, cos, sin, self.keys, self.values,
                                      positions, heads, kv, dim, self.spec.eps, scale)
            return self._linear(self.head, self._norm(x, self.norm, "norm", deltas), "head", deltas)
        for index, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm, f"{index}.input_norm", deltas)
            qkv = self._linear(layer.qkv, h, f"{index}.qkv", deltas).view(rows, heads + 2 * kv, dim)
            self._qk_rope(qkv, layer, cos, sin, index, deltas)
            attended = kernels.decode_attention(
                qkv[:, :heads].contiguous(), qkv[:, heads:heads + kv].contiguous(), qkv[:, heads + kv:].contiguous(),
                self.keys[index], self.values[index], positions, scale)
            x = x + self._linear(layer.o, attended.view(rows, heads * dim), f"{index}.o", deltas)
            x = x + self._mlp(x, layer, index, deltas)
        return self._linear(self.head, self._norm(x, self.norm, "norm", deltas), "head", deltas)

    def prefill(self, slot: int, tokens: list[int], start: int, *, every_position: bool = False,
                variant: CompiledVariant | None = None) -> torch.Tensor:
        """Positions [start, start + len(tokens)) of one slot, whose cache holds [0, start) already.
        Returns the logits of the last token [vocab] (of every token [n, vocab] with every_position)."""
        return self.prefill_many([(slot, tokens, start)], every_position=every_position, variants=[variant])[0]

    def prefill_many(self, segments: list[tuple[int, list[int], int]], *, every_position: bool = False,
                     variants: list[CompiledVariant | None] | None = None) -> list[torch.Tensor]:
        """Several prompts' next positions in one step: (slot, tokens, start) each, as in `prefill`. Every
        product and every attention computes each token's row as it would alone (gym.infer.fast.kernels), so an
        answer depends neither on which requests were prefilled with it nor on how its prompt was chunked."""
        ends = [start + len(tokens) for _, tokens, start in segments]
        self.grow(max(ends))
        heads, kv, dim = self.spec.heads, self.spec.kv_heads, self.spec.head_dim
        chosen = variants or [None] * len(segments)
        # Each token row answers as its segment's variant.
        deltas = RowDeltas([v for (_, tokens, _), v in zip(segments, chosen) for _ in tokens])
        x = self._embed([t for _, tokens, _ in segments for t in tokens], deltas)
        total = x.shape[0]
        cos = torch.cat([self.cos[start:end] for (_, _, start), end in zip(segments, ends)])
        sin = torch.cat([self.sin[start:end] for (_, _, start), end in zip(segments, ends)])
        offsets = [0]
        for _, tokens, _ in segments:
            offsets.append(offsets[-1] + len(tokens))
        scale = dim ** -0.5
        # The chunk's copies and residual adds run on the kernels' threads (kernels.store_kv_, kernels.add_), and
        # attention reads q from qkv and writes its rows in place: over hundreds of rows torch's operators run on its
        # OpenMP team, whose idle thread can then spin on a core the next product computes on (see store_kv_ in
        # csrc/linear.cpp).
        for index, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm, f"{index}.input_norm", deltas)
            qkv = self._linear(layer.qkv, h, f"{index}.qkv", deltas).view(total, heads + 2 * kv, dim)
            self._qk_rope(qkv, layer, cos, sin, index, deltas)
            keys, values = self.keys[index], self.values[index]
            attended = torch.empty(total, heads, dim)
            for (slot, _, start), first, last in zip(segments, offsets, offsets[1:]):
                kernels.store_kv_(qkv[first:last], keys, values, slot, start, heads)
                kernels.prefill_attention(qkv[first:last, :heads], keys, values, slot, start, scale,
                                          out=attended[first:last])
            attended = attended.view(total, heads * dim)
            kernels.add_(x, self._linear(layer.o, attended, f"{index}.o", deltas))
            kernels.add_(x, self._mlp(x, layer, index, deltas))
        if every_position:
            logits = self._linear(self.head, self._norm(x, self.norm, "norm", deltas), "head", deltas)
            return [logits[first:last] for first, last in zip(offsets, offsets[1:])]
        lasts = torch.tensor(offsets[1:]) - 1
        last_deltas = RowDeltas(list(chosen))
        return list(self._linear(self.head, self._norm(x[lasts], self.norm, "norm", last_deltas), "head",
                                 last_deltas))
