"""Who owns an output_dir's entries, and how a run's final files are installed into it so that a crash never
corrupts a finished result.

Final files are written into a temporary folder inside output_dir and then renamed into place one by one (the
folder also holds the run's checkpoints, so it cannot be swapped whole). A journal, `.gym-final.json`, names what is
being installed first; the previous manifest goes before the first rename and the new one comes last, so a kill in
between leaves a run that is not finished (resume saves again) and whose files are known as Gym's, never a folder
marked finished with files missing. Entries no run wrote are the user's: never written over or removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError, OutputError
from gym.core.files import MANIFEST_FILE, manifest_files, refuse_output_over_input, temp_path
from gym.core.names import split_names
from gym.train.checkpoints import CHECKPOINT_NAME, last_checkpoint

FINAL_JOURNAL = ".gym-final.json"  # the final files being installed, and the previous run's to remove


def is_finished_output(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file()


def check_output_dir(args: TrainArgs[Any], resuming: bool) -> None:
    out = Path(args.output_dir)
    if out.exists() and not out.is_dir():
        raise OutputError(f"output_dir {out} is a file; a training output is a folder. Choose another output_dir.")
    overwrite = args.finetuning.overwrite_output_dir
    # Training into the model it starts from would replace the weights it is reading (overwrite_output_dir deleted
    # them), and the starting point would be gone.
    refuse_output_over_input(out, [args.model.model_name_or_path, *split_names(args.model.adapter_name_or_path)],
                             how="overwrite_output_dir")
    if is_finished_output(out) and not resuming and not overwrite:
        raise ConfigError(f"{out} already holds a finished model. Set overwrite_output_dir: true to replace it, "
                          "or choose another output_dir.")
    strangers = _not_a_run(out)
    if strangers:  # overwrite_output_dir or not: the user's own files are never written over
        more = f" and {len(strangers) - 1} more" if len(strangers) > 1 else ""
        raise OutputError(f"output_dir {out} holds {strangers[0]}{more}, which no Gym run wrote, and training would "
                          "write over what shares a name (README.md, config files). Choose another output_dir, or "
                          "move those files away.")
    cut_short = None if resuming or overwrite or is_finished_output(out) else last_checkpoint(out)
    if cut_short is not None:
        # A fresh run would save its checkpoints among the old run's, and a later resume would take whichever
        # has the highest step: perhaps the old run's.
        raise ConfigError(f"output_dir {out} holds {cut_short.name} of a run cut short. Set resume_from_checkpoint: "
                          "true to continue it, overwrite_output_dir: true to start again (its checkpoints are "
                          "removed), or choose another output_dir.")


def start_over(output_dir: str | Path) -> list[str]:
    """overwrite_output_dir, not resuming: remove what would mix the earlier run into this one (its checkpoints,
    which a later resume would take, and PiSSA's starting adapter); a finished run's model stays until the new one
    replaces it, but the folder no longer reads as finished. The names removed. Call it only while owning the
    folder (gym.core.files.OutputLock)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    removed = []
    for entry in sorted(out.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and (
                CHECKPOINT_NAME.match(entry.name) or entry.name in ("pissa_init", "pissa_residual")):
            shutil.rmtree(entry)
            removed.append(entry.name)
    if is_finished_output(out):
        listed = _manifest_files(out)
        if listed is None:  # written before manifests listed their files: known as Gym's, never removed
            _write_journal(out, replaced=[], known=_not_a_run_entries(out))
        else:
            _write_journal(out, replaced=listed, known=[])
        (out / MANIFEST_FILE).unlink()
        removed.append(MANIFEST_FILE)
    return removed


# What a run that has not finished leaves in its output_dir (a finished one has its manifest): checkpoints, the
# log and its plot, TensorBoard's events, PiSSA's starting adapter, the folder's lock and temporary files.
_RUN_ENTRIES = re.compile(r"checkpoint-\d+|trainer_log\.jsonl|training_loss\.png|runs|pissa_init|pissa_residual|\..*")


def _not_a_run(out: Path) -> list[str]:
    """The entries of an existing output_dir no Gym run writes there; none for a finished run's folder (its
    manifest says Gym wrote it) or a run's folder cut short (final files the journal names included)."""
    if not out.is_dir() or (out / MANIFEST_FILE).is_file():
        return []
    journal = _read_journal(out)
    known = {*journal.get("replaced", []), *journal.get("known", [])}
    return [name for name in _not_a_run_entries(out) if name not in known]


def _not_a_run_entries(out: Path) -> list[str]:
    return sorted(entry.name for entry in out.iterdir() if not _RUN_ENTRIES.fullmatch(entry.name))


def _manifest_files(out: Path) -> list[str] | None:
    """The top-level names a finished run's manifest lists as its own, or None (no manifest, or no list)."""
    listed = manifest_files(out)
    if listed is None:
        return None
    return sorted({Path(name).parts[0] for name in listed if name} - {MANIFEST_FILE})


def _read_journal(out: Path) -> dict[str, list[str]]:
    try:
        journal = json.loads((out / FINAL_JOURNAL).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(journal, dict):
        return {}
    return {key: [n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")]
            for key, names in journal.items() if isinstance(names, list)}


def _write_journal(out: Path, replaced: list[str], known: list[str]) -> None:
    """`replaced`: final files of a run (this one, half-installed, or the one it overwrites), removed once the new
    model is in place unless it has them too; `known`: a finished run's files from before manifests listed them,
    recognised as Gym's but never removed (the user may have put one there)."""
    tmp = temp_path(out / FINAL_JOURNAL)
    tmp.write_text(json.dumps({"replaced": sorted(replaced), "known": sorted(known)}), encoding="utf-8")
    os.replace(tmp, out / FINAL_JOURNAL)


def install_final(tmp: Path, out: Path) -> None:
    """Rename the final files from `tmp` into `out`, the manifest last; remove what an earlier run's model had that
    this one does not (a full model's weights under a LoRA run's adapter)."""
    journal = _read_journal(out)
    previous = set(journal.get("replaced", [])) | set(_manifest_files(out) or [])
    names = sorted(item.name for item in tmp.iterdir() if item.name != MANIFEST_FILE)
    _write_journal(out, replaced=sorted(previous | set(names)), known=journal.get("known", []))
    (out / MANIFEST_FILE).unlink(missing_ok=True)  # from here until the new one lands, the run is not finished
    for name in names:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif os.path.lexists(target) and (tmp / name).is_dir():
            target.unlink()  # a file where the new result has a folder: a rename cannot replace it
        os.replace(tmp / name, target)
    for name in sorted(previous - set(names)):
        stale = out / name
        if _RUN_ENTRIES.fullmatch(name):
            continue  # never a checkpoint or the log, whatever a journal says
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    os.replace(tmp / MANIFEST_FILE, out / MANIFEST_FILE)
    (out / FINAL_JOURNAL).unlink()
