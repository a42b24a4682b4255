"""What a hostile pass found in the variant store (issue #39), each as what a user sees: a variant is read whole
and checked against the store's base (finite, every shape) before it replaces anything; two first variants of
different bases added at once leave a store of one base; a create killed with SIGKILL frees its user; a reader
never misses a variant that is being replaced; a store path under a file is one error line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors import safe_open
from safetensors.torch import save_file
from tests.gym_cli import gym_process
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from gym.cli import main
from gym.core.errors import GymError
from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.format import read_header, save_delta
from gym.personalization.source import StoreSource
from gym.personalization.store import VariantStore


def _load(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_base(tokenizer, folder: Path, seed: int, hidden: int = 64) -> Path:
    """A 2-layer Llama like tiny_model_dir: another seed is another base of the same shapes; another width, a base
    whose adapters fit no other."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_delta(base_dir: Path, out: Path, seed: int = 1) -> Path:
    """A BitDelta file of a fine-tune of `base_dir` (every parameter moved), naming its base as `gym delta
    compress --base` does."""
    tuned = _load(base_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in tuned.named_parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    quantizer = BitDeltaQuantizer(BitDeltaConfig(distill_steps=0))
    return quantizer.compress(_load(base_dir), tuned, base_name=str(base_dir), progress=False).save(out)


def make_adapter(base_dir: Path, out: Path, seed: int = 5) -> Path:
    """A plain LoRA adapter of `base_dir` (its adapter_config.json names that base)."""
    torch.manual_seed(seed)
    lora = get_peft_model(_load(base_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    lora.save_pretrained(out)
    return out


def poisoned(delta: Path, out: Path) -> Path:
    """`delta` with one tensor's scales set to NaN and its header kept: a file whose header reads as valid."""
    with safe_open(str(delta), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open is no dict)
    scale = next(key for key in tensors if key.endswith("::scale"))
    tensors[scale] = torch.full_like(tensors[scale], float("nan"))
    save_file(tensors, str(out), metadata=metadata)
    return out


@pytest.fixture(scope="module")
def files(tiny_model_dir, tokenizer, tmp_path_factory):
    """Deltas and adapters of the tiny base, of another base of its shapes, and of a wider base."""
    folder = tmp_path_factory.mktemp("variant-files")
    other = make_base(tokenizer, folder / "other-base", seed=1)
    wide = make_base(tokenizer, folder / "wide-base", seed=2, hidden=96)
    good = make_delta(tiny_model_dir, folder / "good.safetensors", seed=1)
    return {"good": good, "good2": make_delta(tiny_model_dir, folder / "good2.safetensors", seed=2),
            "nan": poisoned(good, folder / "nan.safetensors"), "other": make_delta(other, folder / "other.safetensors"),
            "other_base": other, "adapter": make_adapter(tiny_model_dir, folder / "adapter"),
            "wide_adapter": make_adapter(wide, folder / "wide-adapter")}


def _add(store: Path, user: str, capsys, *args: str) -> tuple[int, str]:
    """`gym variants add` in this process: (exit status, stderr)."""
    capsys.readouterr()
    status = main(["variants", "add", str(store), "--user", user, *args])
    return status, capsys.readouterr().err


def _snapshot(store: Path, user: str) -> dict[str, bytes]:
    folder = store / user
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- 1. a variant is read whole and checked before it replaces anything ------------------------------------------------
def test_a_nan_delta_never_replaces_a_good_variant(files, tmp_path, capsys):
    store = tmp_path / "store"
    assert _add(store, "alice", capsys, "--delta", str(files["good"]))[0] == 0
    before = _snapshot(store, "alice")
    status, err = _add(store, "alice", capsys, "--delta", str(files["nan"]), "--replace")
    assert status == 2 and err.startswith("gym: error:") and "NaN" in err and err.count("\n") == 1
    assert _snapshot(store, "alice") == before  # alice keeps her good variant, byte for byte
    status, err = _add(store, "bob", capsys, "--delta", str(files["nan"]))
    assert status == 2 and "NaN" in err
    assert VariantStore(store).users() == ["alice"]


def test_a_delta_whose_shapes_do_not_fit_the_base_is_refused(files, tmp_path, capsys):
    """The header names the store's base (same fingerprint), but the tensors do not fit that base."""
    store = tmp_path / "store"
    assert _add(store, "alice", capsys, "--delta", str(files["good"]))[0] == 0
    base = read_header(files["good"])["base"]
    narrow = save_delta(tmp_path / "narrow.safetensors", {"model.norm.weight": torch.ones(32)},
                        {"method": "dense", "base": base})
    status, err = _add(store, "alice", capsys, "--delta", str(narrow), "--replace")
    assert status == 2 and "model.norm.weight" in err and "[32]" in err and "[64]" in err
    foreign = save_delta(tmp_path / "foreign.safetensors", {"model.layers.7.mlp.up_proj.weight": torch.ones(128, 64)},
                         {"method": "dense", "base": base})
    status, err = _add(store, "bob", capsys, "--delta", str(foreign))
    assert status == 2 and "model.layers.7.mlp.up_proj.weight" in err and "does not have" in err
    assert VariantStore(store).users() == ["alice"]


def test_a_user_id_equal_to_an_existing_one_ignoring_case_is_refused(files, tmp_path, capsys):
    # `Alice` beside `alice` made a second variant; on macOS the two share one folder, so it replaced alice's.
    store = tmp_path / "store"
    assert _add(store, "alice", capsys, "--delta", str(files["good"]))[0] == 0
    before = _snapshot(store, "alice")
    for args in (["--delta", str(files["good2"])], ["--delta", str(files["good2"]), "--replace"]):
        status, err = _add(store, "Alice", capsys, *args)
        assert status == 2 and err.count("\n") == 1, err
        assert "User 'Alice' differs from the existing user 'alice'" in err and "Use 'alice'" in err
    assert VariantStore(store).users() == ["alice"] and _snapshot(store, "alice") == before
    assert _add(store, "alice", capsys, "--delta", str(files["good2"]), "--replace")[0] == 0  # her own id still works


# -- 3. what add accepts, the server can load: adapters are checked against the base too ------------------------------
def test_an_adapter_of_a_wider_base_is_refused_at_add(files, tmp_path, capsys):
    store = tmp_path / "store"
    assert _add(store, "alice", capsys, "--delta", str(files["good"]))[0] == 0
    status, err = _add(store, "bob", capsys, "--adapter", str(files["wide_adapter"]))
    assert status == 2 and "q_proj" in err and "[96, 96]" in err and "[64, 64]" in err and err.count("\n") == 1
    assert VariantStore(store).users() == ["alice"]


def test_an_adapter_into_an_empty_store_gives_the_store_its_base(files, tmp_path, capsys):
    """Its adapter_config.json names the base: the store gets that base's fingerprint, so a delta of another base
    is refused afterwards, and one of this base is taken."""
    store = tmp_path / "store"
    assert _add(store, "dave", capsys, "--adapter", str(files["adapter"]))[0] == 0
    assert VariantStore(store).base()["fingerprint"] == read_header(files["good"])["base"]["fingerprint"]
    status, err = _add(store, "eve", capsys, "--delta", str(files["other"]))
    assert status == 2 and "fingerprints differ" in err
    assert _add(store, "alice", capsys, "--delta", str(files["good"]))[0] == 0
    status, err = _add(tmp_path / "wide-store", "bob", capsys, "--adapter", str(files["wide_adapter"]))
    assert status == 0, err  # alone, the wide adapter fits its own base
    status, err = _add(tmp_path / "wide-store", "carol", capsys, "--adapter", str(files["adapter"]))
    assert status == 2 and "[64, 64]" in err and "[96, 96]" in err


def test_an_adapter_with_nan_or_mismatched_ranks_is_refused(files, tmp_path, capsys):
    store = tmp_path / "store"
    weights = files["adapter"] / "adapter_model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    for name, change in (("nan", lambda key, t: t.fill_(float("nan")) if "lora_B" in key else t),
                         ("ranks", lambda key, t: t[:2] if "lora_A" in key else t)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_bytes((files["adapter"] / "adapter_config.json").read_bytes())
        save_file({key: change(key, t.clone()).contiguous() for key, t in tensors.items()},
                  str(folder / "adapter_model.safetensors"))
        status, err = _add(store, "dave", capsys, "--adapter", str(folder))
        assert status == 2 and err.startswith("gym: error:"), err
        assert ("NaN" in err) if name == "nan" else ("rank" in err)
    assert VariantStore(store).users() == []


# -- 2. two first variants of different bases at once: one base -----------------------------------------------------
_RACER = """
import sys, time
from pathlib import Path
import gym.personalization.store, transformers  # imported before the start line, so both start together
from gym.cli import main
folder, user, delta = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
for trial in range(int(sys.argv[4])):
    (folder / f"ready-{trial}-{user}").touch()
    while not (folder / f"go-{trial}").exists():
        time.sleep(0.001)
    status = main(["variants", "add", str(folder / f"store-{trial}"), "--user", user, "--delta", delta])
    (folder / f"status-{trial}-{user}").write_text(str(status))
"""


@pytest.mark.slow
def test_two_first_adds_of_different_bases_at_once_leave_a_store_of_one_base(files, tmp_path):
    trials = 10
    racers = {user: subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path), user, str(files[delta]),
                                      str(trials)], stderr=subprocess.PIPE, text=True)
              for user, delta in (("alice", "good"), ("mallory", "other"))}
    fingerprints = {user: read_header(files[delta])["base"]["fingerprint"]
                    for user, delta in (("alice", "good"), ("mallory", "other"))}
    try:
        for trial in range(trials):
            deadline = time.time() + 120
            while not all((tmp_path / f"ready-{trial}-{user}").exists() for user in racers):
                assert time.time() < deadline and all(r.poll() is None for r in racers.values()), "a racer died"
                time.sleep(0.005)
            (tmp_path / f"go-{trial}").touch()
        for racer in racers.values():
            racer.wait(timeout=300)
    finally:
        for racer in racers.values():
            racer.kill()
    errors = {user: racer.stderr.read() for user, racer in racers.items()}
    assert "Traceback" not in "".join(errors.values()), errors
    for trial in range(trials):
        statuses = {user: int((tmp_path / f"status-{trial}-{user}").read_text()) for user in racers}
        assert sorted(statuses.values()) == [0, 2], (trial, statuses)
        store = VariantStore(tmp_path / f"store-{trial}")
        winner = next(user for user, status in statuses.items() if status == 0)
        assert store.users() == [winner]
        assert store.base()["fingerprint"] == fingerprints[winner]
        assert store.get(winner).base["fingerprint"] == fingerprints[winner]
    assert all("fingerprints differ" in err for err in errors.values() if "gym: error" in err)
    assert sum(err.count("gym: error:") for err in errors.values()) == trials


