"""Datasets for the platform's workloads."""
