"""Downstream metrics of the MAE workload (attent.tasks.mae.metrics) on hand-computed cases, and
sharded over two torch.distributed (gloo, CPU) ranks against the unsharded computation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from attent.tasks.mae.metrics import LOWER_IS_BETTER, METRIC_NAMES, MIN_DEPTH, DownstreamMetrics, build_metrics

from tests.helpers.ranks import start_method


def one_hot_logits(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[B, H, W] class ids -> [B, C, H, W] logits whose argmax is ``labels``."""
    return F.one_hot(labels, num_classes).permute(0, 3, 1, 2).float()


def test_names_and_directions():
    assert METRIC_NAMES == {"classification": ("top1_accuracy",), "semseg": ("miou",), "depth": ("delta1", "abs_rel")}
    assert LOWER_IS_BETTER == {"abs_rel"}
    for kind, names in METRIC_NAMES.items():
        metrics = build_metrics(kind, num_classes=4)
        assert isinstance(metrics, DownstreamMetrics)
        assert tuple(metrics.metrics) == names
    with pytest.raises(ValueError):
        build_metrics("classification")  # num_classes missing
    with pytest.raises(ValueError):
        build_metrics("semseg", num_classes=300)  # 255 would be a class id
    with pytest.raises(ValueError):
        build_metrics("detection", num_classes=3)


def test_top1_accuracy():
    # argmax per row: 0, 2, 1, 1; targets 0, 1, 1, 2 -> rows 0 and 2 right: 2 / 4 = 0.5
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.1, 0.2, 0.9], [0.0, 3.0, 1.0], [1.0, 2.0, 1.5]])
    metrics = build_metrics("classification", num_classes=3)
    metrics.update(logits, torch.tensor([0, 1, 1, 2]))
    assert metrics.compute() == {"top1_accuracy": pytest.approx(0.5)}


def test_top1_accuracy_keeps_class_255_of_a_large_label_set():
    # 300 classes: label 255 is a class, not "ignore". Predictions 255 and 7, targets 255, 8:
    # 1 / 2 = 0.5
    logits = torch.zeros(2, 300)
    logits[0, 255] = logits[1, 7] = 1.0
    metrics = build_metrics("classification", num_classes=300)
    metrics.update(logits, torch.tensor([255, 8]))
    assert metrics.compute()["top1_accuracy"] == pytest.approx(0.5)


# 3x3, 4 classes, 255 = ignore.
SEG_GT = torch.tensor([[[0, 0, 1], [1, 255, 0], [0, 1, 255]]])
SEG_PRED = torch.tensor([[[0, 1, 1], [1, 3, 0], [0, 2, 0]]])


def test_miou_is_over_the_classes_present():
    """Pixels with gt 255 are dropped with their predictions (the 3 and the 0 there count for
    nothing). Remaining (gt, pred): (0,0) x3, (0,1), (1,1) x2, (1,2).
      class 0: TP 3, FP 0, FN 1 (gt 0 -> pred 1)        IoU 3/4 = 0.75
      class 1: TP 2, FP 1 (gt 0 -> 1), FN 1 (gt 1 -> 2)  IoU 2/4 = 0.5
      class 2: TP 0, FP 1 (only predicted)               IoU 0/1 = 0   -> counts
      class 3: in no gt, predicted only at an ignored pixel: 0/0      -> left out
    mIoU = (0.75 + 0.5 + 0) / 3 = 5/12 = 0.41667 (averaging class 3 in as 0 would give 0.3125).
    """
    metrics = build_metrics("semseg", num_classes=4)
    metrics.update(one_hot_logits(SEG_PRED, 4), SEG_GT)
    assert metrics.compute()["miou"] == pytest.approx(5 / 12)


def test_miou_absence_is_judged_over_the_whole_evaluation_set():
    """Image 1 (2x2): gt [[0, 1], [255, 1]], pred [[0, 1], [1, 0]] -> class 2 absent here.
    Image 2 (2x2): gt [[2, 2], [0, 255]], pred [[2, 0], [0, 2]] -> class 2 present.
    Over both (ignored pixels dropped): (gt, pred) = (0,0), (1,1), (1,0), (2,2), (2,0), (0,0)
      class 0: TP 2, FP 2, FN 0 -> 2/4 = 0.5
      class 1: TP 1, FP 0, FN 1 -> 1/2 = 0.5
      class 2: TP 1, FP 0, FN 1 -> 1/2 = 0.5
      class 3: absent everywhere -> left out.  mIoU = 0.5.
    Two updates give what one update on the concatenated batch gives (one confusion matrix)."""
    gt = torch.tensor([[[0, 1], [255, 1]], [[2, 2], [0, 255]]])
    pred = torch.tensor([[[0, 1], [1, 0]], [[2, 0], [0, 2]]])
    logits = one_hot_logits(pred, 4)
    two = build_metrics("semseg", num_classes=4)
    two.update(logits[:1], gt[:1])
    two.update(logits[1:], gt[1:])
    one = build_metrics("semseg", num_classes=4)
    one.update(logits, gt)
    assert two.compute()["miou"] == pytest.approx(0.5)
    assert one.compute() == two.compute()


# [1, 1, 2, 3] depths in metres; gt 0 = invalid.
DEPTH_GT = torch.tensor([[[[0.0, 2.0, 4.0], [1.0, 0.0, 5.0]]]])
DEPTH_PRED = torch.tensor([[[[3.0, 2.2, 5.2], [0.0, 1.0, 4.5]]]])


