"""Build small decoders from configs, and load models and tokenizers from local paths.

Nothing here downloads: a model id that is not a local folder fails with a message saying what
to provide.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from configs.supervised import ModelConfig

_ARCHITECTURES: dict[str, type[PretrainedConfig]] = {"qwen2": Qwen2Config, "llama": LlamaConfig}


class ModelNotFoundError(FileNotFoundError):
    """A model or tokenizer path that does not hold one; nothing is fetched from a hub."""


class DeviceError(RuntimeError):
    """A profile's `device` that this machine does not have."""


# Where this process's own models train and sample (the profile's `device`, set once by the
# flow: tasks/pipeline.py): the single engine's training, the hf sampler, GRPO in one process.
# DeepSpeed's workers take their rank's GPU themselves.
_DEVICE = {"name": "cpu"}


def use_device(name: str) -> None:
    """Put this process's models on `name` ("cpu" or "cuda") from now on."""
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "the profile says device: cuda, but torch sees no CUDA device here "
            f"(torch {torch.__version__}{hidden_devices()}); run it on a GPU machine or set "
            "device: cpu"
        )
    if name not in ("cpu", "cuda"):
        raise DeviceError(f"device {name!r}: expected cpu or cuda")
    _DEVICE["name"] = name


def hidden_devices() -> str:
    """`, CUDA_VISIBLE_DEVICES=...` where the environment sets it: a shell that hides the GPUs
    (an empty value, or ids this machine does not have) makes a GPU machine look like one
    without, and the variable is the thing to change."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if visible is None else f", CUDA_VISIBLE_DEVICES={visible!r} in the environment"


def model_device() -> torch.device:
    return torch.device(_DEVICE["name"])


def decoder_config(
    spec: ModelConfig, vocab_size: int, pad_token_id: int, **extra: object
) -> PretrainedConfig:
    """A Qwen2 or Llama transformers config from our model spec (`extra`: e.g. num_labels)."""
    return _ARCHITECTURES[spec.architecture](
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        **extra,
    )


def build_model(
    spec: ModelConfig, vocab_size: int, pad_token_id: int, eos_token_id: int, seed: int = 0
) -> PreTrainedModel:
    """A freshly initialised Qwen2- or Llama-architecture decoder."""
    config = decoder_config(
        spec, vocab_size, pad_token_id, eos_token_id=eos_token_id, tie_word_embeddings=True
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def cut_layers(
    base: PreTrainedModel,
    spec: ModelConfig,
    layers: list[int],
    pad_token_id: int,
    eos_token_id: int,
) -> tuple[PreTrainedModel, list[str]]:
    """A model of `spec` that starts from `layers` of `base` (in that order), its embeddings and
    final norm: a smaller student that keeps part of what the base learnt (depth pruning).

    `spec` must have the base's widths and one layer per entry of `layers`. Weights the student's
    architecture has no place for (a Qwen2 base's attention biases in a Llama student) are left
    out and returned by name; a weight the student needs and the base lacks is an error.
    """
    source = base.config
    widths = {
        "hidden_size": (spec.hidden_size, source.hidden_size),
        "num_heads": (spec.num_heads, source.num_attention_heads),
        "num_kv_heads": (spec.num_kv_heads, source.num_key_value_heads),
        "intermediate_size": (spec.intermediate_size, source.intermediate_size),
    }
    wrong = [
        f"{key} {mine} (base {theirs})" for key, (mine, theirs) in widths.items() if mine != theirs
    ]
    if wrong:
        raise ValueError(f"a student cut from the base needs the base's widths: {', '.join(wrong)}")
    if len(layers) != spec.num_layers:
        raise ValueError(f"{len(layers)} layers named for a student of {spec.num_layers}")
    bad = [i for i in layers if not 0 <= i < source.num_hidden_layers]
    if bad or len(set(layers)) != len(layers):
        raise ValueError(
            f"layers {layers}: each once, of the base's 0..{source.num_hidden_layers - 1}"
        )
    student = build_model(spec, source.vocab_size, pad_token_id, eos_token_id)
    wanted = set(student.state_dict())
    state: dict[str, torch.Tensor] = {}
    left_out: list[str] = []
    for key, value in base.state_dict().items():
        target = key
        if key.startswith("model.layers."):
            index = int(key.split(".")[2])
            if index not in layers:
                continue
            target = key.replace(
                f"model.layers.{index}.", f"model.layers.{layers.index(index)}.", 1
            )
        if target in wanted:
            state[target] = value
        else:
            left_out.append(key)
    missing = sorted(wanted - set(state) - {"lm_head.weight"})  # the head is tied to embeddings
    if missing:
        raise ValueError(f"the base has no weights for the student's {missing}")
    student.load_state_dict(state, strict=False)
    return student, left_out


def _require_local(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not (path / "config.json").exists() and what == "model":
        raise ModelNotFoundError(
            f"{path}: no {what} here (no config.json). This pipeline runs offline: give a local "
            "folder saved with save_pretrained, or download the checkpoint on a connected machine "
            "first."
        )
    if not path.is_dir():
        raise ModelNotFoundError(f"{path}: no {what} folder here")
    return path


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(_require_local(path, "model"), dtype=dtype)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(_require_local(path, "tokenizer"))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
