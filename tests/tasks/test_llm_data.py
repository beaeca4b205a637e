"""Training-data sources, truncation and config validation of the LLM task."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from attent.tasks.llm.config import LLMTaskConfig
from attent.tasks.llm.data import build_labels, draw_problems, example_source, load_examples, truncate
from attent.tasks.llm.sources import local_file, read_records
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.helpers.paths import DATASETS

ROWS = [{"q": "What is 2+2?", "a": "4"}, {"q": "Name a colour.", "a": "Blue."}]


@pytest.fixture(scope="module")
def shared_datasets() -> Path:
    if not (DATASETS / "gsm8k" / "train.jsonl").is_file():
        pytest.skip(f"{DATASETS} not present")
    return DATASETS


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_read_records_reads_every_supported_format(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    else:
        pd.DataFrame(ROWS).to_parquet(path)
    assert read_records(path) == ROWS


def test_read_records_rejects_other_formats(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("q,a\n1,2\n")
    with pytest.raises(ValueError, match="unsupported"):
        read_records(path)


def test_local_file_finds_any_supported_suffix(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    assert local_file(tmp_path, "gsm8k/train") is None
    (tmp_path / "gsm8k" / "train.parquet").write_bytes(b"")
    assert local_file(tmp_path, "gsm8k/train") == tmp_path / "gsm8k" / "train.parquet"
    assert local_file(None, "gsm8k/train") is None


def test_gsm8k_from_the_local_mirror_drops_calculator_annotations(shared_datasets):
    examples = load_examples("gsm8k", folder=shared_datasets, prompt_field="", response_field="", limit=None)
    assert len(examples) == 7473
    first = examples[0]
    assert first.prompt.startswith("Natalia sold clips")
    assert "<<" not in first.response and first.response.endswith("#### 72")


def test_mbpp_training_set_excludes_the_benchmark_tasks(shared_datasets):
    examples = load_examples("mbpp", folder=shared_datasets, prompt_field="", response_field="", limit=None)
    assert len(examples) == 974 - 500
    assert all("Your code should pass these tests" in e.prompt for e in examples)
    assert all(e.response.startswith("```python\n") and "\r" not in e.response for e in examples)


def test_local_file_dataset_uses_the_configured_fields_and_limit(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(ROWS))
    examples = load_examples(str(path), folder=None, prompt_field="q", response_field="a", limit=1)
    assert [(e.prompt, e.response) for e in examples] == [("What is 2+2?", "4")]


# --- validation problems and the seed that draws them ---------------------------------------------


def test_draw_problems_holds_validation_apart_and_resamples_with_the_seed():
    train, val = draw_problems(100, train_limit=30, val_limit=20, seed=1, keep_first=False)
    assert (len(train), len(val)) == (30, 20) and not set(train) & set(val)
    assert train == sorted(train) and val == sorted(val)
    assert (train, val) == draw_problems(100, train_limit=30, val_limit=20, seed=1, keep_first=False)
    other = draw_problems(100, train_limit=30, val_limit=20, seed=2, keep_first=False)
    assert other[0] != train and other[1] != val
    # validation leaves the training problems of a run without it as they were
    assert draw_problems(100, train_limit=30, val_limit=None, seed=1, keep_first=False) == (train, [])
    assert draw_problems(100, train_limit=None, val_limit=20, seed=1, keep_first=False)[0] == sorted(
        set(range(100)) - set(val)
    )
    # a fixed split trains on the first problems, as runs did before seeds drew them
    assert draw_problems(100, train_limit=30, val_limit=None, seed=1, keep_first=True) == (list(range(30)), [])
    fixed, held = draw_problems(100, train_limit=30, val_limit=20, seed=1, keep_first=True)
    assert fixed == list(range(30)) and len(held) == 20 and min(held) >= 30
    assert draw_problems(100, train_limit=None, val_limit=None, seed=1, keep_first=False) == (list(range(100)), [])


def test_a_validation_split_that_does_not_fit_is_refused_in_one_line():
    with pytest.raises(
        ValueError,
        match=r"^val_limit=40 \+ train_limit=70 = 110 exceed the 100 training problems "
        r"both are drawn from \(disjoint\); lower one of them, or set train_limit "
        r"to null to train on the other 60$",
    ):
        draw_problems(100, train_limit=70, val_limit=40, seed=0, keep_first=False)


def test_gsm8k_validation_problems_are_not_training_problems(shared_datasets):
    records, to_example = example_source("gsm8k", folder=shared_datasets, prompt_field="", response_field="")
    for seed, keep_first in ((0, False), (1, False), (0, True)):
        train, val = draw_problems(len(records), train_limit=128, val_limit=128, seed=seed, keep_first=keep_first)
        prompts = {
            split: {to_example(records[i]).prompt for i in indices}
            for split, indices in (("train", train), ("val", val))
        }
        assert len(prompts["train"]) == len(prompts["val"]) == 128  # GSM8K's 7,473 questions are distinct
        assert not prompts["train"] & prompts["val"]
    assert draw_problems(len(records), train_limit=128, val_limit=128, seed=0, keep_first=False) != draw_problems(
        len(records), train_limit=128, val_limit=128, seed=1, keep_first=False
    )


@given(prompt=st.integers(0, 300), response=st.integers(1, 300), max_length=st.integers(16, 256))
def test_truncate_fits_and_keeps_prompt_end_and_response_start(prompt, response, max_length):
    prompt_ids, response_ids = list(range(prompt)), list(range(1000, 1000 + response))
    kept_prompt, kept_response = truncate(prompt_ids, response_ids, max_length)
    assert len(kept_prompt) + len(kept_response) <= max_length
    assert kept_prompt == prompt_ids[len(prompt_ids) - len(kept_prompt) :]  # a suffix
    assert kept_response == response_ids[: len(kept_response)]  # a prefix
    assert len(kept_response) >= min(response, max_length // 4)
    if prompt + response <= max_length:
        assert (kept_prompt, kept_response) == (prompt_ids, response_ids)


def test_build_labels_masks_the_prompt():
    input_ids, labels = build_labels([5, 6, 7], [8, 9])
    assert input_ids == [5, 6, 7, 8, 9]
    assert labels == [-100, -100, -100, 8, 9]


def test_config_rejects_unknown_fields_and_bad_values():
    with pytest.raises(ValidationError):
        LLMTaskConfig(lora_rank=8)
    with pytest.raises(ValidationError):
        LLMTaskConfig(dtype="float16")
    with pytest.raises(ValidationError):
        LLMTaskConfig(eval={"suites": ["mmlu"]})


def test_check_data_accepts_named_sets_and_good_files(tmp_path):
    LLMTaskConfig(dataset="metamathqa").check_data()
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS))
    LLMTaskConfig(dataset=str(path), prompt_field="q", response_field="a").check_data()


def test_check_data_reports_missing_or_unusable_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLMTaskConfig(dataset=str(tmp_path / "missing.jsonl")).check_data()
    with pytest.raises(ValueError, match="neither one of"):
        LLMTaskConfig(dataset="metamath").check_data()
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(ROWS[0]))
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['prompt', 'response'\]"):
        LLMTaskConfig(dataset=str(path)).check_data()
    with pytest.raises(ValueError, match="no records"):
        path.write_text("")
        LLMTaskConfig(dataset=str(path), prompt_field="q", response_field="a").check_data()
    with pytest.raises(FileNotFoundError, match="data_dir"):
        LLMTaskConfig(data_dir=str(tmp_path / "nowhere")).check_data()
    with pytest.raises(ValueError, match="instruction_template"):
        LLMTaskConfig(instruction_template="Solve: {question}").check_data()


def test_read_records_gives_parquet_list_columns_as_lists(tmp_path):
    """As rows from the hub do (numpy arrays would break ``reference or []`` and JSON dumps)."""
    rows = [
        {"question_id": 1, "turns": ["a", "b"], "reference": []},
        {"question_id": 2, "turns": ["c", "d"], "reference": ["e", "f"]},
    ]
    path = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(path)
    records = read_records(path)
    assert records == rows
    assert all(type(r["turns"]) is list and type(r["reference"]) is list for r in records)


def test_config_module_imports_no_heavy_library():
    code = (
        "import sys, attent.tasks.llm.config, attent.tasks.llm.sources; "
        "print(sorted({'torch', 'datasets', 'pandas', 'transformers', 'pyarrow', 'peft'} "
        "& set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_mt_bench_needs_a_judge_and_a_readable_questions_file(tmp_path):
    mt_bench = {"suites": ["gsm8k", "mt_bench"]}
    with pytest.raises(ValueError, match="mt_bench_judge is not set"):
        LLMTaskConfig(eval=mt_bench).check_data()
    LLMTaskConfig(eval={**mt_bench, "mt_bench_judge": "smollm2-135m-instruct"}).check_data()
    with pytest.raises(FileNotFoundError, match="mt_bench_questions"):
        LLMTaskConfig(
            eval={**mt_bench, "mt_bench_judge": "x/y", "mt_bench_questions": str(tmp_path / "q.jsonl")}
        ).check_data()
    with pytest.raises(ValueError, match="is not a"):
        LLMTaskConfig(
            eval={**mt_bench, "mt_bench_judge": "x/y", "mt_bench_questions": str(tmp_path / "q.csv")}
        ).check_data()


def test_with_absolute_paths_resolves_local_paths_and_leaves_names_alone(tmp_path):
    (tmp_path / "checkpoints" / "mine").mkdir(parents=True)
    config = LLMTaskConfig(
        dataset="data/train.jsonl",
        data_dir="mirror",
        model="checkpoints/mine",
        eval={"mt_bench_questions": "q/question.jsonl", "mt_bench_judge": "meta-llama/Llama-2-7b-chat-hf"},
    )
    resolved = config.with_absolute_paths(tmp_path)
    assert resolved.dataset == str(tmp_path / "data" / "train.jsonl")
    assert resolved.data_dir == str(tmp_path / "mirror")
    assert resolved.model == str(tmp_path / "checkpoints" / "mine")  # an existing folder
    assert resolved.eval.mt_bench_questions == str(tmp_path / "q" / "question.jsonl")
    assert resolved.eval.mt_bench_judge == "meta-llama/Llama-2-7b-chat-hf"  # a hub name
    assert isinstance(resolved, LLMTaskConfig) and resolved.lora_r == config.lora_r

    named = LLMTaskConfig(
        dataset="gsm8k", model="HuggingFaceTB/SmolLM2-135M", eval={"mt_bench_judge": "checkpoints/mine"}
    )
    resolved = named.with_absolute_paths(tmp_path)
    assert (resolved.dataset, resolved.model, resolved.data_dir) == (
        "gsm8k",
        "HuggingFaceTB/SmolLM2-135M",
        None,
    )  # named set, hub model, no mirror
    assert resolved.eval.mt_bench_judge == str(tmp_path / "checkpoints" / "mine")
    assert LLMTaskConfig(data_dir="/abs/mirror").with_absolute_paths(tmp_path).data_dir == "/abs/mirror"
    assert LLMTaskConfig.path_fields == ("data_dir",)