def test_delta1_and_abs_rel_over_valid_pixels():
    """Valid pixels (gt > 0): 4 of 6; the two gt 0 pixels (preds 3.0 and 1.0) are skipped.
      gt 2, pred 2.2: ratio 1.1    < 1.25 yes   |2.2-2|/2 = 0.1
      gt 4, pred 5.2: ratio 1.3           no    1.2/4     = 0.3
      gt 1, pred 0 -> clamped to 1e-3: ratio 1000  no    0.999/1 = 0.999
      gt 5, pred 4.5: ratio 1.111  < 1.25 yes   0.5/5     = 0.1
    delta1 = 2/4 = 0.5; abs_rel = (0.1 + 0.3 + 0.999 + 0.1) / 4 = 0.37475; all finite."""
    metrics = build_metrics("depth")
    metrics.update(DEPTH_PRED, DEPTH_GT)
    result = metrics.compute()
    assert list(result) == ["delta1", "abs_rel"]
    assert result["delta1"] == pytest.approx(0.5)
    assert result["abs_rel"] == pytest.approx((0.1 + 0.3 + (1 - MIN_DEPTH) + 0.1) / 4, rel=1e-6)
    assert all(math.isfinite(v) for v in result.values())


def test_depth_is_pixel_weighted_and_accumulates():
    """Image A: 1 valid pixel, gt 2, pred -1 (clamped to 1e-3): abs_rel 1.999/2 = 0.9995, miss.
    Image B: 3 valid pixels (one gt 0 pixel skipped), all exact: abs_rel 0, hits.
    Over the 4 valid pixels: abs_rel = 0.9995 / 4 = 0.249875, delta1 = 3/4 = 0.75 (the mean of
    per-image values would be 0.49975 and 0.5). A batch with no valid pixel changes nothing."""
    gt = torch.tensor([[[[2.0, 0.0], [0.0, 0.0]]], [[[1.0, 3.0], [0.0, 4.0]]]])
    pred = torch.tensor([[[[-1.0, 5.0], [5.0, 5.0]]], [[[1.0, 3.0], [7.0, 4.0]]]])
    two = build_metrics("depth")
    two.update(pred[:1], gt[:1])
    two.update(pred[1:], gt[1:])
    two.update(torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))  # nothing valid
    one = build_metrics("depth")
    one.update(pred, gt)
    assert two.compute() == pytest.approx({"delta1": 0.75, "abs_rel": (2 - MIN_DEPTH) / 2 / 4})
    assert one.compute() == pytest.approx(two.compute(), rel=1e-12)


def test_classification_accumulates_over_updates():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.1, 0.2, 0.9], [0.0, 3.0, 1.0], [1.0, 2.0, 1.5]])
    labels = torch.tensor([0, 1, 1, 2])
    two = build_metrics("classification", num_classes=3)
    two.update(logits[:3], labels[:3])  # 2 of 3 right
    two.update(logits[3:], labels[3:])  # 0 of 1 right
    one = build_metrics("classification", num_classes=3)
    one.update(logits, labels)
    assert two.compute() == one.compute() == {"top1_accuracy": pytest.approx(0.5)}


# --- sharded over two ranks ------------------------------------------------------------------
WORLD = 2
SEG_CLASSES, CLS_CLASSES = 5, 6


def eval_items() -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Seeded (prediction, target) items per kind, identical in every process. Semseg: class 3
    occurs (in gt and predictions) only in item 3, which rank 1 evaluates; class 4 never."""
    g = torch.Generator().manual_seed(0)
    items: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"classification": [], "semseg": [], "depth": []}
    for _ in range(7):
        items["classification"].append(
            (torch.randn(2, CLS_CLASSES, generator=g), torch.randint(0, CLS_CLASSES, (2,), generator=g))
        )
    for i in range(5):
        gt = torch.randint(0, 3, (1, 4, 4), generator=g)
        pred = torch.randint(0, 3, (1, 4, 4), generator=g)
        gt[torch.rand(gt.shape, generator=g) < 0.2] = 255
        if i == 3:
            gt[0, 0, :2] = 3
            pred[0, 0, 1:3] = 3
        items["semseg"].append((one_hot_logits(pred, SEG_CLASSES), gt))
    for _ in range(5):
        gt = torch.rand(1, 1, 3, 3, generator=g) * 10
        gt[gt < 2] = 0  # invalid
        pred = gt * (0.7 + 0.6 * torch.rand(gt.shape, generator=g)) - 0.5  # some <= 0
        items["depth"].append((pred, gt))
    return items


def evaluate(ranks: range | list[int], world: int) -> dict[str, dict[str, float]]:
    """Update with the items ``rank, rank + world, ...`` of each rank in ``ranks`` (one item
    per update) and compute."""
    results = {}
    for kind, data in eval_items().items():
        metrics = build_metrics(kind, num_classes=SEG_CLASSES if kind == "semseg" else CLS_CLASSES)
        for rank in ranks:
            for prediction, target in data[rank::world]:
                metrics.update(prediction, target)
        results[kind] = metrics.compute()
    return results


def sharded_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = evaluate([rank], world)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def test_sharded_ranks_agree_with_the_unsharded_computation(tmp_path):
    mp.start_processes(
        sharded_worker, args=(WORLD, str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, start_method=start_method()
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0] == ranks[1]  # bitwise: the same gathered states, summed in the same order
    unsharded = evaluate(range(WORLD), WORLD)  # every item, in one process
    for kind, names in METRIC_NAMES.items():
        assert list(ranks[0][kind]) == list(names)
        assert ranks[0][kind] == pytest.approx(unsharded[kind], rel=1e-9)
    # The test can tell: rank 1's shard alone (class 3 present) gives another mIoU.
    assert evaluate([1], WORLD)["semseg"]["miou"] != pytest.approx(unsharded["semseg"]["miou"])
