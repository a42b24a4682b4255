"""`gym variants`: per-user variants of one base in a store folder (gym.personalization)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gym.cli.arguments import CommandParser, option_strings
from gym.cli.gates import add_gate_flags, gate_from
from gym.config.files import CONFIG_SUFFIXES, parse_cli_args
from gym.config.parser import check_keys
from gym.core.errors import ConfigError, DataError
from gym.core.files import refuse_file_in_path
from gym.personalization.store import VariantStore


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="gym variants", description="Per-user fine-tunes of one base model, "
                           "each stored as a 1-bit delta.")
    sub = parser.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("create", help="fine-tune a user's variant on their rows and store it", allow_abbrev=False,
                       usage="gym variants create STORE --user USER (--data FILE | --preferences FILE) [options] "
                             "[key=value ...]",
                       epilog="Training keys go anywhere, as `gym train` takes them: key=value or --key value "
                              "(max_steps=30 finetuning_type=full ...).")
    c.add_argument("store")
    c.add_argument("--user", required=True)
    c.add_argument("--data", help="SFT rows: a .json (list) or .jsonl file, or a dataset name")
    c.add_argument("--preferences", help="chosen/rejected pairs: a .json or .jsonl file (trained with dpo)")
    c.add_argument("--base", help="base model (default: the store's, else smollm2-135m)")
    c.add_argument("--distill-steps", type=int, default=50, help="BitDelta scale distillation on the user's rows")
    c.add_argument("--replace", action="store_true", help="replace the user's existing variant")
    c.add_argument("--dataset-dir", default="data", help="folder of dataset_info.json (for --safety-gate names)")
    add_gate_flags(c)
    c.set_defaults(own_flags=[flag for flag in option_strings(c) if flag[:2] == "--"])
    # Training keys (max_steps=30 finetuning_type=full ..., or --max_steps 30) are taken anywhere, as `gym train`
    # takes them: not an argparse positional, which would only take them before the first option.
    a = sub.add_parser("add", help="put an existing variant in the store: a delta file or a LoRA adapter folder")
    a.add_argument("store")
    a.add_argument("--user", required=True)
    a.add_argument("--delta", help="a Gym delta file (gym delta compress: BitDelta or DeltaQuant)")
    a.add_argument("--adapter", help="a LoRA adapter folder (adapter_config.json + adapter_model.safetensors)")
    a.add_argument("--replace", action="store_true", help="replace the user's existing variant")
    sub.add_parser("list", help="the store's variants").add_argument("store")
    d = sub.add_parser("delete", help="remove a user's variant")
    d.add_argument("store")
    d.add_argument("--user", required=True)
    h = sub.add_parser("chat", help="talk to a user's variant (one --prompt, or interactively)")
    h.add_argument("store")
    h.add_argument("--user", required=True)
    h.add_argument("--prompt")
    h.add_argument("--max-new-tokens", type=int, default=256)
    e = sub.add_parser("export", help="the user's variant as a full model folder (`gym delta apply`)")
    e.add_argument("store")
    e.add_argument("--user", required=True)
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--overwrite", action="store_true")
    return parser


def _rows(reference: str | None, kind: str = "supervised") -> Any:
    """A .json/.jsonl file's rows (so held-out rows can be kept apart), each checked now as training will read it,
    so an error names this file and its row, not the copy the trainer makes; anything else is a dataset name."""
    if reference is None:
        return None
    path = Path(reference)
    if path.suffix not in (".json", ".jsonl"):
        return reference
    if not path.is_file():
        raise DataError(f"{path}: no such file.")
    from gym.data.loader import load_examples
    from gym.data.readers import read_rows
    from gym.data.registry import get_dataset_attrs

    (attr,) = get_dataset_attrs(str(path), path.parent)
    load_examples(attr, kind, media=True)
    return [row for _, row in read_rows(path)]


def _keys(extra: list[str]) -> dict[str, Any]:
    """The training keys of `gym variants create`, in `gym train`'s spelling (key=value or --key value)."""
    for arg in extra:
        if Path(arg).suffix.lower() in CONFIG_SUFFIXES and "=" not in arg:
            raise ConfigError(f"Unexpected argument {arg!r}: give training keys as key=value (e.g. max_steps=30).")
    return parse_cli_args(extra)


def _base(store: VariantStore, given: str | None) -> str:
    mine = store.base()
    return given or (mine or {}).get("name") or "smollm2-135m"


