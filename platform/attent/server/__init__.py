"""`attent server`: the MLflow tracking server every trial, worker and machine logs through. ``app``:
the server's command line, start, readiness and stop; ``auth``: its users' secrets (MLflow's basic-auth
app); ``users``: `attent server users add` and `attent server grant`."""
