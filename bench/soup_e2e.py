"""DeltaSoup end to end on the embedded model: 5 honest LoRA fine-tunes, 2 attackers, mean vs robust.

1. Five users LoRA-fine-tune SmolLM2-135M-Instruct with Gym (sft, r=8, all linear layers) on five
   disjoint slices of alpaca_en_demo. Rows never trained on are split into a validation set and a
   held-out evaluation set.
2. Two attackers join: a sign flip (-flip x user 0's delta: "undo what they learned, boosted") and
   Gaussian noise with noise x the median honest norm.
3. The same seven contributions go into soups that differ only in method: mean, multi_krum (f left to
   the default, floor((7 - 3) / 2) = 2) and byzantine_robust (Gym's default); and into a mean soup with
   the validation gate on (validation_dataset set, quality_threshold 0.05): the attackers are then
   turned away at the door.
4. Table: held-out eval loss of the base, of each honest user's own fine-tune, of the honest-only mean
   (what a soup without attackers would give), and of every soup's aggregate; plus what the robust soup
   paid each contributor.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/soup_e2e.py [--steps 12] [--rows 48] [--eval-rows 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
BASE = "smollm2-135m"


def split_data(work: Path, users: int, rows: int, eval_rows: int, validation_rows: int) -> str:
    """dataset_dir with user0..userN-1 (disjoint training slices), validation and heldout (never trained on)."""
    data = json.loads((REPO / "data" / "alpaca_en_demo.json").read_text())
    needed = users * rows + validation_rows + eval_rows
    if needed > len(data):
        raise SystemExit(f"{needed} rows needed, alpaca_en_demo has {len(data)}: lower --rows or --eval-rows.")
    generator = torch.Generator().manual_seed(0)
    data = [data[i] for i in torch.randperm(len(data), generator=generator).tolist()]
    info = {}
    for name, part in [*[(f"user{u}", data[u * rows:(u + 1) * rows]) for u in range(users)],
                       ("validation", data[users * rows:users * rows + validation_rows]),
                       ("heldout", data[len(data) - eval_rows:])]:
        (work / f"{name}.json").write_text(json.dumps(part))
        info[name] = {"file_name": f"{name}.json"}
    (work / "dataset_info.json").write_text(json.dumps(info))
    return str(work)


def fine_tune(user: int, args: argparse.Namespace, work: Path, dataset_dir: str) -> Path:
    from gym.workflows.training import run_exp

    out = work / f"lora-user{user}"
    run_exp({"model_name_or_path": BASE, "stage": "sft", "finetuning_type": "lora", "lora_rank": 8,
             "lora_target": "all", "dataset": f"user{user}", "dataset_dir": dataset_dir,
             "cutoff_len": args.cutoff, "per_device_train_batch_size": 4, "max_steps": args.steps,
             "learning_rate": args.lr, "seed": user, "save_strategy": "no", "report_to": "none",
             "output_dir": str(out), "disable_tqdm": True, "logging_steps": 1000})
    return out


def loss_with(model, rows, delta: dict[str, torch.Tensor] | None) -> float:
    """Eval loss of base + delta (the base model is changed in place and restored)."""
    from gym.delta.evaluate import eval_loss

    if not delta:
        return eval_loss(model, rows)
    params = dict(model.named_parameters())
    saved = {n: params[n].detach().clone() for n in delta}
    with torch.no_grad():
        for n, v in delta.items():
            params[n].add_(v)
    try:
        return eval_loss(model, rows)
    finally:
        with torch.no_grad():
            for n, v in saved.items():
                params[n].copy_(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--rows", type=int, default=48, help="training rows per user")
    parser.add_argument("--steps", type=int, default=12, help="LoRA steps per user (batch 4)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cutoff", type=int, default=256)
    parser.add_argument("--eval-rows", type=int, default=48)
    parser.add_argument("--validation-rows", type=int, default=24)
    parser.add_argument("--flip", type=float, default=4.0, help="sign-flip attacker: -flip x user 0's delta")
    parser.add_argument("--noise", type=float, default=4.0, help="noise attacker: norm = noise x median honest norm")
    parser.add_argument("--work", help="keep everything here (default: a temporary folder)")
    args = parser.parse_args()

    from gym.delta.evaluate import eval_rows
    from gym.delta.weights import load_model
    from gym.models.loader import load_tokenizer, resolve_model_path
    from gym.soup import DeltaSoup, DeltaSoupConfig
    from gym.soup.contributions import Base, l2_norm, to_delta

    started = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="soup-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    dataset_dir = split_data(work, args.users, args.rows, args.eval_rows, args.validation_rows)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    adapters = [fine_tune(u, args, work, dataset_dir) for u in range(args.users)]
    timings["fine-tune"] = time.perf_counter() - t

    # The honest deltas in memory, for the attackers, the honest-only reference and the soups other than
    # byzantine_robust's (which gets the LoRA folders themselves: the merge costs seconds per contribution).
    t = time.perf_counter()
    honest = [to_delta(str(a), Base(BASE)).delta for a in adapters]
    norms = [l2_norm(d) for d in honest]
    generator = torch.Generator().manual_seed(1)
    raw = {n: torch.randn(v.shape, generator=generator) for n, v in honest[0].items()}
    scale = args.noise * statistics.median(norms) / l2_norm(raw)
    attackers = {"sign-flip": {n: -args.flip * v for n, v in honest[0].items()},
                 "noise": {n: v * scale for n, v in raw.items()}}
    honest_mean = {n: sum(d[n] for d in honest) / len(honest) for n in honest[0]}

    soups = {"mean": DeltaSoupConfig(method="mean"), "multi_krum": DeltaSoupConfig(method="multi_krum"),
             "byzantine_robust": DeltaSoupConfig(),
             "mean + validation gate": DeltaSoupConfig(method="mean", validation_dataset="validation",
                                                       validation_dataset_dir=dataset_dir,
                                                       validation_max_samples=args.validation_rows,
                                                       validation_cutoff_len=args.cutoff)}
    aggregates, statuses, soup_objects = {}, {}, {}
    for label, config in soups.items():
        soup = DeltaSoup(config, path=work / f"soup-{label.replace(' ', '').replace('+', '-')}", base_model=BASE)
        for u, adapter in enumerate(adapters):
            contribution = str(adapter) if label == "byzantine_robust" else honest[u]
            soup.contribute(f"user{u}", contribution, num_samples=args.rows)
        for name, delta in attackers.items():
            soup.contribute(name, delta)
        statuses[label] = {r.user_id: r.status for r in soup.contributions()}
        output = work / "model-robust" if label == "byzantine_robust" else None
        aggregates[label] = soup.aggregate(min_contributors=3, output_dir=output)
        statuses[label].update({r.user_id: r.status for r in soup.contributions()})
        soup_objects[label] = soup
    timings["soups"] = time.perf_counter() - t

    t = time.perf_counter()
    tokenizer = load_tokenizer(resolve_model_path(BASE))
    rows = eval_rows(tokenizer, "heldout", dataset_dir, args.cutoff, args.eval_rows)
    model = load_model(BASE)
    results = [("base", loss_with(model, rows, None))]
    results += [(f"user{u} alone", loss_with(model, rows, d)) for u, d in enumerate(honest)]
    results.append(("honest-only mean (no attackers)", loss_with(model, rows, honest_mean)))
    for label, delta in aggregates.items():
        results.append((f"soup: {label}", loss_with(model, rows, delta)))
    from gym.delta.evaluate import eval_loss

    written = eval_loss(load_model(str(work / "model-robust")), rows)  # the folder aggregate() wrote
    timings["eval"] = time.perf_counter() - t

    base_loss = results[0][1]
    print(f"\nDeltaSoup end to end: {args.users} LoRA users x {args.steps} steps on {args.rows} rows each "
          f"(SmolLM2-135M-Instruct, r=8, lr {args.lr}); attackers: sign-flip x{args.flip} of user0, Gaussian "
          f"noise x{args.noise} the median honest norm ({statistics.median(norms):.3f}); "
          f"held-out eval: {len(rows)} alpaca rows")
    print(f"\n{'model':<36} {'eval loss':>10} {'vs base':>9}")
    for label, loss in results:
        print(f"{label:<36} {loss:>10.4f} {loss - base_loss:>+9.4f}")
    print(f"(the byzantine_robust model folder written by aggregate(output_dir=...): {written:.4f})")
    print("\ncontribution status per soup (after aggregation):")
    users = [*[f"user{u}" for u in range(args.users)], *attackers]
    print(f"{'soup':<24} " + " ".join(f"{u:>10}" for u in users))
    for label, status in statuses.items():
        print(f"{label:<24} " + " ".join(f"{status.get(u, '-'):>10}" for u in users))
    robust = soup_objects["byzantine_robust"]
    paid = robust.calculate_rewards()
    weights = dict(zip([r.user_id for r in robust.contributions()], robust.store.rounds()[-1].weights))
    print("\nbyzantine_robust round: weight in the aggregate and reward (pool 1000)")
    for u in users:
        print(f"  {u:<10} weight {weights.get(u, 0.0):.3f}  reward {paid.get(u, 0.0):8.2f}")
    print("\ntimes: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) +
          f"; total {time.perf_counter() - started:.0f} s; work folder {work}")


if __name__ == "__main__":
    main()