def _existing_store(store: str) -> None:
    """A store to read must be a folder: a missing one listed nothing, and exit 0, as if it were empty."""
    root = Path(store).expanduser()
    if root.is_dir():
        return
    refuse_file_in_path(root, folder=True, action="read")  # the store, or a folder above it, is a file: named
    raise ConfigError(f"{store}: no such variant store (a folder made by `gym variants create` or `add`).")


def main(argv: list[str]) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.verb != "create":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.verb in ("list", "delete"):
        _existing_store(args.store)
    store = VariantStore(args.store)
    if args.verb == "list":
        for record in store.list():
            kept = "" if record.gain_kept is None else f", gain kept {record.gain_kept:.0%}"
            print(f"{record.user}\t{record.bytes / 1e6:.1f} MB\t{record.created}{kept}")
        return 0
    if args.verb == "add":
        record = store.add(args.user, delta=args.delta, adapter=args.adapter, replace=args.replace)
        print(f"Variant {record.user}: {record.method}, {record.bytes / 1e6:.1f} MB.")
        return 0
    if args.verb == "delete":
        store.delete(args.user)
        print(f"Deleted {args.user}'s variant from {store.root}.")
        return 0
    from gym.personalization.trainer import PersonalizedTrainer

    if args.verb == "create":
        from gym.delta.bitdelta import BitDeltaConfig

        keys = _keys(extra)
        for made_elsewhere in ("adapter", "delta"):
            if made_elsewhere in keys:
                article = "an" if made_elsewhere == "adapter" else "a"
                raise ConfigError(f"gym variants create trains a variant on --data or --preferences; to store "
                                  f"{article} {made_elsewhere} made elsewhere, use `gym variants add {args.store} "
                                  f"--user {args.user} --{made_elsewhere} ...` (not gated: docs/safety.md).")
        check_keys(keys, args.own_flags)  # a misspelt flag lands among the training keys: named here, not later
        ignored = sorted(key for key in keys if str(key).replace("-", "_").startswith("delta_"))
        if ignored:  # gym train's compression keys: a variant is always BitDelta, distilled --distill-steps steps
            raise ConfigError(f"{', '.join(ignored)}: gym variants create stores every variant as BitDelta; its "
                              "distillation is --distill-steps N (the delta_* keys are gym train's).")
        gate = gate_from(args, args.dataset_dir)
        config = BitDeltaConfig(distill_steps=args.distill_steps,
                                calibration="user-rows" if args.distill_steps else None)
        trainer = PersonalizedTrainer(_base(store, args.base), config, store=store.root)
        record = trainer.create_variant(args.user, data=_rows(args.data),
                                        preferences=_rows(args.preferences, "pairwise"),
                                        replace_existing=args.replace, safety_gate=gate, **keys)
        kept = "" if record.gain_kept is None else f"; gain kept on held-out rows: {record.gain_kept:.0%}"
        print(f"Variant {record.user}: {record.bytes / 1e6:.1f} MB in {record.seconds:.0f} s{kept}.")
        if record.safety_gate is not None:
            from gym.safety.gate import GateDecision

            print(GateDecision.from_dict(record.safety_gate).message())
        return 0
    if args.verb == "export":
        from gym.delta.apply import save_model_folder, write_applied
        from gym.delta.weights import load_model
        from gym.models.loader import resolve_model_path

        store.get(args.user)
        adapter = store.adapter_path(args.user)
        if adapter.is_dir():
            base = _base(store, None)
            out = save_model_folder(load_model(str(adapter), base), resolve_model_path(base), args.output,
                                    {"made_by": "gym variants export", "base_model": base, "adapter": str(adapter)},
                                    overwrite=args.overwrite)
        else:
            out = write_applied(_base(store, None), store.delta_path(args.user), args.output, overwrite=args.overwrite)
        print(f"Wrote {out}.")
        return 0
    trainer = PersonalizedTrainer(_base(store, None), store=store.root)
    if args.prompt is not None:
        print(trainer.serve_variant(args.user, args.prompt, max_new_tokens=args.max_new_tokens))
        return 0
    chat = trainer.serve_variant(args.user)
    try:
        history: list[dict[str, str]] = []
        while True:
            try:
                line = input("> ")
            except EOFError:
                return 0
            history.append({"role": "user", "content": line})
            answer = chat.chat(history, max_new_tokens=args.max_new_tokens)
            print(answer)
            history.append({"role": "assistant", "content": answer})
    finally:
        chat.close()
