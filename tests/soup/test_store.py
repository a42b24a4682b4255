"""The soup folder: ledger and blobs survive reopening, and two processes contributing at once corrupt nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gym.core.errors import ConfigError
from gym.soup.store import ACCEPTED, REJECTED, SUPERSEDED, Store


def test_a_folder_that_is_not_a_soup_is_refused_with_the_way_to_make_one(tmp_path):
    with pytest.raises(ConfigError, match="gym soup init"):
        Store(tmp_path)


@pytest.mark.parametrize(("ledger", "reason"), [
    (b"my notes", "file is not a database"),
    (None, "no such table: meta"),  # an SQLite file of another program
])
def test_a_ledger_that_is_no_soups_is_one_line_for_every_command(tmp_path, capsys, ledger, reason):
    from gym.cli import main

    soup = tmp_path / "soup"
    soup.mkdir()
    if ledger is None:
        sqlite3.connect(soup / "soup.sqlite").execute("CREATE TABLE notes (text)")
    else:
        (soup / "soup.sqlite").write_bytes(ledger)
    for command in (["status", str(soup)], ["rewards", str(soup)], ["aggregate", str(soup)],
                    ["contribute", str(soup), str(tmp_path), "--user", "a"]):
        assert main(["soup", *command]) == 2
        err = capsys.readouterr().err
        assert err.count("gym: error:") == 1 and "Traceback" not in err
        assert f"{soup / 'soup.sqlite'} cannot be read as a soup ledger ({reason})" in err
    if ledger is not None:
        assert (soup / "soup.sqlite").read_bytes() == ledger


def test_create_records_meta_once_and_uses_wal(tmp_path):
    store = Store.create(tmp_path / "s", {"base_model": "a"})
    again = Store.create(tmp_path / "s", {"base_model": "b"})  # opening an existing soup leaves it as it was
    assert again.meta("base_model") == "a" and store.meta("schema_version") == "1"
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_blobs_are_content_addressed_and_leave_no_temporary_files(tmp_path):
    store = Store.create(tmp_path / "s", {})
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    first = store.write_tensors(tensors, {"what": "test"})
    second = store.write_tensors(tensors, {"what": "test"})
    assert first == second and first.endswith(".safetensors")
    assert torch.equal(store.read_tensors(first)["w"], tensors["w"])
    assert [p.name for p in (tmp_path / "s" / "blobs").iterdir()] == [first]


def test_a_full_round_rejects_with_the_reason_and_a_user_supersedes_their_own_contribution(tmp_path):
    store = Store.create(tmp_path / "s", {})
    a1 = store.add_contribution("a", ACCEPTED, None, 1.0, None, "x", {}, max_per_round=2)
    store.add_contribution("a", ACCEPTED, None, 1.0, None, "y", {}, max_per_round=2)  # replaces a1, not a new seat
    store.add_contribution("b", ACCEPTED, None, 1.0, None, "z", {}, max_per_round=2)
    full = store.add_contribution("c", ACCEPTED, None, 1.0, None, "w", {}, max_per_round=2)
    assert full.status == REJECTED and "full" in full.reason and "max_contributors=2" in full.reason
    assert full.blob is None
    statuses = {r.id: r.status for r in store.contributions()}
    assert statuses[a1.id] == SUPERSEDED
    assert sorted(r.user_id for r in store.contributions(status=ACCEPTED)) == ["a", "b"]


# Each worker says it is ready and waits for the other, so that their ten contributions really interleave
# (starting Python and importing Gym takes seconds, contributing ten times a fraction of one).
WORKER = textwrap.dedent("""
    import sys, time, torch
    from pathlib import Path
    from gym.soup import DeltaSoup
    soup = DeltaSoup(path=sys.argv[1])
    name = "model.layers.0.mlp.up_proj.weight"
    shape = soup.base.params[name].shape
    (Path(sys.argv[1]) / f"ready{sys.argv[2]}").touch()
    while len(list(Path(sys.argv[1]).glob("ready*"))) < 2:
        time.sleep(0.01)
    for i in range(10):
        delta = {name: torch.full(shape, float(int(sys.argv[2]) * 100 + i + 1) * 1e-4)}
        record = soup.contribute(f"user{sys.argv[2]}-{i}", delta)
        assert record.accepted, record.reason
""")


def test_two_processes_contributing_at_once_lose_and_corrupt_nothing(make_soup, tmp_path):
    soup = make_soup(max_contributors=100)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(soup.path), str(k)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for k in (1, 2)]
    outputs = [w.communicate(timeout=120)[0].decode() for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    records = soup.store.contributions()
    assert len(records) == 20 and all(r.status == ACCEPTED for r in records)
    values = set()
    for record in records:
        (tensor,) = soup.store.read_tensors(record.blob).values()
        values.add(round(float(tensor[0, 0]) * 1e4))
    assert values == {k * 100 + i + 1 for k in (1, 2) for i in range(10)}  # every blob whole and distinct
    assert soup.store.integrity_ok()
    with sqlite3.connect(soup.path / "soup.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert not [p for p in (Path(soup.path) / "blobs").iterdir() if p.name.startswith(".tmp")]
    assert json.loads(soup.store.meta("config"))["max_contributors"] == 100


def test_closing_a_round_moves_late_arrivals_on_and_refuses_a_second_close(tmp_path):
    from gym.soup.store import RoundRecord

    store = Store.create(tmp_path / "s", {})
    seen = store.add_contribution("a", ACCEPTED, None, 1.0, None, "x", {}, max_per_round=9)
    late = store.add_contribution("b", ACCEPTED, None, 1.0, None, "y", {}, max_per_round=9)  # while aggregating
    record = RoundRecord(1, "mean", 1, [seen.id], [seen.id], [1.0], None, "agg", {}, 0.0)
    store.close_round(record, last_seen=seen.id, excluded={}, rewards=[("a", seen.id, 1.0, 1.0, 10.0)],
                      reputation={"a": 0.55})
    rounds = {r.user_id: r.round for r in store.contributions()}
    assert rounds == {"a": 1, "b": 2} and store.open_round() == 2
    assert store.rewards(1)[0]["amount"] == 10.0 and store.reputation() == {"a": 0.55}
    with pytest.raises(ConfigError, match="closed by another process"):
        store.close_round(record, last_seen=late.id, excluded={}, rewards=[], reputation={})
