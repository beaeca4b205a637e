"""``python -m attent.lab experiments/theory_teaching.yaml [key.path=value ...] [--out DIR]``:
the gradient check and the teaching experiment, into MLflow (and DIR, if given)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attent.lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="theory YAML, e.g. experiments/theory_teaching.yaml")
    parser.add_argument("overrides", nargs="*", help="key.path=value, e.g. teach.lr=0.25 seeds=[0]")
    parser.add_argument("--out", default=None, help="also write summary.md, summary.json, figures/ here")
    args = parser.parse_args(argv)
    return run_cli(args.config, args.overrides, out=args.out)


def run_cli(config: str, overrides: list[str], out: str | None = None) -> int:
    from ..engine.preflight import check_theory
    from ..experiment.schema import ConfigError, PreflightError
    from ..theory.config import load

    try:
        cfg = load(config, overrides).resolved()  # the store: as an experiment's
        check_theory(cfg)  # before the first run, as an experiment's preflight
    except (ConfigError, PreflightError) as exc:
        print(f"attent theory: error: {exc}", file=sys.stderr)
        return 2
    from .experiment import run_experiment

    result = run_experiment(cfg, out=out)
    print("\n" + result.markdown)
    print(
        f"MLflow parent run {result.run_id} in {result.tracking_uri} (experiment {cfg.mlflow.experiment!r})"
        + (f"; summary and figures in {out}/" if out else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
