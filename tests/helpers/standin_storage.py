"""A folder standing for the cluster's shared storage (attent.experiment.cluster_layout), holding what the paper-scale
files read there, in their formats, at a few samples each: ImageNet-S50 and NYUv2 in MultiMAE's layout (the offline
scenes; dataset.json naming COCO's 133 and NYUv2's 40 semseg classes; ImageNet-S50's decoded cache at 224 px, which
multimae_gpu.yaml requires), an ImageNet-style image folder with its cache, the LLM task's named training sets and
evaluation suites as the offline mirror's JSONL (rows of GSM8K and MBPP in each set's own schema, two-turn conversations
and MT-Bench questions among them), and a Hugging Face cache holding the Table 1 models' and judge's configs and a
tokenizer under their hub names (HF_HOME, read with the hub offline).
What `attent rehearse --shared-folder` reads; the environment a job there gets is cluster_layout.OFFLINE_ENV's, remapped."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from attent.experiment import cluster_layout as layout
from attent.rehearsal.standin import remap_shared
from attent.tasks.config import STAND_IN

from tests.helpers.paths import BIN, REPO

SHARED_DATASETS = REPO.parent / "shared" / "datasets"  # the tests' GSM8K and MBPP (read, never shipped)
MODELS = ("meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1", "google/gemma-7b", "Qwen/Qwen2.5-7B-Instruct")
SAMPLES = 48  # training scenes, rows, images: at least the stand-in's train_limit (STAND_IN.train_samples)


def job_env(folder: Path) -> dict[str, str]:
    """The environment a job on the cluster gets, with the shared storage at ``folder``."""
    return remap_shared(dict(layout.OFFLINE_ENV), (layout.SHARED,), str(folder))


def on_storage(folder: Path, path: str) -> Path:
    """Where the cluster's ``path`` (under /shared) lies in the stand-in ``folder``."""
    return Path(remap_shared(path, (layout.SHARED,), str(folder)))


def build(folder: Path) -> Path:
    """The stand-in storage under ``folder`` (made once: a second call finds it)."""
    data = on_storage(folder, layout.DATA_ROOT)
    if (data / ".complete").is_file():
        return folder
    attent = str(BIN / "attent")
    for name, classes in (("imagenet-s50-multimae", 133), ("nyuv2-multimae", 40)):
        root = data / name
        subprocess.run([attent, "data", "scenes", "--out", str(root), "--train", str(SAMPLES), "--test", "24",
                        "--size", "32", "--workers", "1"], check=True, capture_output=True)  # fmt: skip
        meta = json.loads((root / "dataset.json").read_text())
        meta["semseg_classes"] = [
            *meta["semseg_classes"],
            *(f"c{i}" for i in range(len(meta["semseg_classes"]), classes)),
        ]
        (root / "dataset.json").write_text(json.dumps(meta))
    # an image folder of class folders, split by the task's test_fraction (0.2): enough for the stand-in's test_limit
    subprocess.run([attent, "data", "scenes", "--out", str(work := folder / "imagenet-scenes"), "--train",
                    str(5 * STAND_IN.test_samples), "--test", "1", "--size", "32", "--workers", "1"],
                   check=True, capture_output=True)  # fmt: skip
    shutil.move(work / "train" / "rgb", data / "imagenet")
    shutil.rmtree(work)
    for root in ("imagenet-s50-multimae", "imagenet"):  # the files' cache_path: required, at their 224 px
        subprocess.run([attent, "data", "cache", str(data / root), "--img-size", "224", "--workers", "1"],
                       check=True, capture_output=True)  # fmt: skip
    _llm_mirror(data)
    _hub_cache(on_storage(folder, layout.HF_HOME))
    (data / ".complete").write_text("")
    return folder


def _rows(path: Path, count: int = SAMPLES) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for _, line in zip(range(count), f)]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _llm_mirror(data: Path) -> None:
    """$ATTENT_DATA_DIR's files, each named set in its hub schema (attent.tasks.llm.sources)."""
    gsm8k, tests = _rows(SHARED_DATASETS / "gsm8k" / "train.jsonl"), _rows(SHARED_DATASETS / "gsm8k" / "test.jsonl")
    mbpp = [row for row in _rows(SHARED_DATASETS / "mbpp" / "mbpp.jsonl", 974)]
    _write(data / "gsm8k" / "train.jsonl", gsm8k)
    _write(data / "gsm8k" / "test.jsonl", tests)
    _write(data / "mbpp" / "mbpp.jsonl", mbpp)
    _write(data / "math" / "test.jsonl", [
        {"problem": r["question"], "solution": f"\\boxed{{{r['answer'].split('####')[-1].strip()}}}",
         "level": "Level 1", "type": "Prealgebra"} for r in tests])  # fmt: skip
    _write(data / "metamathqa" / "train.jsonl", [
        {"query": r["question"], "response": r["answer"], "type": "GSM_AnsAug", "original_question": r["question"]}
        for r in gsm8k])  # fmt: skip
    _write(data / "codefeedback" / "train.jsonl", [
        {"query": r["text"], "answer": f"```python\n{r['code']}\n```", "resource": "mbpp", "lang": "python"}
        for r in mbpp[:SAMPLES]])  # fmt: skip
    _write(data / "wizardlm_evol_instruct_196k" / "train.jsonl", [
        {"idx": str(i), "conversations": [{"from": "human", "value": r["question"]}, {"from": "gpt", "value": r["answer"]},
                                          {"from": "human", "value": "And in one line?"},
                                          {"from": "gpt", "value": r["answer"].split("####")[-1].strip()}]}
        for i, r in enumerate(gsm8k)])  # fmt: skip
    _write(data / "mt_bench" / "question.jsonl", [  # FastChat's question.jsonl: two turns, a reference for math
        {"question_id": 81 + i, "category": "math", "turns": [r["question"], "Now check your answer."],
         "reference": [r["answer"], r["answer"]]} for i, r in enumerate(tests[:2])])  # fmt: skip


def _hub_cache(hf_home: Path) -> None:
    """The Table 1 models as the hub's cache holds them (config and tokenizer, no weights: a rehearsal
    makes its own), so that `from_pretrained("meta-llama/Llama-2-7b-hf")` finds them offline."""
    from attent.tasks.llm.model import ARCHITECTURES
    from transformers import AutoConfig

    from tests.helpers.llm_tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    for model in MODELS:
        repo = hf_home / "hub" / f"models--{model.replace('/', '--')}"
        revision = "0" * 40
        snapshot = repo / "snapshots" / revision
        fields = dict(ARCHITECTURES[model])
        AutoConfig.for_model(fields.pop("model_type"), **fields).save_pretrained(snapshot)
        tokenizer.save_pretrained(snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
