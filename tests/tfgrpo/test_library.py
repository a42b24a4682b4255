"""The experience library: operations applied under the documented rules, rendering, files."""

from __future__ import annotations

import json
import random

import pytest

from gym.core.errors import DataError
from gym.tfgrpo.library import EXPERIENCE_HEADER, ExperienceLibrary, Operation, with_experiences


def lib(*texts: str) -> ExperienceLibrary:
    return ExperienceLibrary(list(texts), step=3)


def test_each_operation_and_renumbering():
    new = lib("a one", "b two", "c three").apply([
        Operation("DELETE", 1), Operation("UPDATE", 2, "c better"), Operation("ADD", None, "d four"),
        Operation("NONE", 0)])
    assert new.experiences == ["a one", "c better", "d four"]
    assert new.step == 4
    assert new.render() == "[0]. a one\n[1]. c better\n[2]. d four"


def test_delete_beats_update_in_either_order():
    for ops in ([Operation("UPDATE", 0, "x new"), Operation("DELETE", 0)],
                [Operation("DELETE", 0), Operation("UPDATE", 0, "x new")]):
        assert lib("x old", "y").apply(ops).experiences == ["y"]


def test_last_update_of_an_id_wins_and_unknown_update_is_an_add():
    new = lib("x").apply([Operation("UPDATE", 0, "first"), Operation("UPDATE", 0, "second"),
                          Operation("UPDATE", 7, "brand new")])
    assert new.experiences == ["second", "brand new"]


def test_duplicate_adds_merge_with_each_other_and_with_the_library():
    new = lib("Check the units.").apply([Operation("ADD", None, "check the units"),
                                         Operation("ADD", None, "Draw a diagram."),
                                         Operation("ADD", None, "draw a   diagram")])
    assert new.experiences == ["Check the units.", "Draw a diagram."]


def test_delete_of_unknown_id_and_empty_content_change_nothing():
    new = lib("x").apply([Operation("DELETE", 5), Operation("ADD", None, None), Operation("UPDATE", 0, None)])
    assert new.experiences == ["x"]


def test_experiences_are_cut_to_max_words():
    new = lib().apply([Operation("ADD", None, " ".join(f"w{i}" for i in range(50)))], max_words=32)
    assert len(new[0].split()) == 32 and new[0].startswith("w0 w1")


def test_size_after_a_step_follows_the_formula():
    """size after = before + distinct ADDs + UPDATEs of unknown ids - DELETEs of existing ids (random plans)."""
    rng = random.Random(0)
    for trial in range(200):
        before = lib(*[f"lesson {trial} {i}" for i in range(rng.randrange(0, 6))])
        ops = []
        for j in range(rng.randrange(0, 8)):
            kind = rng.choice(["ADD", "UPDATE", "DELETE", "NONE"])
            ops.append(Operation(kind, None if kind == "ADD" else rng.randrange(0, 8),
                                 None if kind in ("DELETE", "NONE") else f"new {trial} {j}"))
        deleted = {o.id for o in ops if o.op == "DELETE" and o.id is not None and o.id < len(before)}
        adds = sum(o.op == "ADD" for o in ops)
        unknown_updates = sum(o.op == "UPDATE" and o.id is not None and o.id >= len(before) for o in ops)
        assert len(before.apply(ops)) == len(before) + adds + unknown_updates - len(deleted)


@pytest.mark.parametrize(("raw", "expected"), [
    ({"operation": "add", "id": None, "content": "x"}, Operation("ADD", None, "x")),
    ({"operation": "UPDATE", "id": "G3", "content": "y"}, Operation("UPDATE", 3, "y")),
    ({"operation": "DELETE", "id": "[2]"}, Operation("DELETE", 2)),
    ({"option": "modify", "modified_from": "G1", "experience": "z"}, Operation("UPDATE", 1, "z")),  # authors' keys
    ({"content": "no operation given"}, Operation("ADD", None, "no operation given")),
])
def test_operation_parsing(raw, expected):
    assert Operation.parse(raw) == expected


def test_malformed_operations_raise():
    for raw in (["ADD"], {"operation": "REPLACE"}, {"operation": "DELETE", "id": "first"}):
        with pytest.raises(ValueError):
            Operation.parse(raw)


def test_files_round_trip_atomically(tmp_path):
    library = lib("a", "b")
    path = library.save(tmp_path / "out" / "experiences.json")
    assert json.loads(path.read_text()) == {"step": 3, "experiences": {"0": "a", "1": "b"}}
    assert ExperienceLibrary.load(path) == library
    assert [p.name for p in path.parent.iterdir()] == ["experiences.json"]  # no temporary left behind
    assert ExperienceLibrary.from_json({"G1": "second", "G0": "first"}).experiences == ["first", "second"]
    assert ExperienceLibrary.from_json(["x", " ", "y"]).experiences == ["x", "y"]


def test_bad_library_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="bad.json: not valid JSON"):
        ExperienceLibrary.load(bad)
    with pytest.raises(DataError, match="missing.json: no such experience library"):
        ExperienceLibrary.load(tmp_path / "missing.json")
    bad.write_text(json.dumps({"experiences": {"one": "x"}}))
    with pytest.raises(DataError, match="ids must be numbers"):
        ExperienceLibrary.load(bad)


def test_an_empty_library_leaves_the_system_prompt_exactly_as_it_was():
    assert with_experiences(None, ExperienceLibrary()) is None
    assert with_experiences("Be brief.", ExperienceLibrary()) == "Be brief."
    assert with_experiences("Be brief.", None) == "Be brief."
    shown = with_experiences("Be brief.", lib("Check units."))
    assert shown == f"Be brief.\n\n{EXPERIENCE_HEADER}\n[0]. Check units."
    assert with_experiences(None, lib("Check units.")) == f"{EXPERIENCE_HEADER}\n[0]. Check units."
