"""A rehearsal's language model: the file's architecture (its config: attention, norms, activation,
rotary embedding, tied or untied head) at the stand-in size with random weights, and the model's own
tokenizer, saved as a checkpoint folder the workers load as they would the real one."""

from __future__ import annotations

import re
from pathlib import Path

from attent.tasks.config import STAND_IN
from attent.tasks.llm.model import load_tokenizer, model_config, save_checkpoint
from attent.tasks.llm.probe import with_blocks


def standin_checkpoint(model: str, folder: Path) -> Path:
    """The stand-in of ``model`` under ``folder`` (made once; a second call finds it).

    Args:
        model: a hub name, a checkpoint folder or ``smollm2-135m-instruct``, as ``task.model``.
        folder: where stand-ins are kept, readable by every node.

    Returns:
        The checkpoint folder: config, random weights at the stand-in size, the model's tokenizer.

    Raises:
        OSError: the model's tokenizer or config cannot be had here (a gated model without
            ``HF_TOKEN``, a hub name not in ``HF_HOME`` with the hub offline), naming the fix.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    target = folder / re.sub(r"[^A-Za-z0-9_.-]+", "--", model.strip("/"))
    if (target / "config.json").is_file():
        return target
    try:
        tokenizer = load_tokenizer(model)
        try:
            shape = model_config(model)
        except FileNotFoundError:  # not cached and not in the plan's table: the hub's config.json
            shape = AutoConfig.from_pretrained(model)
    except OSError as exc:
        raise OSError(
            f"model {model!r} cannot be read here ({str(exc).splitlines()[0][:160]}). Fix: cache it where the "
            "workers look (HF_HOME on the shared storage, `hf download` once), and for a gated model accept "
            "its licence on the hub and set HF_TOKEN"
        ) from None
    save_checkpoint(AutoModelForCausalLM.from_config(shrunk(shape, vocab=len(tokenizer))), tokenizer, target)
    return target


def shrunk(config, *, vocab: int):
    """``config`` with ``STAND_IN``'s width, depth and heads, its kind of attention kept (grouped
    query attention stays grouped, explicit head dimensions stay explicit) and ``vocab`` tokens.

    Args:
        config: a transformers ``PretrainedConfig`` of a decoder-only model.
        vocab: the tokenizer's size, which the embedding must cover.

    Returns:
        A copy, ready for ``AutoModelForCausalLM.from_config``.
    """
    shape = with_blocks(config, STAND_IN.depth)
    heads = STAND_IN.heads
    grouped = getattr(config, "num_key_value_heads", None) not in (None, config.num_attention_heads)
    shape.hidden_size = STAND_IN.width
    shape.intermediate_size = 2 * STAND_IN.width
    shape.num_attention_heads = heads
    if hasattr(shape, "num_key_value_heads"):
        shape.num_key_value_heads = 1 if grouped else heads
    if getattr(shape, "head_dim", None):
        shape.head_dim = STAND_IN.width // heads
    shape.vocab_size = vocab
    return shape
