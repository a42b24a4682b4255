"""`gym delta compress | apply | inspect | eval`: the delta tools on the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gym.cli.arguments import CommandParser
from gym.cli.gates import add_gate_flags, gate_from
from gym.core.errors import ConfigError
from gym.core.files import human_bytes, refuse_overwrite
from gym.delta.apply import apply_delta, write_applied
from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.delta.evaluate import GainKept, eval_loss, eval_rows
from gym.delta.format import load_delta
from gym.delta.weights import load_model
from gym.models.loader import load_tokenizer, resolve_model_path

COMPRESSION_METHODS = ("bitdelta", "int8", "int4", "int2", "ternary", "binary")
MAX_MIN_KEPT = 2.0  # --min-kept's largest share: a compressed model may score above its fine-tune, not twice it


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="gym delta", description="Store a fine-tune as a compressed delta "
                           "from its base, and get it back.")
    sub = parser.add_subparsers(dest="verb", required=True)

    c = sub.add_parser("compress", help="base + fine-tune (model folder or LoRA adapter) -> delta file")
    c.add_argument("--base", required=True, help="base model: short name, hub id or folder")
    c.add_argument("--finetuned", required=True, help="fine-tuned model folder, or a LoRA adapter folder of the base")
    c.add_argument("--method", choices=COMPRESSION_METHODS, default="bitdelta")
    c.add_argument("-o", "--output", required=True, help="the .safetensors file to write")
    c.add_argument("--overwrite", action="store_true", help="replace an existing file at --output")
    c.add_argument("--distill-steps", type=int, default=200, help="bitdelta: scale-distillation steps (0: none)")
    c.add_argument("--distill-lr", type=float, default=1e-4)
    c.add_argument("--distill-batch-size", type=int, default=1)
    c.add_argument("--seq-len", type=int, default=128, help="calibration sequence length in tokens")
    c.add_argument("--calibration", help="calibration data: a dataset name (dataset_info.json) or a file")
    c.add_argument("--dataset-dir", default="data", help="folder of dataset_info.json")
    c.add_argument("--group-size", type=int, help="one scale per this many weights of a row")
    c.add_argument("--safety-threshold", type=float, help="bitdelta: int8 for matrices whose 1-bit error exceeds it")
    c.add_argument("--no-compress-embeddings", action="store_true", help="store a changed embedding dense")
    c.add_argument("--enable-deltasoup", action="store_true", help="mark the delta as contributable to DeltaSoup")
    c.add_argument("--per-tensor", action="store_true", help="int/ternary/binary: one scale per tensor")
    c.add_argument("--asymmetric", action="store_true", help="int methods: asymmetric codes with a zero point")
    c.add_argument("--clip-percentile", type=float, help="int methods: clip each unit's range at this percentile")
    c.add_argument("--calibration-samples", type=int, default=0, help="sequences that weigh errors (mixed precision)")
    c.add_argument("--bit-budget", type=float, help="mixed precision: average bits per weight, chosen by sensitivity")
    c.add_argument("--layer-bits", help='mixed precision by name: "down_proj=int8,self_attn=int4"')
    c.add_argument("--eval-task", action="append", default=[],
                   help="a `gym eval` task (repeatable): score base, fine-tune and compressed model on it")
    c.add_argument("--min-kept", type=float,
                   help="with --eval-task: fail when the compressed model keeps less of the fine-tune's score")
    c.add_argument("--eval-limit", type=int, help="with --eval-task: at most this many items per task/subject")
    add_gate_flags(c)

    a = sub.add_parser("apply", help="base + delta -> model folder")
    a.add_argument("--base", required=True)
    a.add_argument("--delta", required=True)
    a.add_argument("-o", "--output", required=True, help="model folder to write")
    a.add_argument("--overwrite", action="store_true")

    i = sub.add_parser("inspect", help="size, ratio and per-layer error of a delta file")
    i.add_argument("delta")
    i.add_argument("--all", action="store_true", help="list every parameter, not only the 12 worst")

    e = sub.add_parser("eval", help="eval loss of base, fine-tune and reconstruction; the share of the gain kept")
    e.add_argument("--base", required=True)
    e.add_argument("--finetuned", required=True)
    e.add_argument("--delta", required=True)
    e.add_argument("--dataset", required=True)
    e.add_argument("--dataset-dir", default="data")
    e.add_argument("--max-samples", type=int, default=64)
    e.add_argument("--cutoff-len", type=int, default=512)
    return parser


def quantizer_for(args: argparse.Namespace) -> Any:
    if args.method == "bitdelta":
        return BitDeltaQuantizer(BitDeltaConfig(
            group_size=args.group_size, safety_threshold=args.safety_threshold,
            enable_deltasoup=args.enable_deltasoup, compress_embeddings=not args.no_compress_embeddings,
            distill_steps=args.distill_steps, distill_lr=args.distill_lr, distill_seq_len=args.seq_len,
            distill_batch_size=args.distill_batch_size, calibration=args.calibration, calibration_dir=args.dataset_dir))
    layer_bits = None
    if args.layer_bits:
        pairs = [p.split("=", 1) for p in args.layer_bits.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError(f'--layer-bits takes "pattern=method,...", e.g. "down_proj=int8", '
                              f'got {args.layer_bits!r}.')
        layer_bits = {k.strip(): v.strip() for k, v in pairs}
    return DeltaQuantizer(DeltaQuantConfig(
        method=args.method, per_channel=not args.per_tensor, calibration_samples=args.calibration_samples,
        group_size=args.group_size, symmetric=not args.asymmetric, clip_percentile=args.clip_percentile,
        layer_bits=layer_bits, bit_budget=args.bit_budget, compress_embeddings=not args.no_compress_embeddings,
        enable_deltasoup=args.enable_deltasoup, calibration=args.calibration, calibration_dir=args.dataset_dir,
        seq_len=args.seq_len))


def compress(args: argparse.Namespace) -> int:
    quantizer = quantizer_for(args)  # option errors before any model is loaded
    if args.min_kept is not None and not args.eval_task:
        raise ConfigError("--min-kept needs --eval-task: the task whose score the compressed model must keep.")
    # A share of the fine-tune's score: 0.95 for 95%. It can pass 1 (a compressed model may score better), but
    # `95` is a percentage typed as one, found only after minutes of compressing and scoring.
    if args.min_kept is not None and not 0 < args.min_kept <= MAX_MIN_KEPT:
        raise ConfigError(f"--min-kept is the share of the fine-tune's score to keep (0.95 for 95%), above 0 and at "
                          f"most {MAX_MIN_KEPT:g}; got {args.min_kept:g}.")
    if args.eval_task:
        from gym.eval.config import parse_task

        for task in args.eval_task:
            parse_task(task)
    gate = gate_from(args, args.dataset_dir)
    if gate is not None:
        gate.check()  # the safety set and the judge read
    refuse_overwrite(args.output, args.overwrite)  # and before minutes of compression, not after
    base, finetuned = load_model(args.base), load_model(args.finetuned, args.base)
    tokenizer = load_tokenizer(resolve_model_path(args.base)) if quantizer.needs_tokenizer else None
    result = quantizer.compress(base, finetuned, tokenizer=tokenizer, base_name=args.base)
    if gate is not None:  # the compressed delta, as it will be served, against its base; refused: nothing written
        from gym.delta.safety import gate_delta

        del base, finetuned
        decision = gate_delta(gate, args.base, result.entries, result.header, source=args.output)
        decision.raise_if_refused()
        print(decision.message())
        result.header["safety_gate"] = decision.to_dict()
    path = result.save(args.output, overwrite=args.overwrite)
    size, fp16 = path.stat().st_size, 2 * result.header["base"]["parameters"]
    print(f"Wrote {path}: {human_bytes(size)}, {fp16 / size:.1f}x smaller than the fine-tune in fp16 "
          f"({human_bytes(fp16)}), {len(result.entries)} changed parameters, {result.seconds:.0f} s.")
    if args.eval_task:
        from gym.eval.after_training import delta_quality_gate

        print(delta_quality_gate(args.base, args.finetuned, str(path), args.eval_task, dataset_dir=args.dataset_dir,
                                 min_kept=args.min_kept, limit=args.eval_limit))
    return 0


def apply(args: argparse.Namespace) -> int:
    out = write_applied(args.base, args.delta, args.output, overwrite=args.overwrite)
    print(f"Wrote {out} (load it with transformers, or `gym chat model_name_or_path={out}`).")
    return 0


def inspect_delta(args: argparse.Namespace) -> int:
    _, header = load_delta(args.delta)  # every tensor read and checked (shape, codes, NaN/Inf), not just the header
    size = Path(args.delta).stat().st_size
    base, stats = header.get("base") or {}, header.get("stats") or {}
    if not isinstance(base.get("parameters"), int) or not isinstance(stats.get("entries"), dict):
        raise ConfigError(f"{args.delta}: the delta header lacks its base or stats section; the file is damaged.")
    fp16 = 2 * base["parameters"]
    entries = stats["entries"]
    print(f"{args.delta}: {header['method']} delta (format v{header['version']}), {human_bytes(size)} on disk, "
          f"{fp16 / size:.1f}x smaller than the whole model in fp16 ({human_bytes(fp16)})")
    print(f"base: {base.get('name') or 'unnamed (made without base_name=)'} "
          f"(fingerprint {str(base.get('fingerprint'))[:16]}...)")
    print(f"changed parameters: {len(entries)}; DeltaSoup: "
          f"{'eligible' if header.get('deltasoup', {}).get('eligible') else 'not eligible'}")
    if "distillation" in header:
        d = header["distillation"]
        print(f"scale distillation: {d['steps']} steps, logit MSE {d['mse_before']:.4f} -> {d['mse_after']:.4f}")
    if isinstance(header.get("safety_gate"), dict):
        gate = header["safety_gate"]
        print(f"safety gate: {gate.get('decision')} on {gate.get('set')} (judge {gate.get('judge')}): harmful "
              f"compliance {gate.get('base_rate')} -> {gate.get('candidate_rate')}, p = {gate.get('p_value')}")
    by_error = sorted(entries.items(), key=lambda kv: -kv[1]["relative_error"])
    shown = by_error if args.all else by_error[:12]
    print(f"\n{'parameter':<56} {'encoding':<8} {'bytes':>10} {'rel. error':>10}")
    for name, e in shown:
        print(f"{name:<56} {e['encoding']:<8} {e['bytes']:>10} {e['relative_error']:>10.4f}")
    if len(shown) < len(entries):
        print(f"... {len(entries) - len(shown)} more (--all lists them)")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    entries, header = load_delta(args.delta)
    rows = eval_rows(load_tokenizer(resolve_model_path(args.base)), args.dataset, args.dataset_dir,
                     args.cutoff_len, args.max_samples)
    base_loss = eval_loss(load_model(args.base), rows)
    finetuned_loss = eval_loss(load_model(args.finetuned, args.base), rows)
    reconstructed = apply_delta(load_model(args.base), entries, header, args.delta)
    result = GainKept(base_loss, finetuned_loss, eval_loss(reconstructed, rows))
    print(f"eval loss on {len(rows)} rows of {args.dataset}: base {result.base_loss:.4f}, fine-tune "
          f"{result.finetuned_loss:.4f}, reconstruction {result.reconstructed_loss:.4f}; "
          f"gain kept {100 * result.kept:.1f}%")
    return 0


VERBS = {"compress": compress, "apply": apply, "inspect": inspect_delta, "eval": evaluate}


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return VERBS[args.verb](args)
