"""What `attent plan` prices from what runs: a language model's tokens a sample from its data's
tokenized lengths padded as the loader pads them (else a stated length), each workload's own
utilisation, accelerators compared by measured throughput rather than peaks, evaluation's greedy
decoding at the memory bandwidth, and the input pipeline beside the model's steps."""

from __future__ import annotations

import json

import pytest
from attent.cli.main import main
from attent.cost import rates
from attent.cost.accelerators import ACCELERATORS
from attent.cost.decoding import bytes_read, decoding_seconds
from attent.cost.flops import Throughput
from attent.cost.lengths import STATED, Lengths, stated_lengths
from attent.tasks.task import Decoding

from tests.helpers.llm_tiny import checkpoint  # noqa: F401  (fixture)
from tests.helpers.paths import DATASETS, REPO

MILESTONE = REPO / "experiments/sweeps/milestone_llama2_metamath_gpu.yaml"
STATED_GSM8K_PADDED = stated_lengths("gsm8k", 512).padded(4)  # GSM8K's stated law, batches of 4


def plan(tmp_path, *args) -> dict:
    out = tmp_path / "plan.json"
    assert main(["plan", *map(str, args), "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def milestone(tmp_path_factory):
    """The milestone's first run priced on ``gpu`` (with further options), each once a module:
    a 7B model's FLOPs take seconds to count."""
    priced = {}

    def price(gpu: str, *options: str) -> dict:
        if (gpu, options) not in priced:
            folder = tmp_path_factory.mktemp("milestone")
            priced[gpu, options] = plan(folder, MILESTONE, "--gpu", gpu, *options)["runs"][0]
        return priced[gpu, options]

    return price


def test_a_batch_is_padded_to_the_expected_longest_of_its_draws():
    lengths = Lengths((100, 200), "two", measured=True)
    assert lengths.padded(1) == pytest.approx(150)  # one draw: the mean
    assert lengths.padded(2) == pytest.approx(100 * 0.25 + 200 * 0.75)  # the longer unless both are short
    assert lengths.padded(64) == pytest.approx(200, rel=1e-6)


def test_a_stated_length_is_a_law_of_its_mean_truncated_at_max_length():
    stated = stated_lengths("metamathqa", 4096)
    assert stated.mean == pytest.approx(STATED["metamathqa"].mean, rel=0.02) and not stated.measured
    assert "estimate" in stated.source and max(stated_lengths("metamathqa", 300).values) == 300
    assert stated_lengths("a-file.jsonl", 512) is None


def test_an_llm_on_data_here_is_counted_at_its_tokenized_padded_width(tmp_path, checkpoint, capsys):  # noqa: F811
    """GSM8K's training file (beside the clone): its examples tokenized by the run's tokenizer,
    the FLOPs counted at the expected longest of a batch, well under max_length."""
    args = [f"task.model={checkpoint}", f"task.data_dir={DATASETS}", "task.max_length=512", "train.batch_size=4"]
    at_width = plan(tmp_path, REPO / "experiments/gsm8k_smollm2.yaml", *args)["runs"][0]
    out = capsys.readouterr().out
    assert "measured: 80 of its 80 examples tokenized" in out  # the file's train_limit
    assert 50 < at_width["tokens"] < 512
    bound = plan(tmp_path, REPO / "experiments/gsm8k_smollm2.yaml", *args, "task.data_dir=/nonexistent")["runs"][0]
    assert bound["tokens"] == pytest.approx(STATED_GSM8K_PADDED, rel=0.1)  # the stated law's, data absent
    # FLOPs grow with the width (linear, less attention's quadratic share at these lengths)
    ratio = at_width["flops"]["train"] / bound["flops"]["train"]
    assert ratio == pytest.approx(at_width["tokens"] / bound["tokens"], rel=0.1)


def test_each_workload_has_its_utilisation_and_an_h100_its_measured_speed(tmp_path, milestone):
    a100, h100 = milestone("a100-80gb"), milestone("h100")
    assert a100["utilisation"] == pytest.approx(rates.MFU["llm"].value)
    assert a100["method_gpu_hours"] / h100["method_gpu_hours"] == pytest.approx(10_203 / 4_357, rel=0.01)
    assert ACCELERATORS["h100"].bf16 / ACCELERATORS["a100-80gb"].bf16 > 3  # the peaks say otherwise
    mae = plan(tmp_path, REPO / "experiments/multimae_gpu.yaml")["runs"]
    assert mae[0]["utilisation"] == pytest.approx(rates.MFU["mae"].value)  # the pre-training
    assert mae[1]["utilisation"] == pytest.approx(rates.MFU["vit"].value)  # a downstream fine-tuning
    assert milestone("h100", "--mfu", "0.5")["utilisation"] == 0.5


def test_evaluation_decodes_at_the_memory_bandwidth(milestone):
    """The same chip with less bandwidth: the training hours alike, the evaluation's longer, by
    about the bandwidths' ratio (its prompts' forwards are a small share)."""
    fast, slow = milestone("a100-80gb"), milestone("a100-40gb")
    assert fast["method_gpu_hours"] == pytest.approx(slow["method_gpu_hours"])
    bandwidths = ACCELERATORS["a100-80gb"].bandwidth / ACCELERATORS["a100-40gb"].bandwidth
    assert slow["eval_gpu_hours"] / fast["eval_gpu_hours"] == pytest.approx(bandwidths, rel=0.05)


def test_a_decoding_step_reads_the_weights_once_and_each_sequences_kv_cache():
    decoding = Decoding(answers=64, new_tokens=10, batch=32, bytes_per_parameter=2, kv_bytes_per_token=8)
    # 2 batches x 1,000 parameters x 2 bytes, and 64 sequences x 8 bytes x (4 prompt + 10 / 2) tokens, every step
    assert bytes_read(decoding, 1000, prompt_tokens=4, workers=1) == 10 * (2 * 1000 * 2 + 64 * 8 * 9)
    assert decoding_seconds(decoding, 1000, 4, 1, bandwidth=1e6) == pytest.approx(86_080 / 1e6)


def test_the_loader_and_the_steps_take_turns_in_one_process_and_overlap_with_workers():
    steps = Throughput("cpu", 64, train_samples_per_s=100.0, score_samples_per_s=400.0)
    assert steps.rates() == (100.0, 400.0)  # no loader measured: its data is not here
    in_process = Throughput("cpu", 64, 100.0, 400.0, loader_samples_per_s=100.0, loader_workers=0)
    assert in_process.rates() == pytest.approx((50.0, 80.0))
    beside = Throughput("cuda: H100", 64, 100.0, 400.0, loader_samples_per_s=200.0, loader_workers=7)
    assert beside.rates() == (100.0, 200.0)  # the slower of the two
