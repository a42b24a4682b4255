"""A damaged safetensors file is a ModelError naming it, however it is damaged; a whole one reads as safetensors
reads it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from gym.core.errors import ModelError
from gym.core.safetensors_files import first_damaged, load_safetensors, open_safetensors, weight_files


@pytest.fixture()
def whole(tmp_path):
    path = tmp_path / "whole.safetensors"
    save_file({"a": torch.arange(1000, dtype=torch.float32).reshape(10, 100), "b": torch.ones(3)}, str(path))
    return path


DAMAGE = {
    "cut in the data": lambda data: data[:1000],
    "cut in the header": lambda data: data[:50],
    "cut in the length": lambda data: data[:5],
    "empty": lambda data: b"",
    "not safetensors": lambda data: b"hello, this is text and not a weights file" * 4,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_reader_names_a_damaged_file(damage, whole, tmp_path):
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(DAMAGE[damage](whole.read_bytes()))
    for read in (load_safetensors, lambda p: open_safetensors(p).__enter__()):
        with pytest.raises(ModelError, match=rf"^{path} is damaged or incomplete \(.+\).*Re-download or re-export"):
            read(path)
    error = first_damaged([whole, path])
    assert isinstance(error, ModelError) and str(error).startswith(f"{path} is damaged")


def test_a_whole_file_reads(whole, tmp_path):
    assert torch.equal(load_safetensors(whole)["b"], torch.ones(3))
    with open_safetensors(whole) as handle:
        assert sorted(handle.keys()) == ["a", "b"]
        assert handle.get_tensor("a")[9, 99] == 999
    assert first_damaged([whole, tmp_path / "gone.safetensors"]) is None  # a missing file is not a damaged one
    assert weight_files(tmp_path) == [whole] and weight_files(whole) == []
