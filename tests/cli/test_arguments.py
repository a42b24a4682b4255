"""The sub-command verbs' arguments (gym.cli.arguments and its users): every refusal is one line and exit 2, naming
the misspelt flag, the file in the way or the clash."""

from __future__ import annotations

import pytest

from gym.cli import main


@pytest.mark.parametrize("argv, message", [
    (["keys", "create", "{tmp}/ks", "--usr", "alice"], "gym keys create: unrecognized argument --usr. Did you mean "
                                                       "--user?"),
    (["soup", "init", "{tmp}/s", "--bse", "smollm2-135m"], "gym soup init: unrecognized argument --bse. Did you mean "
                                                           "--base?"),
    (["soup", "contribute", "{tmp}/s", "x", "--usr", "alice"], "unrecognized argument --usr. Did you mean --user?"),
    (["soup", "rewards", "{tmp}/s", "--round", "1", "--cumulative"], "argument --cumulative: not allowed with "
                                                                     "argument --round"),
    (["keys", "create", "{tmp}/ks", "--user", "alice", "--bogus"], "unrecognized arguments: --bogus. (`"),
])
def test_a_misspelt_flag_is_named_even_where_a_required_one_is_then_missing(argv, message, tmp_path, capsys):
    # argparse said "one of --user --admin is required" first; the misspelling is what the user has to fix.
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_store_under_a_file_is_named_by_keys_and_variants(tmp_path, capsys):
    blocker = tmp_path / "alice.jsonl"
    blocker.write_text("{}\n")
    under = f"{blocker / 'store'}: its parent {blocker} is a file, not a folder. Choose another path."
    assert main(["keys", "create", str(blocker / "store"), "--user", "x"]) == 2
    assert f"Cannot write {under}" in capsys.readouterr().err
    assert main(["variants", "list", str(blocker / "store")]) == 2
    assert f"Cannot read {under}" in capsys.readouterr().err  # listing writes nothing
    for argv in (["keys", "create", str(blocker), "--admin"], ["variants", "list", str(blocker)]):
        assert main(argv) == 2  # the store itself a file
        err = capsys.readouterr().err
        assert f"{blocker} is a file, not a folder; choose another path." in err and err.count("\n") == 1
    assert blocker.read_text() == "{}\n"
    assert main(["variants", "list", str(tmp_path / "nosuch")]) == 2  # it listed nothing, exit 0
    assert "no such variant store" in capsys.readouterr().err


def test_a_soup_config_that_is_no_text_is_one_line(tmp_path, capsys):
    config = tmp_path / "soup.sqlite"
    config.write_bytes(b"SQLite format 3\x00\xf8\xff")
    assert main(["soup", "init", str(tmp_path / "s"), "--base", "smollm2-135m", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"Soup config: {config} is not a text file" in err and err.count("\n") == 1


@pytest.mark.parametrize("flag, content, message", [
    ("--data", '{"instruction": "a", "output": "b"}\n' * 3 + '{"instruction": "x", "output": \n',
     "rows.jsonl, line 4: not valid JSON (column 32)"),
    ("--preferences", '{"instruction": "hi", "chosen": "a"}\n',
     "rows.jsonl, line 1: field 'rejected' is missing (the row's keys: 'instruction', 'chosen')"),
])
def test_variants_create_names_the_users_file_and_row_before_training(flag, content, message, tmp_path, capsys):
    # It named line 1 of a bad JSONL, and a bad preference row in the trainer's temporary copy.
    rows = tmp_path / "rows.jsonl"
    rows.write_text(content)
    assert main(["variants", "create", str(tmp_path / "store"), "--user", "zz", flag, str(rows)]) == 2
    err = capsys.readouterr().err
    assert message in err and ".tmp-" not in err and err.count("\n") == 1
