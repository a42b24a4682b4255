"""The tokenizer class AutoTokenizer picked, remembered per folder (gym.models.tokenizer_class): a later load gives the
same tokenizer without AutoTokenizer, and any change to the folder's small files sends it back to AutoTokenizer."""

from __future__ import annotations

import shutil

import pytest
import transformers

from gym.models import tokenizer_class
from gym.models.loader import load_tokenizer

TEXT = "Hello <|im_start|>user\n wörld  \t 123 <|im_end|> ünïcode 🙂"


@pytest.fixture
def folder(tmp_path, monkeypatch, embedded_dir):
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    copy = tmp_path / "model"
    copy.mkdir()
    for file in embedded_dir.iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy2(file, copy / file.name)
    return copy


def _refuse_auto(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("AutoTokenizer was asked")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def test_a_second_load_gives_the_same_tokenizer_without_autotokenizer(folder, monkeypatch):
    first = load_tokenizer(str(folder))
    assert tokenizer_class.remembered(folder) is type(first)
    _refuse_auto(monkeypatch)
    again = load_tokenizer(str(folder))
    assert type(again) is type(first) and again.init_kwargs == first.init_kwargs
    assert again.encode(TEXT) == first.encode(TEXT) and again.decode(first.encode(TEXT)) == first.decode(
        first.encode(TEXT))
    assert (again.eos_token_id, again.pad_token_id, again.all_special_ids, again.chat_template) == (
        first.eos_token_id, first.pad_token_id, first.all_special_ids, first.chat_template)


def test_a_changed_file_in_the_folder_sends_it_back_to_autotokenizer(folder, monkeypatch):
    load_tokenizer(str(folder))
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")  # one byte more: a new size
    assert tokenizer_class.remembered(folder) is None
    _refuse_auto(monkeypatch)
    with pytest.raises(AssertionError, match="AutoTokenizer was asked"):
        load_tokenizer(str(folder))


def test_turned_off_it_neither_remembers_nor_reads(folder, monkeypatch):
    monkeypatch.setenv("GYM_TOKENIZER_MEMO", "0")
    load_tokenizer(str(folder))
    assert not (tokenizer_class.gym_home() / "tokenizers").exists()


def test_a_class_from_outside_transformers_is_never_remembered(folder):
    class Custom:  # what a model's own code (auto_map) would bring
        __module__ = "custom_tokenizer_module"

    tokenizer_class.remember(folder, Custom())
    assert tokenizer_class.remembered(folder) is None



def test_a_remembered_class_that_fails_falls_back_to_autotokenizer(folder, monkeypatch):
    first = load_tokenizer(str(folder))

    class Broken:
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            raise TypeError("not this folder's class")

    monkeypatch.setattr(tokenizer_class, "remembered", lambda path: Broken)
    again = load_tokenizer(str(folder))
    assert type(again) is type(first) and again.encode(TEXT) == first.encode(TEXT)


def test_a_converted_gguf_folder_is_remembered_at_conversion(tiny_model_dir, tmp_path, monkeypatch):
    """Converting a GGUF loads its tokenizer through AutoTokenizer anyway; the folder it writes is remembered
    then, so the first start after the conversion already skips AutoTokenizer."""
    from gym.cli import main
    from gym.models.loader import resolve_model_path

    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    assert main(["export", "--model_name_or_path", str(tiny_model_dir), "--export_dir", str(tmp_path / "out"),
                 "--format", "gguf", "--quantization", "f32"]) == 0
    [gguf_path] = (tmp_path / "out").glob("*.gguf")
    converted = resolve_model_path(str(gguf_path))
    assert tokenizer_class.remembered(converted) is not None
    _refuse_auto(monkeypatch)
    tokenizer = load_tokenizer(converted)
    assert tokenizer.encode(TEXT) == transformers.PreTrainedTokenizerFast.from_pretrained(tiny_model_dir).encode(TEXT)
