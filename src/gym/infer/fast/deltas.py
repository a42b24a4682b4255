"""Per-row deltas: many fine-tunes of one base answering in one batch.

A variant is the base plus an additive delta on some of its parameters. In a step whose rows use
different variants, every base product still runs once for the whole batch, and each variant adds its
correction on its own rows only: for a projection y = x @ W.T, y[rows] += x[rows] @ D.T, where D is

- a 1-bit delta (BitDelta): alpha * sign, signs packed eight to a byte. The CPU kernel multiplies with
  the packed bits directly (kernels.sign_matmul_add_), so a variant costs 1/32 of a float32 weight read;
- a low-rank delta (a LoRA adapter): (x @ A.T) @ B.T, B carrying the adapter's scaling;
- any other delta (DeltaQuant's int8/int4/int2/ternary codes, a dense delta): expanded to a float matrix
  into a bounded least-recently-used cache (`UnpackedCache`) and multiplied. So are 1-bit deltas where the
  packed kernel cannot run (no compiler, a GPU): the cache's size is the memory/speed trade-off.

A norm's weight delta adds rms(x)-normalised x * dw on the variant's rows, a bias delta adds itself, an
embedding delta adds the token's delta row. Everything is a correction on top of the shared base, so a
row without a variant gets exactly the base's numbers, and a variant's row gets what the model with the
delta merged in gives, up to float rounding (the tests check both against transformers).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gym.core.errors import ConfigError
from gym.infer.fast import kernels
from gym.infer.fast.decoder import layer_norms, layer_products


@dataclass(frozen=True)
class SignDelta:
    """scales (spread over groups of `group_size` inputs) * sign; bits pack the [out, in] signs row-major,
    lowest bit first, 1 = +1 (gym.delta.bitpack's layout, BitDelta's codes as stored)."""

    bits: torch.Tensor  # uint8 [ceil(out * in / 8)]
    scales: torch.Tensor  # float32 [out, groups]
    group_size: int
    shape: tuple[int, int]
    tiled: bool = False  # bits in the packed kernel's tiles of 32 outputs (kernels.tile_signs)

    def dense(self) -> torch.Tensor:
        out_features, in_features = self.shape
        bits = kernels.untile_signs(self.bits, out_features, in_features) if self.tiled else self.bits
        return kernels.unpack_signs(bits, out_features, in_features) * kernels.expand_groups(
            self.scales, self.group_size, in_features)

    @property
    def nbytes(self) -> int:
        return _bytes(self.bits, self.scales)


@dataclass(frozen=True)
class LowRankDelta:
    """up @ down: a LoRA adapter's B (scaled) [out, rank] and A [rank, in]."""

    down: torch.Tensor
    up: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.up.shape[0], self.down.shape[1]

    def dense(self) -> torch.Tensor:
        return self.up @ self.down

    @property
    def nbytes(self) -> int:
        return _bytes(self.down, self.up)


@dataclass(frozen=True)
class CodedDelta:
    """A delta kept in its stored form (quantized codes, or dense) and expanded by `expand` when used."""

    shape: tuple[int, ...]
    expand: Callable[[], torch.Tensor]
    nbytes: int

    def dense(self) -> torch.Tensor:
        return self.expand().float()


ParamDelta = SignDelta | LowRankDelta | CodedDelta | torch.Tensor  # a tensor: a dense 1-D delta (norm, bias)


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class UnpackedCache:
    """Expanded delta matrices, least recently used dropped first, within `budget_bytes` (0: nothing is
    kept, every use expands again)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = max(0, budget_bytes)
        self.used = 0
        self.hits = self.misses = self.evictions = 0
        self._items: OrderedDict[Any, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        value = make()
        size = value.numel() * value.element_size()
        if size > self.budget:
            return value
        with self._lock:
            if key not in self._items:
                self._items[key] = value
                self.used += size
            while self.used > self.budget:
                _, old = self._items.popitem(last=False)
                self.used -= old.numel() * old.element_size()
                self.evictions += 1
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.used = 0

    def drop(self, owner: int) -> None:
        """Forget every matrix of one variant (keys start with its uid)."""
        with self._lock:
            for key in [k for k in self._items if k[0] == owner]:
                self.used -= self._items[key].numel() * self._items[key].element_size()
                del self._items[key]


# -- a variant, arranged for the decoder's fused layers ----------------------------------------------
@dataclass(frozen=True)
class Part:
    param: str  # the parameter's name in the base model
    start: int  # its first output in the fused layer
    size: int


def decoder_layout(model: Any) -> tuple[dict[str, list[Part]], dict[str, str]]:
    """(linears, vectors) of a Llama-family model as the fast decoders fuse it (gym.infer.fast.decoder): for
    each product key ("3.qkv", "3.gate_up", "head", ...) the parameters side by side in it; for each vector
    key ("3.input_norm", "3.qkv.bias", "norm", "embed"...) the parameter it is. Names are
    named_parameters()'s, which name a tied LM head by its embedding."""
    names = {id(p): n for n, p in model.named_parameters()}
    linears: dict[str, list[Part]] = {}
    vectors: dict[str, str] = {"embed": names[id(model.model.embed_tokens.weight)],
                                "norm": names[id(model.model.norm.weight)]}
    for index, layer in enumerate(model.model.layers):
        for kind, modules in layer_products(layer).items():
            start, parts, biases = 0, [], []
            for module in modules:
                parts.append(Part(names[id(module.weight)], start, module.weight.shape[0]))
                if module.bias is not None:
                    biases.append(Part(names[id(module.bias)], start, module.weight.shape[0]))
                start += module.weight.shape[0]
            linears[f"{index}.{kind}"] = parts
            for part in biases:
                linears.setdefault(f"{index}.{kind}.bias", []).append(part)
        for kind, norm in layer_norms(layer).items():
            vectors[f"{index}.{kind}"] = names[id(norm.weight)]
    head = model.get_output_embeddings().weight
    linears["head"] = [Part(names[id(head)], 0, head.shape[0])]
    return linears, vectors


