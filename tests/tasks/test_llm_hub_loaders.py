"""The Hugging Face hub loaders of the LLM task, run offline on small copies of each hub repository.

Each fixture is a folder laid out like the dataset's hub repository: the same file names and
formats (MetaMathQA and WizardLM: one JSON list; CodeFeedback: JSON lines; MATH and MT-Bench:
parquet per config/split named by the README's ``configs``), with the real column names and
types. ``datasets.load_dataset`` reads the folder exactly as it reads the hub repository, and the
column mapping and filtering that run on hub data run on these rows.
"""

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from attent.tasks.llm.data import load_examples
from attent.tasks.llm.evaluation.mt_bench import load_mt_bench_questions
from attent.tasks.llm.evaluation.suites import MATH, MATH_SUBJECTS, load_math_test
from attent.tasks.llm.sources import SOURCES, read_records

from tests.helpers.paths import FIXTURES

MT_BENCH_FIXTURE = FIXTURES / "llm" / "mt_bench" / "question.jsonl"


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path, monkeypatch):
    """Arrow caches of these loads go to the test's folder; nothing may go to the network."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def hub_repo(root: Path, files: dict[str, object], readme: str = "---\nlicense: mit\n---\n") -> Path:
    """A folder like a hub dataset repository: README.md plus data files (.json: a list,
    .jsonl: rows, .parquet: rows as a pyarrow table)."""
    root.mkdir(parents=True)
    (root / "README.md").write_text(readme)
    for name, rows in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".jsonl"):
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif name.endswith(".json"):
            path.write_text(json.dumps(rows, indent=2))
        else:
            pq.write_table(rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows), path)
    return root


def named(dataset: str, repo: Path, limit: int | None = None):
    return load_examples(dataset, folder=None, prompt_field="", response_field="", limit=limit, hub_repo=repo)


# --- MetaMathQA -----------------------------------------------------------------------------
METAMATHQA = [  # MetaMathQA-395K.json: {query, response, type, original_question}
    {
        "query": "Mia reads 12 pages a day. How many pages does she read in a week?",
        "response": "In a week she reads 7 * 12 = 84 pages.\n#### 84\nThe answer is: 84",
        "type": "GSM_Rephrased",
        "original_question": "Mia reads 12 pages every day. How many pages in 7 days?",
    },
    {
        "query": "What is the value of $x$ if $2x + 3 = 11$?",
        "response": "Subtracting 3 gives $2x = 8$, so $x = \\boxed{4}$.\nThe answer is: 4",
        "type": "MATH_AnsAug",
        "original_question": "What is the value of $x$ if $2x + 3 = 11$?",
    },
    {
        "query": "Tom has X marbles and gives away 5, keeping 9. What is X?",
        "response": "X - 5 = 9, so X = 14.\n#### 14\nThe answer is: 14",
        "type": "GSM_SV",
        "original_question": "Tom has 14 marbles and gives away 5. How many are left?",
    },
]


def test_metamathqa_maps_query_response_and_augmentation_type(tmp_path):
    repo = hub_repo(tmp_path / "MetaMathQA", {"MetaMathQA-395K.json": METAMATHQA})
    examples = named("metamathqa", repo)
    assert [(e.prompt, e.response, e.group) for e in examples] == [
        (r["query"], r["response"], r["type"]) for r in METAMATHQA
    ]
    assert [e.prompt for e in named("metamathqa", repo, limit=2)] == [r["query"] for r in METAMATHQA[:2]]


def test_metamathqa_mirror_file_and_hub_give_the_same_examples(tmp_path):
    repo = hub_repo(tmp_path / "MetaMathQA", {"MetaMathQA-395K.json": METAMATHQA})
    mirror = tmp_path / "mirror"
    (mirror / "metamathqa").mkdir(parents=True)
    (mirror / "metamathqa" / "train.json").write_text(json.dumps(METAMATHQA))
    from_mirror = load_examples(
        "metamathqa", folder=mirror, prompt_field="", response_field="", limit=None, hub_repo=tmp_path / "absent"
    )  # the mirror wins
    assert from_mirror == named("metamathqa", repo) and len(from_mirror) == 3


# --- CodeFeedback (Python) ------------------------------------------------------------------
CODEFEEDBACK = [  # CodeFeedback-Filtered-Instruction.jsonl: {query, answer, resource, lang}
    {
        "query": "Write a Python function that reverses a string.",
        "answer": "```python\ndef reverse(s):\n    return s[::-1]\n```",
        "resource": "codealpaca",
        "lang": "python",
    },
    {
        "query": "Write a JavaScript function that sums an array.",
        "answer": "```javascript\nconst sum = a => a.reduce((x, y) => x + y, 0);\n```",
        "resource": "evolinstruct",
        "lang": "javascript",
    },
    {
        "query": "Implement binary search in C++.",
        "answer": "```cpp\nint search();\n```",
        "resource": "magicoder_oss_instruct",
        "lang": "c++",
    },
    {
        "query": "Return the squares of a list in Python.",
        "answer": "```python\ndef squares(xs):\n    return [x * x for x in xs]\n```",
        "resource": "wizardcoder",
        "lang": "python",
    },
]


def test_codefeedback_keeps_only_python_and_maps_query_answer(tmp_path):
    repo = hub_repo(
        tmp_path / "CodeFeedback-Filtered-Instruction", {"CodeFeedback-Filtered-Instruction.jsonl": CODEFEEDBACK}
    )
    examples = named("codefeedback", repo)
    assert [(e.prompt, e.response, e.group) for e in examples] == [
        (r["query"], r["answer"], "") for r in (CODEFEEDBACK[0], CODEFEEDBACK[3])
    ]
    # train_limit counts kept (Python) rows, not raw ones
    assert [e.prompt for e in named("codefeedback", repo, limit=2)] == [
        CODEFEEDBACK[0]["query"],
        CODEFEEDBACK[3]["query"],
    ]


# --- WizardLM evol-instruct -----------------------------------------------------------------
WIZARDLM_70K = [  # alpaca_evol_instruct_70k.json: {instruction, output}
    {
        "instruction": "Explain photosynthesis to a ten-year-old in three sentences.",
        "output": "Plants catch sunlight with their leaves. They use it to turn water and air into "
        "sugar. That sugar is their food, and they give off oxygen.",
    },
    {
        "instruction": "List three uses of a paperclip besides holding paper.",
        "output": "1. Resetting a device.\n2. A zipper pull.\n3. A bookmark.",
    },
]
WIZARDLM_V2 = [  # WizardLM_evol_instruct_V2_143k.json: {idx, conversations: [{from, value}]}
    {
        "idx": "a1",
        "conversations": [
            {"from": "human", "value": "Name a prime above 10."},
            {"from": "gpt", "value": "11 is a prime above 10."},
        ],
    },
    {"idx": "a2", "conversations": [{"from": "human", "value": "Only a question, no reply."}]},
    {
        "idx": "a3",
        "conversations": [
            {"from": "human", "value": "Say hi."},
            {"from": "gpt", "value": "Hi!"},
            {"from": "human", "value": "Again."},
            {"from": "gpt", "value": "Hi again!"},
        ],
    },
]


def test_wizardlm_70k_maps_instruction_output(tmp_path):
    repo = hub_repo(tmp_path / "WizardLM_evol_instruct_70k", {"alpaca_evol_instruct_70k.json": WIZARDLM_70K})
    assert SOURCES["wizardlm"].hub_path == "WizardLMTeam/WizardLM_evol_instruct_70k"
    examples = named("wizardlm", repo)
    assert [(e.prompt, e.response) for e in examples] == [(r["instruction"], r["output"]) for r in WIZARDLM_70K]


def test_wizardlm_v2_conversations_keep_every_exchange(tmp_path):
    repo = hub_repo(tmp_path / "WizardLM_evol_instruct_V2_196k", {"WizardLM_evol_instruct_V2_143k.json": WIZARDLM_V2})
    examples = named("wizardlm", repo)
    assert [e.conversation() for e in examples] == [
        ["Name a prime above 10.", "11 is a prime above 10."],
        ["Say hi.", "Hi!", "Again.", "Hi again!"],
    ]


# --- MATH (evaluation suite) ----------------------------------------------------------------
MATH_README = (
    "---\nlicense: mit\nconfigs:\n"
    + "".join(
        f"- config_name: {s}\n  data_files:\n  - split: train\n    path: {s}/train-*\n"
        f"  - split: test\n    path: {s}/test-*\n"
        for s in MATH_SUBJECTS
    )
    + "---\n"
)


def math_rows(subject: str, split: str) -> list[dict[str, str]]:
    """One problem per subject and split: {problem, level, type, solution} (all strings)."""
    n = MATH_SUBJECTS.index(subject) + 2
    kind = subject.replace("_", " ").title().replace("And", "&")
    return [
        {
            "problem": f"[{split}] What is ${n} \\cdot {n}$?",
            "level": f"Level {n % 5 + 1}",
            "type": kind,
            "solution": f"We have ${n} \\cdot {n} = \\boxed{{{n * n}}}$.",
        }
    ]


@pytest.fixture
def math_repo(tmp_path) -> Path:
    files = {
        f"{s}/{split}-00000-of-00001.parquet": math_rows(s, split) for s in MATH_SUBJECTS for split in ("train", "test")
    }
    return hub_repo(tmp_path / "hendrycks_math", files, readme=MATH_README)


def test_math_loads_the_test_split_of_every_subject_with_boxed_answers(math_repo):
    problems = load_math_test(None, math_repo)
    assert len(problems) == len(MATH_SUBJECTS) == 7
    assert all(p["problem"].startswith("[test]") for p in problems)  # not the train split
    assert [p["problem"] for p in problems] == [
        math_rows(s, "test")[0]["problem"] for s in MATH_SUBJECTS
    ]  # subject order
    assert [p["answer"] for p in problems] == [str((i + 2) ** 2) for i in range(7)]
    assert {p["level"] for p in problems} <= {f"Level {i}" for i in range(1, 6)}


def test_math_suite_grades_hub_problems(math_repo):
    suite = MATH(None, hub_repo=math_repo)
    problems = suite.problems[:3]
    assert suite.instruction(problems[0]) == problems[0]["problem"]
    completions = ["So the result is \\boxed{4}.", "The answer is 9", "\\boxed{15}"]
    assert suite.grade(problems, completions) == [True, True, False]


# --- MT-Bench questions ---------------------------------------------------------------------
def test_mt_bench_questions_from_hub_mirror_and_file_agree(tmp_path):
    rows = read_records(MT_BENCH_FIXTURE)
    # lighteval/mt-bench: data/train-*.parquet, question_id int64, category string, turns and
    # reference lists of strings (reference empty where the category has none)
    table = pa.Table.from_pylist(
        [{**r, "reference": r.get("reference", [])} for r in rows],
        schema=pa.schema(
            [
                ("question_id", pa.int64()),
                ("category", pa.string()),
                ("turns", pa.list_(pa.string())),
                ("reference", pa.list_(pa.string())),
            ]
        ),
    )
    readme = "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n"
    repo = hub_repo(tmp_path / "mt-bench", {"data/train-00000-of-00001.parquet": table}, readme)
    from_hub = load_mt_bench_questions(hub_repo=repo)
    from_file = load_mt_bench_questions(MT_BENCH_FIXTURE)
    mirror = tmp_path / "data"
    (mirror / "mt_bench").mkdir(parents=True)
    pq.write_table(table, mirror / "mt_bench" / "question.parquet")
    from_mirror = load_mt_bench_questions(folder=mirror, hub_repo=tmp_path / "absent")
    assert from_hub == from_file == from_mirror
    assert [q["question_id"] for q in from_hub] == [1, 2, 3]
    assert from_hub[0]["reference"] is None  # writing: no reference answer
    assert from_hub[1]["reference"] == rows[1]["reference"]
    assert all(len(q["turns"]) == 2 for q in from_hub)
