"""The LLM task's tests' tiny random Llama: a local checkpoint folder (a random 2-layer Llama and a tokenizer, the real
SmolLM2 one when its converted checkpoint is cached, else a tiny byte-level BPE with a ChatML template trained here)
that the task loads like any other model, four hand-written examples as its training file, and the task and model
on them as fixtures (``checkpoint``, ``train_file``, ``task``, ``model``: imported by the modules that use them)."""

import json
from pathlib import Path

import pytest
import torch
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.model import smollm2_checkpoint_dir
from attent.tasks.llm.task import LLMTask
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EXAMPLES = [
    {"prompt": "What is 2 + 3?", "response": "2 + 3 = 5. The answer is: 5"},
    {
        "prompt": "Tom has 12 apples and eats 4 of them. Then he buys twice as many as he has left. "
        "How many apples does he have now?",
        "response": "He has 12 - 4 = 8 left, buys 16, so 24. The answer is: 24",
    },
    {"prompt": "Say hi.", "response": "Hi!"},
    {"prompt": "Count to five.", "response": "1, 2, 3, 4, 5 - and that is five numbers in order."},
]


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    )
    bpe.train_from_iterator([e["prompt"] + " " + e["response"] for e in EXAMPLES] * 5, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    cached = smollm2_checkpoint_dir()
    tokenizer = AutoTokenizer.from_pretrained(cached) if cached.is_dir() else tiny_tokenizer()
    torch.manual_seed(0)
    return save_tiny_llama(folder, tokenizer, max_position_embeddings=512)


def save_tiny_llama(folder: Path, tokenizer: PreTrainedTokenizerBase, **config) -> Path:
    """A random 2-layer Llama (32 wide, grouped-query attention) for this tokenizer, saved with it
    as a checkpoint folder: an LLM task without the hub. ``config``: LlamaConfig's other settings."""
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **config,
        )
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES))
    return path


def make_task(checkpoint: Path, train_file: Path, **overrides) -> LLMTask:
    config = LLMTaskConfig(model=str(checkpoint), dataset=str(train_file), lora_r=4, lora_dropout=0.0, **overrides)
    config.check_data()
    return LLMTask(config, seed=0)


@pytest.fixture(scope="module")
def task(checkpoint, train_file) -> LLMTask:
    return make_task(checkpoint, train_file)


@pytest.fixture()
def model(task) -> nn.Module:
    torch.manual_seed(0)
    model = task.build_model()
    # LoRA's B starts at zero; give the adapters weight so they change the outputs
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.02)
    return model.eval()
