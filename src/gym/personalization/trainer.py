"""`PersonalizedTrainer`: one base model, a fine-tune per user, each stored as a 1-bit BitDelta delta.

    from gym.personalization import PersonalizedTrainer, BitDeltaConfig
    trainer = PersonalizedTrainer("smollm2-135m", BitDeltaConfig(distill_steps=50), store="variants/")
    record = trainer.create_variant("alice", data=[{"instruction": "...", "output": "..."}, ...])
    print(trainer.serve_variant("alice", "Who are you?"))

create_variant fine-tunes with Gym's own training run (LoRA by default: fast, small in memory; any
training key can be overridden), extracts the delta from the base, compresses it with BitDelta
(its scales distilled on the user's own rows) and stores it (gym.personalization.store). With 10 or
more SFT rows, a fifth of them (at most 20) is held out and the record says how much of the
fine-tune's loss gain on them the 1-bit delta keeps.

A job runner (gym.service.jobs) passes `work_dir` (the training run is kept there, so a killed process resumes
from its last checkpoint), its own held-out rows, and may choose DeltaQuant instead of BitDelta.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from gym.config.parser import check_keys
from gym.core.errors import ConfigError, GymError
from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.delta.safety import gate_delta
from gym.delta.weights import load_model, require_text_model
from gym.personalization.store import (
    DELTA_FILE,
    VariantRecord,
    VariantStore,
    check_user_id,
    now,
    write_manifest,
)
from gym.safety.gate import SafetyGate

logger = logging.getLogger(__name__)

SCRATCH_DIR = "work"  # the rows and the training run, inside the variant's temporary folder
HELD_OUT_MIN_ROWS = 10  # below this every row trains, and no gain is measured
TRAINING_DEFAULTS: dict[str, Any] = {
    "finetuning_type": "lora", "lora_target": "all", "lora_rank": 16, "learning_rate": 5e-4,
    "num_train_epochs": 3, "per_device_train_batch_size": 4, "cutoff_len": 512, "seed": 42,
    "lr_scheduler_type": "cosine", "disable_tqdm": True,
}


def default_store(base_model: str) -> Path:
    from gym.core.home import gym_home

    return gym_home() / "variants" / check_user_id(Path(base_model).name or "base")


def _formatting(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    if "messages" in first:
        return "openai"
    if "conversations" in first:
        return "sharegpt"
    return "alpaca"


def _write_dataset(folder: Path, name: str, rows: list[dict[str, Any]], *, ranking: bool = False) -> None:
    """Rows as a dataset of a dataset_info.json in `folder`, so the training run reads them like any other."""
    if not rows or not all(isinstance(row, dict) for row in rows):
        raise ConfigError(f"{name}: give a non-empty list of row objects (alpaca-style dicts or conversations).")
    (folder / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False))
    info_path = folder / "dataset_info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    entry: dict[str, Any] = {"file_name": f"{name}.json", "formatting": _formatting(rows)}
    if ranking:
        entry["ranking"] = True
        if entry["formatting"] == "alpaca":  # {instruction or prompt, input?, chosen, rejected}: TRL's and ours
            prompt = "instruction" if "instruction" in rows[0] else "prompt"
            entry["columns"] = {"prompt": prompt, "query": "input", "chosen": "chosen", "rejected": "rejected"}
        else:  # a conversation with its answers as message objects under chosen / rejected
            entry["columns"] = {"chosen": "chosen", "rejected": "rejected"}
    info[name] = entry
    info_path.write_text(json.dumps(info, indent=2))


def _calibration_rows(preferences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Preference pairs as SFT rows of their chosen answers: what BitDelta distils its scales on."""
    rows: list[dict[str, Any]] = []
    for pair in preferences:
        if "messages" in pair:  # OpenAI-shaped: the conversation, then the chosen answer as its last turn
            chosen = pair.get("chosen")
            chosen = chosen[-1] if isinstance(chosen, list) and chosen else chosen
            if isinstance(chosen, dict) and chosen.get("content"):
                rows.append({"messages": [*pair["messages"], {"role": "assistant", "content": chosen["content"]}]})
            continue
        if "conversations" in pair:
            continue
        rows.append({"instruction": pair.get("instruction", pair.get("prompt", "")), "input": pair.get("input", ""),
                     "output": pair.get("chosen", "")})
    return [row for row in rows if "messages" in row or row["output"]]


