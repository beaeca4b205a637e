"""Masked autoencoders (MAE, Multi-Modal MAE) with AtteNT: pretraining tasks, their data and downstream jobs."""
