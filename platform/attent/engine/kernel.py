"""Deprecated: the empirical ANTK and its drift are ``attent.tangent_kernel``."""

from __future__ import annotations

from ..selection.deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        name: f"attent.tangent_kernel.{name}"
        for name in (
            "Inputs",
            "per_sample_function",
            "jacobian_features",
            "empirical_kernel",
            "brute_force_kernel",
            "relative_distance",
            "alignment",
            "kernel_drift",
        )
    },
)
