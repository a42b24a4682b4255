"""The fast engine's decoder on a GPU: the Llama-family layer (gym.infer.fast.decoder) in torch ops, a
static KV cache and a decode step replayed as a CUDA graph.

A decode step of a small model on a GPU is launch-bound, not bandwidth-bound: Qwen3-0.6B's step is
~1,100 small kernels, each a few microseconds of work behind ~5 µs of Python dispatch and launch. So the
step is captured once per (batch bucket, cache-length bucket) as a CUDA graph, and each later step is
one replay: inputs copied into the graph's static tensors, every kernel launched by the driver at once.
With `compile` (infer_compile: true) the layer's three pieces (norm, projections, q/k norms and rotary;
output projection and MLP; final norm and head) are compiled with torch.compile first, Triton fusing
the glue between the products: one program per piece serves every layer, because weights are
arguments, so compiling costs seconds where the unrolled 28-layer step took more than five minutes on
the H100 machine (docs/benchmarks.md). Where it fails, the reason is logged and the graphs hold the
eager kernels.

The buckets bound what is captured: batch sizes round up to a power of two (at most the slot count),
and attention reads the cache up to the next power of two above the longest row (at least 256), so
a short conversation does not read a long cache's worth of keys. Padding rows write their keys to a
scratch slot past the real ones, so they never touch a request's cache.

Prefill runs outside the graphs (through the same compiled pieces), every prompt segment of a step in
one walk through the layers. The interface is FastDecoder's (decode, prefill_many,
move_slot, read_block, write_block, grow), so FastEngine, chunked prefill and the prefix cache run on
it unchanged. Weights stay in the model's dtype (bfloat16 on GPUs that have it): the CPU's int8/int4
formats are not offered here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gym.infer.fast.cache import SlotCache
from gym.infer.fast.decoder import DecoderSpec, Layer, Weights, fuse, rotary_tables, share
from gym.infer.fast.deltas import CompiledVariant, RowDeltas

logger = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 256
# Not cuDNN's attention: it builds a plan for every new shape (0.6-1.2 s each on the H100), so every new
# prompt length paid it in its time to first token (docs/benchmarks.md, GPU section).
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class GpuLinear(NamedTuple):
    """A product as F.linear takes it: the weight (projections fused side by side, as the model's own
    modules now view it) and its bias."""

    weight: torch.Tensor
    bias: torch.Tensor | None


GpuLayer = Layer[GpuLinear, torch.Tensor]


def _product(modules: list[Any]) -> GpuLinear:
    """The modules' outputs from one F.linear; their weights then view into the fused one (no second copy
    of the model on the GPU)."""
    weight, bias = fuse(modules)
    share(modules, weight)
    return GpuLinear(weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' order of operations: normalize in float32, back to the model dtype, then scale.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logits: torch.Tensor


class _Pieces(NamedTuple):
    """A layer step's base-row pieces, eager or compiled: norm + q/k/v (+ q/k norms, rotary); output
    projection + MLP with their residual adds; final norm + head."""

    qkv: Callable[..., Any]
    residual: Callable[..., Any]
    logits: Callable[..., Any]


def buckets(limit: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two below `limit`, then `limit`."""
    sizes = []
    size = 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return sizes + [limit]


