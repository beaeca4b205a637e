"""MultiMAE-B's model against our earlier one: FLOPs a sample at the paper's size, and the pretext
losses of a few real steps of each on the offline scenes.

    python benchmarks/cost/multimae_model.py [--train 600] [--test 200] [--epochs 6] [--out FOLDER]

The two models differ in ``task.model.semseg_stride`` (4: semseg in and out at a quarter of the
image's size, MultiMAE's; 1: at its size), ``task.model.decoder`` (``cross_attention``, MultiMAE's;
``joint``), ``task.model.global_tokens`` (MultiMAE's 1; 0) and the RGB targets (MultiMAE's: a decoder of
plain pixels and an extra one of normalised patches, whose losses sum as RGB's; ours before: one
decoder of normalised patches). FLOPs: ``attent plan``'s count on the meta device, of ``experiments/multimae_gpu.yaml``
(ViT-B/16, 224 px, 133 semseg classes). Losses: the offline multi-modal scenes (``attent data
scenes``) at 32 px with ``multimae_scenes.yaml``'s tiny ViT (patch 4, so a semseg patch of 1 pixel
at stride 4), trained in this process by the engine's recipe with every sample each epoch, one seed,
the same data and masks for both; the test split's reconstruction loss per modality after each
epoch (the semseg loss of the stride-4 model is scored on the quarter-size map it predicts).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the suite's harness
import harness  # noqa: E402
from attent import contract  # noqa: E402
from attent.cost.flops import count_flops  # noqa: E402
from attent.engine.recipe import TrainingRecipe, WorkerContext  # noqa: E402
from attent.experiment.files import load_experiment  # noqa: E402
from attent.experiment.schema import build_experiment  # noqa: E402
from attent.tasks.mae import scenes  # noqa: E402
from attent.tasks.registry import task_class  # noqa: E402

MODELS = {  # name: the task fields that make it (model.<field>: the model section's)
    "MultiMAE-B's (semseg_stride 4, cross_attention, a global token, extra norm-pix decoder)": {
        "model.semseg_stride": 4,
        "model.decoder": "cross_attention",
        "model.global_tokens": 1,
        "norm_pix_loss": False,
        "extra_norm_pix_loss": True,
    },
    "ours before (semseg_stride 1, joint)": {
        "model.semseg_stride": 1,
        "model.decoder": "joint",
        "model.global_tokens": 0,
        "norm_pix_loss": True,
        "extra_norm_pix_loss": False,
    },
}
MODALITIES = ("rgb", "depth", "semseg")


def gflops(fields: dict) -> dict:
    """A training sample's and a scoring forward's GFLOPs, and the parameters, at the paper's size."""
    overrides = [f"task.{key}={str(v).lower() if isinstance(v, bool) else v}" for key, v in fields.items()]
    cfg = load_experiment(harness.REPO / "experiments" / "multimae_gpu.yaml", overrides)
    counted = count_flops(task_class("multimae").probe(cfg.task))
    return {"train": counted.train / 1e9, "score": counted.score / 1e9, "parameters_m": counted.parameters / 1e6}


def pretext_losses(root: Path, fields: dict, epochs: int) -> list[dict]:
    """The test split's losses per modality after each epoch of training on the scenes."""
    model_fields = {key.removeprefix("model."): v for key, v in fields.items() if key.startswith("model.")}
    task_fields = {key: v for key, v in fields.items() if not key.startswith("model.")}
    cfg = build_experiment(
        {
            "name": "multimae-model",
            "seed": 0,
            "task": {
                "name": "multimae",
                "data_path": str(root),
                "img_size": 32,
                "visible_tokens": 48,
                "model": {"preset": "vit_tiny_cpu", "decoder_dim": 64, "decoder_depth": 1, **model_fields},
                **task_fields,
            },
            "train": {"epochs": epochs, "batch_size": 64, "lr": 0.0015, "warmup_ratio": 0.1, "eval_every": 1},
            "selection": {"method": "full"},
        }
    )
    recipe = TrainingRecipe(cfg, WorkerContext())
    recipe.setup()
    rows = []
    for epoch in range(epochs):
        row = recipe.run_epoch(epoch)
        rows.append(
            {m: row[f"{contract.EVAL_PREFIX}test_loss_{m}"] for m in MODALITIES}
            | {"train_loss": row[contract.TRAIN_LOSS]}
        )
        print(f"  epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in rows[-1].items()), flush=True)
    return rows


def render(results: dict) -> str:
    lines = [
        "## FLOPs a sample at the paper's size (ViT-B/16, 224 px, 133 semseg classes)",
        "",
        "| model | training step GFLOPs | scoring forward GFLOPs | parameters (M) |",
        "|---|---:|---:|---:|",
    ]
    for name, found in results["models"].items():
        f = found["gflops"]
        lines.append(f"| {name} | {f['train']:.1f} | {f['score']:.1f} | {f['parameters_m']:.1f} |")
    setup = results["scenes"]
    lines += [
        "",
        f"## Pretext losses on the offline scenes ({setup['train']} training, {setup['test']} test scenes, 32 px)",
        "",
        "| model | epoch | test RGB (MSE; MultiMAE-B's: plain + norm-pix) | test depth (L1) | test semseg (CE) "
        "| train loss |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, found in results["models"].items():
        for epoch, row in enumerate(found["losses"], start=1):
            lines.append(
                f"| {name} | {epoch} | {row['rgb']:.4f} | {row['depth']:.4f} | {row['semseg']:.4f} | "
                f"{row['train_loss']:.4f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=600, help="training scenes")
    parser.add_argument("--test", type=int, default=200, help="test scenes")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", type=Path, help="results folder (default: a new stamped one)")
    args = parser.parse_args()
    info = harness.machine()
    results: dict = {"command": harness.command_line(), "scenes": {"train": args.train, "test": args.test}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "scenes"
        scenes.write_dataset(root, train=args.train, test=args.test, size=32, seed=0, workers=1)
        results["models"] = {}
        for name, fields in MODELS.items():
            print(name, flush=True)
            results["models"][name] = {"gflops": gflops(fields), "losses": pretext_losses(root, fields, args.epochs)}
    out = harness.results_folder(args.out, info)
    harness.write_json(out / "results.json", results)
    harness.write_readme(out, "MultiMAE-B's model against ours before", results["command"], render(results), info)
    print(out / "README.md")


if __name__ == "__main__":
    main()