@contextmanager
def _work_folder(work_dir: str | Path | None, variant_folder: Path) -> Iterator[Path]:
    """`work_dir` kept as it is (a run there can be resumed), or a folder inside the variant's temporary folder,
    removed before the variant is committed. A create killed midway (SIGKILL, OOM) thus leaves its rows and training
    run where the store's next writer removes them with the dead process's folder, not in the system's temporary
    directory for good."""
    if work_dir is not None:
        path = Path(work_dir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    scratch = variant_folder / SCRATCH_DIR
    scratch.mkdir()
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# The keys create_variant sets itself; given as training keys they were silently replaced.
OWNED_KEYS = {
    "model_name_or_path": "the base model is PersonalizedTrainer's first argument",
    "stage": "sft for data=, dpo for preferences=",
    "dataset": "the rows are create_variant's data= or preferences=",
    "dataset_dir": "the rows are create_variant's data= or preferences=",
    "output_dir": "the training run goes to create_variant's work_dir=",
    "overwrite_output_dir": "each variant's run starts again unless resumed",
}


def _refuse_owned_keys(keys: dict[str, Any]) -> None:
    for key in sorted(keys.keys() & OWNED_KEYS.keys()):
        raise ConfigError(f"Training key {key} is set for each variant ({OWNED_KEYS[key]}); remove it.")


class CreationStopped(GymError):
    """`should_stop` said yes between two of create_variant's steps: nothing was stored."""


class PersonalizedTrainer:
    """Per-user variants of one base model. `config`: BitDelta's options (its `calibration` defaults to the
    user's own rows), or DeltaQuant's for a variant of 2 to 8 bits a weight; `store`: the variant folder (default
    `$GYM_HOME/variants/<base>`); `training`: keys every variant's training run gets (create_variant's overrides
    come on top)."""

    def __init__(self, base_model: str = "smollm2-135m", config: BitDeltaConfig | DeltaQuantConfig | None = None,
                 store: str | Path | None = None, **training: Any) -> None:
        check_keys(training)  # a misspelt key named now, with the closest one, not when a variant is first created
        _refuse_owned_keys(training)
        self.base_model = base_model
        self.config: BitDeltaConfig | DeltaQuantConfig = config or BitDeltaConfig(distill_steps=50,
                                                                                 calibration="user-rows")
        self.store = VariantStore(store if store is not None else default_store(base_model))
        self.training = training

    # -- creating ------------------------------------------------------------------------------------
    def create_variant(self, user_id: str, data: Any = None, preferences: Any = None, *, replace_existing: bool = False,
                       work_dir: str | Path | None = None, held_out: list[dict[str, Any]] | None = None,
                       safety_gate: SafetyGate | None = None, should_stop: Callable[[], bool] | None = None,
                       **overrides: Any) -> VariantRecord:
        """Fine-tune, compress and store `user_id`'s variant. `data`: SFT rows (a list of alpaca-style dicts
        or conversations, a dataset name, or a file); `preferences`: chosen/rejected pairs (trained with
        dpo). `overrides`: any training key (max_steps=30, finetuning_type="full", ...). `work_dir`: where the
        training run goes and stays (its checkpoints; resume it with resume_from_checkpoint=True), instead of the
        variant's temporary folder; `held_out`: SFT rows to measure the gain kept on, instead of a fifth of `data`'s.
        `safety_gate`: the compressed variant and the base answer the gate's safety set; a variant whose harmful
        compliance rose past the gate is refused (SafetyGateRefused, with the numbers) and nothing is stored; a
        variant that passes keeps the decision in its manifest (`safety_gate`). `should_stop`: asked after
        training, after compressing, after the gate and last before the variant is stored; yes raises CreationStopped
        and stores nothing (a cancelled fine-tuning job: training is minutes of it, distillation and the gate more)."""
        check_user_id(user_id)
        check_keys(overrides)  # before the store makes a folder for the variant
        _refuse_owned_keys(overrides)

        def stop_here(step: str) -> None:
            if should_stop is not None and should_stop():
                raise CreationStopped(f"stopped {step}; nothing was stored")

        require_text_model(self.base_model)  # a vision-language base failed only after its training, at compression
        if safety_gate is not None:
            safety_gate.check()  # the set and the judge, before minutes of training
        if (data is None) == (preferences is None):
            raise ConfigError("create_variant needs exactly one of data= (SFT rows) or preferences= (chosen/rejected "
                              "pairs).")
        started = time.perf_counter()
        with self.store.creating(user_id, replace=replace_existing) as folder, _work_folder(work_dir, folder) as work:
            dataset, dataset_dir, held, calibration = self._datasets(work, data, preferences, held_out)
            keys = {**TRAINING_DEFAULTS, **self.training, **overrides}
            keys.update(model_name_or_path=self.base_model, stage="dpo" if preferences is not None else "sft",
                        dataset=dataset, dataset_dir=dataset_dir, output_dir=str(work / "run"),
                        overwrite_output_dir=True)
            keys.setdefault("report_to", "none")
            run_dir = self._train(keys)
            stop_here("after training")
            base, tuned, tokenizer, base_path = self._models(run_dir)
            quantizer, method = self._quantizer(calibration)
            result = quantizer.compress(base, tuned, tokenizer=tokenizer, base_name=self.base_model, progress=False)
            stop_here("after compressing")
            safety = None
            if safety_gate is not None:  # the variant as it will be served (compressed) against its base
                decision = gate_delta(safety_gate, self.base_model, result.entries, result.header,
                                      source=f"{user_id}'s variant", template=keys.get("template"))
                decision.raise_if_refused()  # nothing is stored: the store removes the temporary folder
                safety = decision.to_dict()
                stop_here("after the safety gate")
            delta_path = result.save(folder / DELTA_FILE)
            gain, losses = (None, {}) if held is None else self._gain(base_path, tuned, delta_path, held, tokenizer,
                                                                      keys)
            stop_here("before storing the variant")
            record = VariantRecord(
                user=user_id, base=dict(result.header.get("base", {})), method=method,
                bytes=delta_path.stat().st_size, created=now(), seconds=round(time.perf_counter() - started, 1),
                training={k: v for k, v in keys.items() if k not in ("dataset", "dataset_dir", "output_dir")},
                gain_kept=gain, losses=losses, safety_gate=safety)
            write_manifest(folder, record)
        logger.info("Variant %s: %d bytes in %.0f s.", user_id, record.bytes, record.seconds)
        return record

    def _quantizer(self, calibration: tuple[str, str] | None) -> tuple[BitDeltaQuantizer | DeltaQuantizer, str]:
        """(the quantizer of self.config, the method the record names). BitDelta distils on the user's rows."""
        config = self.config
        if isinstance(config, DeltaQuantConfig):
            return DeltaQuantizer(config), f"deltaquant-{getattr(config.method, 'value', config.method)}"
        if config.distill_steps and config.calibration in (None, "user-rows"):
            if calibration is None:
                raise ConfigError("BitDelta's scale distillation needs SFT-style rows: give config.calibration "
                                  "(a dataset name or file) or distill_steps=0.")
            config = replace(config, calibration=calibration[0], calibration_dir=calibration[1])
        return BitDeltaQuantizer(config), "bitdelta"

    def _datasets(self, work: Path, data: Any, preferences: Any, given_held_out: list[dict[str, Any]] | None = None,
                  ) -> tuple[str, str, tuple[str, str] | None, tuple[str, str] | None]:
        """(dataset, dataset_dir, held-out (dataset, dir) or None, calibration (dataset, dir) or None)."""
        if preferences is not None:
            if not isinstance(preferences, list):
                return str(preferences), "data", None, None
            _write_dataset(work, "preferences", preferences, ranking=True)
            calibration = _calibration_rows(preferences)
            if calibration:
                _write_dataset(work, "calibration", calibration)
            return "preferences", str(work), None, ("calibration", str(work)) if calibration else None
        if not isinstance(data, list):
            return str(data), "data", None, (str(data), "data")  # a dataset name or file: used as it is
        rows = list(data)
        held: list[dict[str, Any]] = list(given_held_out or [])
        if not held and len(rows) >= HELD_OUT_MIN_ROWS:
            random.Random(0).shuffle(rows)
            count = min(20, max(2, len(rows) // 5))
            held, rows = rows[:count], rows[count:]
        _write_dataset(work, "rows", rows)
        if held:
            _write_dataset(work, "held_out", held)
        return "rows", str(work), ("held_out", str(work)) if held else None, ("rows", str(work))

    @staticmethod
    def _train(keys: dict[str, Any]) -> Path:
        from gym.config.parser import get_train_args
        from gym.train.run import run_training

        run_training(get_train_args(keys))
        return Path(keys["output_dir"])

    def _models(self, run_dir: Path) -> tuple[Any, Any, Any, str]:
        from gym.models.loader import load_tokenizer, resolve_model_path

        base_path = resolve_model_path(self.base_model)
        return load_model(base_path), load_model(str(run_dir), base_path), load_tokenizer(base_path), base_path

    @staticmethod
    def _gain(base_path: str, tuned: Any, delta_path: Path, held_out: tuple[str, str], tokenizer: Any,
              keys: dict[str, Any]) -> tuple[float, dict[str, float]]:
        """How much of the fine-tune's loss gain on the held-out rows the stored delta keeps."""
        from gym.delta.apply import apply_delta
        from gym.delta.evaluate import GainKept, eval_loss, eval_rows
        from gym.delta.format import load_delta

        rows = eval_rows(tokenizer, held_out[0], held_out[1], int(keys.get("cutoff_len", 512)), None)
        entries, header = load_delta(delta_path)
        base_loss = eval_loss(load_model(base_path), rows)
        rebuilt = apply_delta(load_model(base_path), entries, header, delta_path)
        gain = GainKept(base_loss, eval_loss(tuned, rows), eval_loss(rebuilt, rows))
        losses = {"base": round(gain.base_loss, 4), "finetuned": round(gain.finetuned_loss, 4),
                  "variant": round(gain.reconstructed_loss, 4)}
        return round(gain.kept, 4), losses

    # -- the store -----------------------------------------------------------------------------------
    def list_variants(self) -> list[VariantRecord]:
        return self.store.list()

    def get_variant(self, user_id: str) -> VariantRecord:
        return self.store.get(user_id)

    def delete_variant(self, user_id: str) -> None:
        self.store.delete(user_id)

    # -- serving -------------------------------------------------------------------------------------
    def serve_variant(self, user_id: str, prompt: str | None = None, **generation: Any) -> Any:
        """A ChatModel answering as `user_id`'s variant (the base with the delta applied); with `prompt`,
        that variant's answer to it."""
        from gym.personalization.serving import variant_chat_model

        chat = variant_chat_model(self.store, self.base_model, user_id)
        if prompt is None:
            return chat
        try:
            return chat.chat([{"role": "user", "content": prompt}], **generation)
        finally:
            chat.close()