class GpuDecoder(SlotCache):
    """Forward passes over a KV cache of `slots` rows on the model's (CUDA) device, in the model's dtype.
    `graphs`: capture decode steps as CUDA graphs (on CUDA by default; elsewhere the step runs eagerly,
    which is what the CPU tests check); `compile`: torch.compile the step first."""

    # Prompt tokens per engine step: a prefill chunk is launch-bound on the GPU (the H100 took ~20 ms for
    # 256 tokens and for 1,024), so small chunks only multiply a long prompt's time to first token.
    prefill_chunk = 2048

    def __init__(self, model: Any, *, slots: int, max_length: int | None = None, graphs: bool | None = None,
                 compile: bool = False) -> None:
        self.spec = DecoderSpec.from_config(model.config)
        parameter = next(model.parameters())
        self.device, self.model_dtype = parameter.device, parameter.dtype
        cuda = self.device.type == "cuda"
        self.use_graphs = cuda if graphs is None else graphs and cuda
        self.max_length = self.spec.max_length(max_length)
        weights = Weights.read(model, lambda _, modules: _product(modules), norm=lambda weight: weight)
        self.embed, self.norm, self.head = weights.embed, weights.norm, weights.head
        self.layers: list[GpuLayer] = weights.layers
        # transformers computes the tables in float32 and casts them to the activations' dtype.
        cos, sin = rotary_tables(model, self.max_length, self.device)
        self.cos, self.sin = cos.to(self.model_dtype).contiguous(), sin.to(self.model_dtype).contiguous()
        self.dtype = str(self.model_dtype).removeprefix("torch.")
        self.slots = slots
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool: Any = None
        self.graph_seconds = 0.0  # time spent capturing graphs (and compiling for them)
        self.compile_reason: str | None = None
        self.compile_seconds = 0.0
        # Wrapped so that the compiled frames hold no int arguments (dynamic=True would make them symbolic).
        self._eager = _Pieces(qkv=lambda x, layer, cos, sin: self._qkv(x, layer, cos, sin),
                              residual=lambda x, attended, layer: self._residual(x, attended, layer),
                              logits=lambda x: self._logits(x, None))
        self._pieces = self._eager
        self.grow(min(MIN_LENGTH_BUCKET, self.max_length))
        if compile:
            self._pieces = self._compiled_pieces()

    def _compiled_pieces(self) -> _Pieces:
        """The three base-row pieces of a layer step, compiled. Each takes its layer's weights as
        arguments and its sizes from its tensors, so one compiled program serves every layer, decode and
        prefill alike (dynamic in the row count): compiling costs a few programs, not the whole unrolled
        model (that took more than five minutes for 28 layers on the H100 machine)."""
        try:
            import torch._dynamo

            started = time.perf_counter()
            pieces = _Pieces(*(torch.compile(piece, dynamic=True, fullgraph=True) for piece in self._eager))
            # Compile now, through the real decode and prefill paths (their inputs' layouts are part of
            # what a program is specialized on), for one row and for many (the size-1 case is its own
            # program), writing only the scratch slot: start-up pays for it and says how long it took,
            # and a failure (no Triton, a compiler error) is found here.
            self._pieces = pieces
            for rows in (1, 2):
                self.prefill_many([(self.slots, [0] * rows, 0)])
                zeros = torch.zeros(rows, dtype=torch.long, device=self.device)
                self._decode_step(zeros, zeros, torch.full_like(zeros, self.slots), MIN_LENGTH_BUCKET)
            self.compile_seconds = time.perf_counter() - started
            logger.info("Compiled the layer step with torch.compile in %.1fs", self.compile_seconds)
            return pieces
        except Exception as exc:  # no Triton/compiler here: the graphs still remove the launch overhead
            self.compile_reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            logger.warning("torch.compile failed on the layer step (%s); running eager kernels.", self.compile_reason)
            return self._eager

    @property
    def compiled(self) -> bool:
        """Whether steps run torch.compile's kernels."""
        return self._pieces is not self._eager

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (the embedding row lookup aside)."""
        tensors = [self.head.weight, self.norm] + [t for layer in self.layers for t in (
            layer.input_norm, layer.post_norm, layer.qkv.weight, layer.o.weight, layer.gate_up.weight,
            layer.down.weight)]
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- the cache ---------------------------------------------------------------------------------------
    def grow(self, length: int) -> None:
        """Make room for `length` positions per slot (capacity doubles, up to max_length). The graphs read
        the cache tensors they were captured with, so growing drops them (they are captured again)."""
        if length <= self.capacity:
            return
        if length > self.max_length:
            raise ValueError(f"{length} positions exceed the model's {self.max_length}")
        capacity = min(self.max_length, max(length, 2 * self.capacity))
        # One slot more than the requests have: the scratch slot that padding rows of a graph write to.
        shape = (self.slots + 1, self.spec.kv_heads, capacity, self.spec.head_dim)
        # The old graphs go with their memory pool: a pool whose graphs were freed cannot take a new capture.
        self._graphs.clear()
        self._pool = None
        for index in range(len(self.layers)):
            keys = torch.zeros(shape, dtype=self.model_dtype, device=self.device)
            values = torch.zeros(shape, dtype=self.model_dtype, device=self.device)
            self._install(index, keys, values)
        self.capacity = capacity

    # -- the layer's pieces shared by decode and prefill ------------------------------------------------
    def _qkv(self, x: torch.Tensor, layer: GpuLayer, cos: torch.Tensor, sin: torch.Tensor, index: int = 0,
             deltas: RowDeltas | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [tokens, heads, dim], k and v [tokens, kv_heads, dim] of x, normed (where the model norms
        them) and rotated; with `deltas`, each row's variant's corrections added (gym.infer.fast.deltas)."""
        heads, kv, dim = self.spec.heads, self.spec.kv_heads, self.spec.head_dim
        h = self._norm(x, layer.input_norm, f"{index}.input_norm", deltas)
        qkv = self._linear(h, layer.qkv, f"{index}.qkv", deltas)
        q, k, v = qkv.view(x.shape[0], heads + 2 * kv, dim).split([heads, kv, kv], dim=1)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = self._norm(q, layer.q_norm, f"{index}.q_norm", deltas)
            k = self._norm(k, layer.k_norm, f"{index}.k_norm", deltas)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def _mlp(self, x: torch.Tensor, layer: GpuLayer, index: int = 0, deltas: RowDeltas | None = None) -> torch.Tensor:
        h = self._norm(x, layer.post_norm, f"{index}.post_norm", deltas)
        gate, up = self._linear(h, layer.gate_up, f"{index}.gate_up", deltas).chunk(2, dim=-1)
        return self._linear(F.silu(gate) * up, layer.down, f"{index}.down", deltas)

    def _residual(self, x: torch.Tensor, attended: torch.Tensor, layer: GpuLayer, index: int = 0,
                  deltas: RowDeltas | None = None) -> torch.Tensor:
        """x after the layer's attention output projection and MLP, each added to the residual stream."""
        x = x + self._linear(attended, layer.o, f"{index}.o", deltas)
        return x + self._mlp(x, layer, index, deltas)

    # Base rows (no variant deltas) go through these three, compiled (infer_compile) or not; variant rows
    # through the eager pieces with their deltas.
    def _attention_inputs(self, x: torch.Tensor, layer: GpuLayer, cos: torch.Tensor, sin: torch.Tensor, index: int,
                          deltas: RowDeltas | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._qkv(x, layer, cos, sin, index, deltas) if deltas else self._pieces.qkv(x, layer, cos, sin)

    def _attention_output(self, x: torch.Tensor, attended: torch.Tensor, layer: GpuLayer, index: int,
                          deltas: RowDeltas | None) -> torch.Tensor:
        if deltas:
            return self._residual(x, attended, layer, index, deltas)
        return self._pieces.residual(x, attended, layer)

    def _output(self, x: torch.Tensor, deltas: RowDeltas | None) -> torch.Tensor:
        return self._logits(x, deltas) if deltas else self._pieces.logits(x)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, key: str, deltas: RowDeltas | None) -> torch.Tensor:
        normed = rms_norm(x, weight, self.spec.eps)
        return deltas.norm(key, x, normed, self.spec.eps) if deltas else normed

    @staticmethod
    def _linear(x: torch.Tensor, linear: GpuLinear, key: str, deltas: RowDeltas | None) -> torch.Tensor:
        y = F.linear(x, linear.weight, linear.bias)
        return deltas.linear(key, x, y) if deltas else y

    def _embed(self, tokens: torch.Tensor, deltas: RowDeltas | None) -> torch.Tensor:
        x = F.embedding(tokens, self.embed)
        return deltas.embed(tokens, x) if deltas else x

    def _logits(self, x: torch.Tensor, deltas: RowDeltas | None) -> torch.Tensor:
        return self._linear(self._norm(x, self.norm, "norm", deltas), self.head, "head", deltas).float()

    # -- decode ------------------------------------------------------------------------------------------
    def _decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                     length: int, deltas: RowDeltas | None = None) -> torch.Tensor:
        """Logits [rows, vocab] float32 of one token per row; row i attends over cache slot i's first
        `length` positions (masked to its own position) and writes its keys to cache slot `slots[i]`."""
        rows = tokens.shape[0]
        heads, kv, dim = self.spec.heads, self.spec.kv_heads, self.spec.head_dim
        x = self._embed(tokens, deltas)
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        mask = (torch.arange(length, device=tokens.device)[None, :] <= positions[:, None])[:, None, None, :]
        for index, layer in enumerate(self.layers):
            q, k, v = self._attention_inputs(x, layer, cos, sin, index, deltas)
            keys, values = self.keys[index], self.values[index]
            keys[slots, :, positions] = k
            values[slots, :, positions] = v
            # The query heads sharing a key head attend as that head's "queries" (transformers' repeat_kv
            # maps query head h to key head h // group): no copy of the cache per group, and any SDPA
            # kernel that takes a mask serves it.
            with sdpa_kernel(ATTENTION_BACKENDS):
                attended = F.scaled_dot_product_attention(q.reshape(rows, kv, heads // kv, dim),
                                                          keys[:rows, :, :length], values[:rows, :, :length],
                                                          attn_mask=mask)
            x = self._attention_output(x, attended.reshape(rows, heads * dim), layer, index, deltas)
        return self._output(x, deltas)

    def _length_bucket(self, needed: int) -> int:
        bucket = MIN_LENGTH_BUCKET
        while bucket < needed:
            bucket *= 2
        return min(bucket, self.capacity)

    def decode(self, tokens: list[int], lengths: list[int],
               variants: list[CompiledVariant | None] | None = None) -> torch.Tensor:
        """One token for each of the first len(tokens) slots, slot i holding lengths[i] positions already,
        row i answering as variants[i] (None: the base). Returns the logits [rows, vocab] float32 on the
        device; each slot's cache grows by one position. A step with variants runs eagerly: which rows use
        which delta changes from step to step, and a graph replays one fixed set of kernels."""
        rows = len(tokens)
        self.grow(max(lengths) + 1)
        length = self._length_bucket(max(lengths) + 1)
        deltas = RowDeltas(variants or [])
        if deltas or not self.use_graphs:
            args = (torch.tensor(tokens, device=self.device), torch.tensor(lengths, device=self.device),
                    torch.arange(rows, device=self.device), length)
            return self._decode_step(*args, deltas)
        size = next(b for b in buckets(self.slots) if b >= rows)
        graph = self._graphs.get((size, length))
        if graph is None:
            graph = self._capture(size, length)
        pad = size - rows
        graph.tokens.copy_(torch.tensor(tokens + [0] * pad), non_blocking=True)
        graph.positions.copy_(torch.tensor(lengths + [0] * pad), non_blocking=True)
        graph.slots.copy_(torch.tensor(list(range(rows)) + [self.slots] * pad), non_blocking=True)
        graph.graph.replay()
        return graph.logits[:rows].clone()  # the graph's output buffer is overwritten by the next replay

    def _capture(self, size: int, length: int) -> _Graph:
        started = time.perf_counter()
        tokens = torch.zeros(size, dtype=torch.long, device=self.device)
        positions = torch.zeros(size, dtype=torch.long, device=self.device)
        scratch = torch.full((size,), self.slots, dtype=torch.long, device=self.device)  # warm-up writes nowhere
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # compile, autotune and allocate outside the capture
            for _ in range(2):
                self._decode_step(tokens, positions, scratch, length)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._decode_step(tokens, positions, scratch, length)
        captured = _Graph(graph, tokens, positions, scratch, logits)
        self._graphs[(size, length)] = captured
        seconds = time.perf_counter() - started
        self.graph_seconds += seconds
        logger.info("Captured the decode step for %d rows over %d positions in %.1fs", size, length, seconds)
        return captured

    def warm_up(self, lengths: tuple[int, ...] = (MIN_LENGTH_BUCKET,)) -> None:
        """Capture every batch bucket's graph for these cache lengths now, not on the first requests."""
        if not self.use_graphs:
            return
        for length in lengths:
            self.grow(length)
            for size in buckets(self.slots):
                if (size, min(length, self.capacity)) not in self._graphs:
                    self._capture(size, min(length, self.capacity))

    # -- prefill -----------------------------------------------------------------------------------------
    def prefill(self, slot: int, tokens: list[int], start: int, *, every_position: bool = False,
                variant: CompiledVariant | None = None) -> torch.Tensor:
        return self.prefill_many([(slot, tokens, start)], every_position=every_position, variants=[variant])[0]

    def prefill_many(self, segments: list[tuple[int, list[int], int]], *, every_position: bool = False,
                     variants: list[CompiledVariant | None] | None = None) -> list[torch.Tensor]:
        """Several prompts' next positions, (slot, tokens, start) each, as its variant (None: the base), in
        one walk through the layers: the segments' rows go through each projection together, and each
        segment attends over its own slot. A prefill step is launch-bound on a GPU (~20 ms for one 32-token
        prompt or for 1,024 tokens on the H100), so sixteen prompts arriving together cost one walk, not
        sixteen. Unlike the CPU decoder's own kernels, cuBLAS picks its kernel by the number of rows, so a
        prompt's last bits of rounding may depend on what it was prefilled with (as a decode step's do on
        the batch bucket it falls in)."""
        ends = [start + len(tokens) for _, tokens, start in segments]
        self.grow(max(ends))
        heads, dim = self.spec.heads, self.spec.head_dim
        chosen = variants or [None] * len(segments)
        counts = [len(tokens) for _, tokens, _ in segments]
        deltas = RowDeltas([v for v, count in zip(chosen, counts) for _ in range(count)])
        x = self._embed(torch.tensor([t for _, tokens, _ in segments for t in tokens], device=self.device), deltas)
        positions = torch.tensor([p for (_, _, start), end in zip(segments, ends) for p in range(start, end)],
                                 device=self.device)
        slots = torch.tensor([slot for (slot, _, _), count in zip(segments, counts) for _ in range(count)],
                             device=self.device)
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        offsets = [0]
        for count in counts:
            offsets.append(offsets[-1] + count)
        # Query i of a segment sees keys [0, start + i]; with no earlier positions that is the plain causal mask.
        masks = [None if start == 0 else (torch.arange(end, device=self.device)[None, :]
                                          <= torch.arange(start, end, device=self.device)[:, None])
                 for (_, _, start), end in zip(segments, ends)]
        for index, layer in enumerate(self.layers):
            q, k, v = self._attention_inputs(x, layer, cos, sin, index, deltas)
            keys, values = self.keys[index], self.values[index]
            keys[slots, :, positions] = k
            values[slots, :, positions] = v
            attended = torch.empty(x.shape[0], heads * dim, dtype=x.dtype, device=self.device)
            for (slot, _, _), end, mask, first, last in zip(segments, ends, masks, offsets, offsets[1:]):
                with sdpa_kernel(ATTENTION_BACKENDS):
                    out = F.scaled_dot_product_attention(
                        q[first:last].transpose(0, 1)[None], keys[slot:slot + 1, :, :end],
                        values[slot:slot + 1, :, :end], attn_mask=mask, is_causal=mask is None, enable_gqa=True)
                attended[first:last] = out[0].transpose(0, 1).reshape(last - first, heads * dim)
            x = self._attention_output(x, attended, layer, index, deltas)
        if every_position:
            logits = self._output(x, deltas)
            return [logits[first:last] for first, last in zip(offsets, offsets[1:])]
        lasts = torch.tensor(offsets[1:], device=self.device) - 1
        return list(self._output(x[lasts], RowDeltas(list(chosen))))
