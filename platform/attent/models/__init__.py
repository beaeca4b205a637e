"""Model factories for the platform's workloads."""
