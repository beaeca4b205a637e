"""What a run costs before it is paid for: its work in sample-epochs from the selection plan, its
model's FLOPs per sample counted on the meta device, and from them GPU-hours on a named
accelerator at a stated or measured utilisation (``attent plan``). Torch and the tasks only: no
Ray, no MLflow."""
