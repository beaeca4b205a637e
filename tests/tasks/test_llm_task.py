"""LLMTask on a tiny random Llama: label masking, per-sample scores, LoRA, evaluation plumbing (its
response-loss metrics: test_llm_response_loss.py).

The tiny Llama, its tokenizer and its data are tests/helpers/llm_tiny.py's (its fixtures).
"""

# ruff: noqa: F811 -- the tests' arguments name the fixtures imported from tests.helpers.llm_tiny

import json

import pytest
import torch
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.evaluation.generation import generate_greedy
from attent.tasks.llm.task import LLMTask
from attent.tasks.task import OptimizerSpec
from peft.tuners.lora import LoraLayer
from torch import nn

from tests.helpers.llm_tiny import (  # noqa: F401  (fixtures)
    EXAMPLES,
    checkpoint,
    make_task,
    model,
    save_tiny_llama,
    task,
    tiny_tokenizer,
    train_file,
)
from tests.helpers.paths import DATASETS


def test_prompt_and_padding_tokens_are_masked_response_tokens_are_labelled(task):
    dataset = task.train_dataset()
    items = [dataset[i] for i in range(len(dataset))]
    for item, example in zip(items, EXAMPLES, strict=True):
        n_prompt = len(task.encode_prompt([example["prompt"]]))
        assert item["labels"][:n_prompt] == [-100] * n_prompt
        assert item["labels"][n_prompt:] == item["input_ids"][n_prompt:]
        response = task.tokenizer.decode(item["input_ids"][n_prompt:])
        assert response == example["response"] + "<|im_end|>\n"  # reply + end-of-turn marker
    batch = task.collate(items)
    assert batch["index"].tolist() == [0, 1, 2, 3]
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        assert batch["input_ids"][row, :n].tolist() == item["input_ids"]
        assert batch["labels"][row, :n].tolist() == item["labels"]
        assert (batch["labels"][row, n:] == -100).all()
        assert (batch["input_ids"][row, n:] == task.tokenizer.pad_token_id).all()
        width = batch["labels"].shape[1]
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)


def test_alpaca_prompts_end_with_the_response_header_and_replies_with_eos(checkpoint, train_file):
    task = make_task(checkpoint, train_file, prompt_style="alpaca")
    item = task.train_dataset()[0]
    n_prompt = item["labels"].count(-100)
    prompt = task.tokenizer.decode(item["input_ids"][:n_prompt])
    assert prompt.endswith("### Instruction:\nWhat is 2 + 3?\n\n### Response:\n")
    assert item["input_ids"][-1] == task.tokenizer.eos_token_id


def test_instruction_template_applies_to_training_and_evaluation_prompts(checkpoint, train_file):
    task = make_task(checkpoint, train_file, instruction_template="{prompt}\nThink step by step.")
    item = task.train_dataset()[0]
    n_prompt = item["labels"].count(-100)
    assert item["input_ids"][:n_prompt] == task.encode_prompt(["What is 2 + 3?"])
    prompt = task.tokenizer.decode(item["input_ids"][:n_prompt])
    assert "What is 2 + 3?\nThink step by step." in prompt


def test_single_sample_score_equals_the_hf_model_loss(task, model):
    for index in range(len(EXAMPLES)):
        batch = task.collate([task.train_dataset()[index]])
        score = task.per_sample_loss(model, batch)
        hf_loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        assert score.shape == (1,) and score.dtype == torch.float32
        torch.testing.assert_close(score[0], hf_loss, rtol=1e-5, atol=1e-6)


def test_batched_scores_equal_single_sample_scores(task, model):
    dataset = task.train_dataset()
    items = [dataset[i] for i in range(len(dataset))]
    assert len({len(i["input_ids"]) for i in items}) == len(items)  # all lengths differ
    assert len({i["labels"].count(-100) for i in items}) == len(items)  # so do prompt lengths
    batched = task.per_sample_loss(model, task.collate(items))
    single = torch.cat([task.per_sample_loss(model, task.collate([item])) for item in items])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5)
    assert batched.std() > 0


