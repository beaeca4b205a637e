"""Sweeps: a grid of selection settings x seeds over one base experiment. ``spec``: the sweep file, its
trials and their launch order (no Ray); ``tune``: running it on Ray Tune (`attent sweep`)."""