@dataclass
class LinearPlan:
    """A variant's correction to one fused layer: the 1-bit parts as one packed matrix over all its outputs
    (zero scales where a part has no 1-bit delta), the other parts each on its output range, and the bias."""

    sign: SignDelta | None = None
    pieces: list[tuple[int, int, ParamDelta]] = field(default_factory=list)
    bias: torch.Tensor | None = None


_uids = itertools.count(1)


class CompiledVariant:
    """One variant's deltas arranged for the decoder (`compile_variant`)."""

    def __init__(self, name: str, version: str, cache: UnpackedCache) -> None:
        self.name = name
        self.version = version
        self.uid = next(_uids)  # distinct per load, so a replaced variant never meets the old one's cache entries
        self.cache = cache
        self.linears: dict[str, LinearPlan] = {}
        self.vectors: dict[str, torch.Tensor] = {}
        self.embed: ParamDelta | None = None
        self.nbytes = 0
        # 1-bit deltas through the packed kernel (CPU, float32 activations); False: expanded into the cache,
        # which costs memory (a float matrix per layer) and buys a plain matrix product (bench/variants.py).
        self.packed = True

    def matrix(self, key: str, delta: ParamDelta, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The delta as a dense [out, in] matrix, through the shared cache."""
        return self.cache.get((self.uid, key, str(device), dtype), lambda: _dense(delta).to(device, dtype))


def _dense(delta: ParamDelta) -> torch.Tensor:
    return delta.float() if isinstance(delta, torch.Tensor) else delta.dense()


def compile_variant(name: str, version: str, deltas: dict[str, ParamDelta], model: Any, cache: UnpackedCache,
                    device: torch.device | str = "cpu") -> CompiledVariant:
    """Arrange a variant's per-parameter deltas for the decoders of `model` (its base). Every delta must name a
    parameter of the base with its shape; one the decoder does not compute (none, for the supported
    families) is refused by name."""
    device = torch.device(device)
    params = dict(model.named_parameters())
    for param, delta in deltas.items():
        if param not in params:
            raise ConfigError(f"Variant {name!r} changes {param}, which the base model does not have.")
        shape = tuple(delta.shape)
        if shape != tuple(params[param].shape):
            raise ConfigError(f"Variant {name!r}: {param} has shape {list(shape)}, the base's is "
                              f"{list(params[param].shape)}.")
    variant = CompiledVariant(name, version, cache)
    linears, vectors = decoder_layout(model)
    used: set[str] = set()
    for key, parts in linears.items():
        present = [part for part in parts if part.param in deltas]
        if not present:
            continue
        used.update(part.param for part in present)
        width = parts[-1].start + parts[-1].size
        if key.endswith(".bias"):
            bias = torch.zeros(width, device=device)
            for part in present:
                bias[part.start:part.start + part.size] = _dense(deltas[part.param]).to(device)
            variant.linears.setdefault(key[:-len(".bias")], LinearPlan()).bias = bias
            continue
        variant.linears.setdefault(key, LinearPlan())
        _plan(variant.linears[key], parts, deltas, width, device)
    for key, param in vectors.items():
        if param in deltas and key != "embed":
            variant.vectors[key] = _dense(deltas[param]).to(device)
            used.add(param)
    embed_name = vectors["embed"]
    if embed_name in deltas:
        variant.embed = deltas[embed_name]
        used.add(embed_name)
    missing = sorted(set(deltas) - used)
    if missing:
        raise ConfigError(f"Variant {name!r} changes {missing[0]}, which the fast decoder cannot apply per row.")
    variant.nbytes = sum(_nbytes(d) for d in deltas.values())
    return variant


def _nbytes(delta: ParamDelta) -> int:
    return _bytes(delta) if isinstance(delta, torch.Tensor) else delta.nbytes


def _plan(plan: LinearPlan, parts: list[Part], deltas: dict[str, ParamDelta], width: int,
          device: torch.device) -> None:
    """Fill a layer's plan: 1-bit parts fused when they share a group size and whole bytes per row."""
    in_features = deltas[next(p.param for p in parts if p.param in deltas)].shape[-1]
    signs = {p.param: d for p in parts if isinstance(d := deltas.get(p.param), SignDelta)}
    sizes = {d.group_size for d in signs.values()}
    fusable = len(sizes) == 1 and in_features % 8 == 0 and all(
        d.bits.numel() * 8 == d.shape[0] * d.shape[1] for d in signs.values())
    if signs and fusable:
        group_size = sizes.pop()
        groups = next(iter(signs.values())).scales.shape[1]
        bits, scales = [], []
        for part in parts:
            sign = signs.get(part.param)
            if sign is None:
                bits.append(torch.zeros(part.size * in_features // 8, dtype=torch.uint8))
                scales.append(torch.zeros(part.size, groups))
            else:
                bits.append(sign.bits.reshape(-1))
                scales.append(sign.scales.float().reshape(part.size, groups))
        joined = torch.cat(bits)
        # On the CPU the packed kernel reads the signs in tiles of 32 outputs (the same bytes, reordered); a
        # GPU expands them into the cache (SignDelta.dense reads either layout).
        tiled = device.type == "cpu"
        plan.sign = SignDelta((kernels.tile_signs(joined, width, in_features) if tiled else joined).to(device),
                              torch.cat(scales).contiguous().to(device), group_size, (width, in_features), tiled)
    for part in parts:
        delta = deltas.get(part.param)
        if delta is None or (plan.sign is not None and part.param in signs):
            continue
        if isinstance(delta, LowRankDelta):
            delta = LowRankDelta(delta.down.float().to(device), delta.up.float().to(device))
        plan.pieces.append((part.start, part.start + part.size, delta))


# -- applying the deltas of one step's rows ------------------------------------------------------------
def _row_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T with each row computed as it is alone (the kernels' float product, or row by row): a
    variant's correction must not depend on how many of its rows share the step."""
    return kernels.linear_float(x.contiguous(), weight.contiguous())


def _matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.T



@dataclass
class _KeyPlan:
    """One projection's corrections for one step's rows: the packed kernel's (rows, bits, scales, group sizes),
    and (variant, rows, plan, whether its signs went to the kernel) for whatever else applies."""

    entries: tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[int]] | None
    others: list[tuple[CompiledVariant, torch.Tensor, LinearPlan, bool]]


def _signature(variants: list[CompiledVariant | None]) -> tuple[tuple[int, bool] | None, ...]:
    # id() is safe here: the RowDeltas holding a signature holds its variants too, so none can be freed and
    # its address reused while the signature is compared against.
    return tuple(None if v is None else (id(v), v.packed) for v in variants)


class RowDeltas:
    """The variants of one step's rows (None: the base), applied as corrections after each base product."""

    def __init__(self, variants: list[CompiledVariant | None]) -> None:
        groups: dict[int, tuple[CompiledVariant, list[int]]] = {}
        for row, variant in enumerate(variants):
            if variant is not None:
                groups.setdefault(variant.uid, (variant, []))[1].append(row)
        self.groups = [(variant, torch.tensor(rows)) for variant, rows in groups.values()]
        # A step calls linear() ~120 times with the same rows: their device copies and the row lists of the
        # kernel's entries are made once (Python bookkeeping had cost ~20 ms of a 16-variant int8 step).
        self._placed: dict[torch.device, list[tuple[CompiledVariant, torch.Tensor, int]]] = {}
        self._joined: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}
        # Per projection, what linear() does: built at its first call. A decoder keeps one RowDeltas while its
        # rows' variants stay the same (same_rows), so a decode step reuses the previous step's plans.
        self._plans: dict[tuple[str, torch.device, bool], _KeyPlan] = {}
        self.signature = _signature(variants)

    def same_rows(self, variants: list[CompiledVariant | None]) -> bool:
        """Whether `variants` (one per row) are this object's, in the same order and packing."""
        return self.signature == _signature(variants)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def _on(self, device: torch.device) -> list[tuple[CompiledVariant, torch.Tensor, int]]:
        """(variant, its rows on `device`, how many) per variant of the step."""
        placed = self._placed.get(device)
        if placed is None:
            placed = self._placed[device] = [(variant, rows.to(device), len(rows)) for variant, rows in self.groups]
        return placed

    def _rows_of(self, device: torch.device, which: tuple[int, ...]) -> torch.Tensor:
        """The rows of the step's variants `which` (indices into groups), one after another."""
        joined = self._joined.get((device, which))
        if joined is None:
            placed = self._on(device)
            joined = self._joined[(device, which)] = torch.cat([placed[i][1] for i in which])
        return joined

    def _linear_plan(self, key: str, device: torch.device, kernel: bool) -> _KeyPlan:
        """What linear() does for `key`: the packed kernel's entries, and the rows that take the other paths."""
        packed: list[int] = []
        bits: list[torch.Tensor] = []
        scales: list[torch.Tensor] = []
        sizes: list[int] = []
        others: list[tuple[CompiledVariant, torch.Tensor, LinearPlan, bool]] = []
        for index, (variant, rows, count) in enumerate(self._on(device)):
            plan = variant.linears.get(key)
            if plan is None:
                continue
            sign = plan.sign
            through_kernel = sign is not None and variant.packed and kernel and sign.tiled
            if sign is not None and through_kernel:
                packed.append(index)
                bits += [sign.bits] * count
                scales += [sign.scales] * count
                sizes += [sign.group_size] * count
            if not through_kernel or plan.pieces or plan.bias is not None:
                others.append((variant, rows, plan, through_kernel))
        entries = (self._rows_of(device, tuple(packed)), bits, scales, sizes) if packed else None
        return _KeyPlan(entries, others)

    def linear(self, key: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (= x @ W.T of the base, [rows, out]) plus each row's variant's correction, in place."""
        kernel = y.device.type == "cpu" and y.dtype == torch.float32
        plan_key = (key, x.device, kernel)
        key_plan = self._plans.get(plan_key)
        if key_plan is None:
            key_plan = self._plans[plan_key] = self._linear_plan(key, x.device, kernel)
        product = _row_product if kernel else _matmul
        for variant, rows, plan, through_kernel in key_plan.others:
            if plan.sign is not None and not through_kernel:
                y[rows] += product(x[rows], variant.matrix(key, plan.sign, y.device, y.dtype))
            for start, stop, delta in plan.pieces:
                if isinstance(delta, LowRankDelta):
                    correction = product(product(x[rows].float(), delta.down), delta.up)
                else:
                    correction = product(x[rows], variant.matrix(f"{key}:{start}", delta, y.device, y.dtype))
                y[rows, start:stop] += correction.to(y.dtype)
            if plan.bias is not None:
                y[rows] += plan.bias.to(y.dtype)
        if key_plan.entries is not None:
            rows_, bits, scales, sizes = key_plan.entries
            kernels.sign_matmul_add_(y, x.contiguous(), rows_, bits, scales, sizes)
        return y

    def norm(self, key: str, x: torch.Tensor, normed: torch.Tensor, eps: float) -> torch.Tensor:
        """normed (= rms_norm(x, w) of the base) plus rms_norm(x, dw) on each variant's rows, in place; x and
        normed may be [rows, ..., width] (the q/k norms run per head)."""
        for variant, rows, _ in self._on(x.device):
            delta = variant.vectors.get(key)
            if delta is None:
                continue
            part = x[rows].float()
            if part.device.type == "cpu":  # the kernels' rms norm: each row as it is alone
                width = part.shape[-1]
                scaled = kernels.rms_norm(part.reshape(-1, width).contiguous(), delta.float(), eps).view(part.shape)
            else:
                scaled = part * torch.rsqrt(part.pow(2).mean(-1, keepdim=True) + eps) * delta
            normed[rows] += scaled.to(normed.dtype)
        return normed

    def embed(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x (= the base's embedding rows of `tokens`) plus each variant's delta rows, in place."""
        for variant, rows, _ in self._on(x.device):
            delta = variant.embed
            if delta is None:
                continue
            ids = tokens[rows]
            if isinstance(delta, SignDelta):
                width = delta.shape[1]
                per_row = width // 8 if width % 8 == 0 else 0
                for row, token in zip(rows.tolist(), ids.tolist()):
                    if per_row:
                        signs = kernels.unpack_signs(delta.bits[token * per_row:(token + 1) * per_row], 1, width)
                    else:
                        signs = kernels.unpack_signs(delta.bits, delta.shape[0], width)[token:token + 1]
                    scale = kernels.expand_groups(delta.scales[token:token + 1].float(), delta.group_size, width)
                    x[row] += (signs * scale)[0].to(x.device, x.dtype)
            elif isinstance(delta, LowRankDelta):
                x[rows] += (delta.up[ids.cpu()].float() @ delta.down.float()).to(x.device, x.dtype)
            else:
                x[rows] += variant.matrix("embed", delta, x.device, x.dtype)[ids]
        return x

    def has_vector(self, key: str) -> bool:
        return any(key in variant.vectors for variant, _ in self.groups)