def test_lora_wraps_every_linear_layer_of_the_blocks_and_only_adapters_train(task, model):
    base_linears = {
        name.removeprefix("base_model.model.")
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and "lora_" not in name
        and not isinstance(module, LoraLayer)
        and name.split(".")[-1] != "base_layer"
    }
    wrapped = {
        name.removeprefix("base_model.model.")
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer)
    }
    block_linears = {
        f"model.layers.{i}.{proj}"
        for i in range(2)
        for proj in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert wrapped == block_linears
    assert base_linears == {"lm_head"}  # the only linear left unwrapped
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * len(block_linears)
    assert {id(p) for p in task.trainable_parameters(model)} == {id(p) for p in model.parameters() if p.requires_grad}
    lora = model.peft_config["default"]
    assert lora.r == lora.lora_alpha == 4


def test_training_steps_lower_the_scores_and_leave_the_base_frozen(task, model):
    batch = task.collate([task.train_dataset()[i] for i in range(4)])
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW(task.trainable_parameters(model), lr=1e-2)
    before = task.per_sample_loss(model, batch).detach()
    model.train()
    for _ in range(5):
        task.per_sample_loss(model, batch).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    after = task.per_sample_loss(model.eval(), batch).detach()
    assert (after < before).all()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_optimizer_spec_is_the_papers_lora_recipe(task):
    assert task.optimizer_spec() == OptimizerSpec(
        lr=2e-5, weight_decay=0.0, betas=(0.9, 0.999), schedule="cosine", warmup_ratio=0.03, global_batch_size=128
    )
    assert not hasattr(task, "optimizer_defaults")


def test_parameter_groups_hold_exactly_the_lora_adapters(task, model):
    groups = task.parameter_groups(model, weight_decay=0.1)
    grouped = [p for group in groups for p in group["params"]]
    assert len(grouped) == len({id(p) for p in grouped})  # no parameter twice
    assert {id(p) for p in grouped} == {id(p) for p in task.trainable_parameters(model)}
    adapters = {id(p) for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    assert {id(p) for p in grouped} == adapters
    # adapters are matrices: all decayed (by what train.weight_decay asks; the default is 0.0)
    assert [g["weight_decay"] for g in groups] == [0.1]
    torch.optim.AdamW(groups, lr=1e-3)  # a valid optimiser spec


def test_the_seed_alone_fixes_the_adapters(checkpoint, train_file):
    config = LLMTaskConfig(model=str(checkpoint), dataset=str(train_file), lora_r=4)

    def adapters(seed: int, global_seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(global_seed)  # whatever ran before must not matter
        model = LLMTask(config, seed=seed).build_model()
        return {n: p for n, p in model.named_parameters() if ".lora_A." in n}

    first, again, other = adapters(3, 0), adapters(3, 99), adapters(4, 0)
    assert first.keys() == again.keys() == other.keys() and first
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert not all(torch.equal(first[n], other[n]) for n in first)


def test_group_labels_come_from_metamathqa_types(checkpoint, tmp_path):
    (tmp_path / "metamathqa").mkdir()
    rows = [
        {"query": f"q{i}", "response": f"r{i}", "type": t}
        for i, t in enumerate(["MATH_SV", "GSM_Rephrased", "MATH_SV"])
    ]
    (tmp_path / "metamathqa" / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    config = LLMTaskConfig(model=str(checkpoint), dataset="metamathqa", data_dir=str(tmp_path))
    task = LLMTask(config, seed=0)
    assert len(task.train_dataset()) == 3
    assert task.group_labels().tolist() == [1, 0, 1]


def test_batched_greedy_generation_matches_one_prompt_at_a_time(task, model):
    prompts = [task.encode_prompt([e["prompt"]]) for e in EXAMPLES]
    batched = generate_greedy(model, task.tokenizer, prompts, max_new_tokens=6, batch_size=4)
    one_by_one = generate_greedy(model, task.tokenizer, prompts, max_new_tokens=6, batch_size=1)
    assert batched == one_by_one
    assert all(isinstance(text, str) for text in batched) and any(batched)


def test_evaluate_runs_gsm8k_and_humaneval_end_to_end(checkpoint, train_file, model):
    if not (DATASETS / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    task = make_task(
        checkpoint,
        train_file,
        data_dir=str(DATASETS),
        eval={
            "suites": ["gsm8k", "humaneval"],
            "eval_limit": 3,
            "max_new_tokens": 4,
            "eval_batch_size": 2,
            "code_timeout": 5,
        },
    )
    messages: list[str] = []
    metrics = task.evaluate(model, rank=0, world_size=1, progress=messages.append)
    assert set(metrics) == {"gsm8k_accuracy", "humaneval_pass@1"}
    assert all(0.0 <= value <= 1.0 for value in metrics.values())
    assert "gsm8k: generated 2/3" in messages and "humaneval: generated 3/3" in messages
    assert any(m.startswith("gsm8k: accuracy") and m.endswith("/3)") for m in messages)
    # rank 1 of 2 takes problems[:3][1::2], one problem; with no process group, counts stay local
    task.evaluate(model, rank=1, world_size=2, progress=messages.append)
    assert messages[-1].startswith("humaneval: pass@1") and messages[-1].endswith("/1)")


def test_a_batch_without_response_tokens_scores_zero_and_still_backpropagates(task, model):
    batch = task.collate([task.train_dataset()[i] for i in range(2)])
    batch["labels"][:] = -100
    losses = task.per_sample_loss(model, batch)
    assert losses.tolist() == [0.0, 0.0]
    losses.sum().backward()  # a graph through every adapter, as DDP needs: zero gradients
    grads = [p.grad for p in task.trainable_parameters(model)]
    assert all(g is not None and not g.any() for g in grads)


def test_a_checkpoint_restores_a_model_whose_frozen_lm_head_is_tied_to_the_embedding(tmp_path, train_file):
    """SmolLM2 ties its LM head to the token embedding: the state dict names the frozen tensor
    twice, and a checkpoint (the adapters only) lacks both names, which restoring must accept."""
    from attent.engine import checkpoint as checkpoints

    save_tiny_llama(tmp_path, tiny_tokenizer(), tie_word_embeddings=True)
    trained = make_task(tmp_path, train_file).build_model()
    with torch.no_grad():
        for name, parameter in trained.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    saved = checkpoints.trainable_state(trained)
    assert not any("lm_head" in name or "embed_tokens" in name for name in saved)
    restored = make_task(tmp_path, train_file).build_model()
    checkpoints.load_trainable_state(restored, saved)
    assert all(torch.equal(restored.state_dict()[name], tensor) for name, tensor in saved.items())


@pytest.mark.parametrize("style", ["chat", "alpaca"])
def test_a_conversation_trains_every_reply_on_the_tokens_its_next_turn_is_asked_with(checkpoint, train_file, style):
    from attent.tasks.llm.data import SFTDataset
    from attent.tasks.llm.sources import Example

    task = make_task(checkpoint, train_file, prompt_style=style)
    example = Example("What is 2 + 3?", "5.", earlier=("Say hi.", "Hi!"))
    (first_prompt, first_reply), (second_prompt, second_reply) = task.encode_example(example)
    # MT-Bench's second turn is asked with exactly what training put before the second reply
    assert first_prompt + first_reply + second_prompt == task.encode_prompt(["Say hi.", "Hi!", "What is 2 + 3?"])
    assert (first_prompt, first_reply) == task.encode_example(Example("Say hi.", "Hi!"))[0]
    item = SFTDataset([example], task.encode_example, max_length=512)[0]
    labelled = [token for token in item["labels"] if token != -100]
    assert labelled == first_reply + second_reply and len(item["input_ids"]) == len(item["labels"])
    cut = SFTDataset([example], task.encode_example, max_length=len(first_prompt + first_reply) + 2)[0]
    assert cut["input_ids"] == (first_prompt + first_reply + second_prompt)[: len(cut["input_ids"])]


def test_the_released_codes_score_is_each_samples_token_losses_averaged_over_the_padded_row(checkpoint, train_file):
    import torch.nn.functional as F

    task = make_task(checkpoint, train_file, score="padded_row_mean")
    model = task.build_model()
    dataset = task.train_dataset()
    batch = task.collate([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        losses = task.per_sample_loss(model, batch)
    # the released train.py's per-sample loss: reduction="none" over the shifted row, then its mean
    rows = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], reduction="none").mean(dim=1)
    torch.testing.assert_close(task.score_of(losses, batch), rows, rtol=1e-5, atol=1e-6)
    shortest = min(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"]))
    alone = task.collate([dataset[shortest]])
    with torch.no_grad():
        alone_score = task.score_of(task.per_sample_loss(model, alone), alone)
    assert alone_score[0] > rows[shortest]  # beside longer samples its row is wider: its score depends on its batch
    assert make_task(checkpoint, train_file).score_of(losses, batch) is losses  # ours: the training loss