# -- 5. a create killed with SIGKILL frees the user and leaves no temporary folder anywhere ---------------------------
@pytest.mark.slow
def test_a_create_killed_with_sigkill_frees_the_user(files, tiny_model_dir, tmp_path, capsys):
    store = tmp_path / "store"
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"instruction": f"Say {i}.", "output": f"{i}"} for i in range(4)]))
    create = subprocess.Popen([sys.executable, "-m", "gym.cli", "variants", "create", str(store), "--user", "alice",
                               "--data", str(rows), "--base", str(tiny_model_dir), "max_steps=500"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        # the lock is taken, the variant's folder begun, and the user's rows written in it (not in /tmp, where a
        # killed create would leave them for good)
        while not list(store.glob(".alice.tmp-*/work/rows.json")):
            assert create.poll() is None and time.time() < deadline, "the create ended before it was killed"
            time.sleep(0.01)
    finally:
        create.send_signal(signal.SIGKILL)
        create.wait(30)
    assert [p.name for p in store.iterdir() if p.name.startswith(".alice.")]  # what the killed create left
    status, err = _add(store, "alice", capsys, "--delta", str(files["good"]))
    assert status == 0, err  # not "is being created": the lock's process is dead
    assert VariantStore(store).users() == ["alice"]
    assert not [p.name for p in store.iterdir() if p.name.startswith(".alice.")]  # its lock and temp folder gone


def test_a_live_create_still_holds_its_user(files, tmp_path, capsys):
    store = VariantStore(tmp_path / "store")
    with pytest.raises(GymError, match="manifest"), store.creating("alice"):  # nothing built in it: not committed
        status, err = _add(store.root, "alice", capsys, "--delta", str(files["good"]))
        assert status == 2 and "is being created" in err and str(os.getpid()) in err
    assert _add(store.root, "alice", capsys, "--delta", str(files["good"]))[0] == 0


# -- 6. replacing is atomic for readers --------------------------------------------------------------------------------
_READER = """
import sys
from pathlib import Path
from gym.personalization.source import StoreSource
from gym.personalization.store import VariantStore
store, stop = VariantStore(sys.argv[1]), Path(sys.argv[2])
source = StoreSource(store)
Path(sys.argv[2] + ".ready").touch()
lookups = misses = 0
while not stop.exists():
    for _ in range(50):  # what the server asks on every request naming tiny:alice
        lookups += 1
        misses += source.version("alice") is None or not store.exists("alice")
print(lookups, misses)
"""


@pytest.mark.slow
def test_replacing_a_variant_never_hides_it_from_readers(files, tmp_path):
    """A reader process looks alice up in a loop while she is replaced 100 times (before versions, about one lookup
    in a thousand found no variant: the server would have answered 404 to a live user)."""
    store = VariantStore(tmp_path / "store")
    store.add("alice", delta=files["good"])
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(store.root), str(stop)], stdout=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.time() + 120
        while not Path(f"{stop}.ready").exists():
            assert reader.poll() is None and time.time() < deadline, "the reader did not start"
            time.sleep(0.01)
        source, versions = StoreSource(store), set()
        for i in range(100):
            store.add("alice", delta=files["good2" if i % 2 else "good"], replace=True)
            versions.add(source.version("alice"))
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    lookups, misses = map(int, out.split())
    assert lookups > 1000 and misses == 0, f"{misses} of {lookups} lookups found no variant"
    assert len(versions) == 100  # every replace is a new version, which the server reloads
    assert store.get("alice").training["added_from"] == str(files["good2"])
    # At most the version before the current one stays on disk (for a reader that followed the link as it switched).
    assert len(list((store.root / ".versions" / "alice").iterdir())) == 2
    store.delete("alice")
    assert store.users() == [] and not (store.root / ".versions" / "alice").exists()


# -- 9. a store path whose parent is a file ---------------------------------------------------------------------------
def test_a_store_under_a_file_is_one_error_line(files, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = gym_process("variants", "add", blocker / "store", "--user", "alice", "--delta", files["good"],
                         timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gym: error:") and result.stderr.count("\n") == 1, result.stderr
    assert str(blocker) in result.stderr and "is a file" in result.stderr
    assert blocker.read_text() == "not a folder"



def test_a_store_written_before_versions_is_read_replaced_and_deleted(files, tmp_path):
    """Stores made before versions hold each variant in a plain folder, and a store.json without shapes."""
    root = tmp_path / "store"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / "delta.safetensors").write_bytes(files["good"].read_bytes())
    (root / "alice" / "manifest.json").write_text(json.dumps({
        "user": "alice", "base": read_header(files["good"])["base"], "method": "bitdelta", "bytes": 1,
        "created": "2025-01-01T00:00:00Z", "seconds": 0.0}))
    (root / "store.json").write_text(json.dumps({"base": read_header(files["good"])["base"]}))
    store = VariantStore(root)
    assert store.users() == ["alice"] and StoreSource(store).version("alice") is not None
    assert store.base_shapes()["model.norm.weight"] == [64]  # read from the base's config
    store.add("alice", delta=files["good2"], replace=True)
    assert (root / "alice").is_symlink() and store.get("alice").training["added_from"] == str(files["good2"])
    store.delete("alice")
    assert store.users() == [] and not (root / "alice").exists() and not (root / ".versions" / "alice").exists()
