"""`gym delta compress --eval-task T --min-kept X`: the compressed delta's score beside the fine-tune's, as a gate."""

from __future__ import annotations

import torch

from gym.cli import main
from gym.eval.after_training import kept


def _shift(name, param):
    if "mlp" in name:
        torch.manual_seed(len(name))
        param.add_(torch.randn_like(param) * 0.05)


def test_gate_reports_all_three_and_fails_below_min_kept(make_finetune, tiny_model_dir, data_dir, tmp_path, capsys):
    tuned = make_finetune(_shift)
    common = ["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(tuned), "--distill-steps", "0",
              "--dataset-dir", str(data_dir)]
    task = ["--eval-task", "ppl:tiny_alpaca"]
    assert main(common + task + ["-o", str(tmp_path / "d.safetensors")]) == 0
    table = capsys.readouterr().out
    assert "ppl:tiny_alpaca" in table and "fine-tune" in table and "compressed" in table and "gain kept" in table
    status = main(common + task + ["-o", str(tmp_path / "e.safetensors"), "--min-kept", "2"])  # twice the score
    err = capsys.readouterr().err
    assert status == 2 and "Quality gate failed (--min-kept 200%)" in err and "ppl:tiny_alpaca keeps" in err
    assert (tmp_path / "e.safetensors").is_file()  # the delta itself is kept, and the message says where
    assert main(common + ["--min-kept", "0.9", "-o", str(tmp_path / "f.safetensors")]) == 2
    assert "--min-kept needs --eval-task" in capsys.readouterr().err


def test_kept_share_for_scores_and_losses():
    assert kept(0.25, 0.80, 0.76, "acc") == (0.95, (0.76 - 0.25) / (0.80 - 0.25))
    share, gain = kept(3.0, 2.0, 2.5, "loss")
    assert share == 0.8 and gain == 0.5
    assert kept(0.1, 0.0, 0.0, "acc")[0] == 1.0  # nothing to keep is all kept
