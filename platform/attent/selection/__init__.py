"""AtteNT sample selection: pure selection functions, schedules, the teacher, and its sampler.

    teacher = Teacher(len(train_set), SelectionConfig(preset="vit"), total_epochs=E, seed=0)
    loader = DataLoader(train_set, sampler=SubsetSampler(teacher, rank, world_size), ...)
    for epoch in range(E):
        teacher.begin_epoch(epoch, score_fn)       # may score everything and re-select
        for batch in loader:
            losses = per_sample_loss(model, batch)  # FloatTensor[B]
            teacher.observe(batch["index"], losses)
            (losses * teacher.loss_weights[batch["index"]]).mean().backward()
        teacher.end_epoch()
"""
from .config import METHODS, PRESETS, IntervalConfig, RatioConfig, SelectionConfig
from .core import STRATEGIES, budget, select, weighted_sample
from .sampler import SubsetSampler, shard_indices
from .schedules import IntervalSchedule, RatioSchedule, cosine, fixed, incremental, progress_of
from .teacher import SelectionRecord, Teacher

__all__ = [
    "METHODS", "PRESETS", "STRATEGIES", "IntervalConfig", "IntervalSchedule", "RatioConfig",
    "RatioSchedule", "SelectionConfig", "SelectionRecord", "SubsetSampler", "Teacher", "budget",
    "cosine", "fixed", "incremental", "progress_of", "select", "shard_indices", "weighted_sample",
]
