"""`attent kuberay`'s command line: a RayJob or RayCluster (``attent.cli.kuberay``), the shared
documents or a data Job (``attent.cli.kuberay_shared``), written with the line that writes them again."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from .kuberay import CREDENTIALS_SECRET, NAMESPACE, PodSettings, manifest, parse_env


def header(argv: list[str]) -> str:
    command = shlex.join(["attent", "kuberay", *argv])
    return (
        f"# {command}\n# Written by `attent kuberay` (docs/guides/kubernetes.md): regenerate it, rather than edit it.\n"
    )


def to_yaml(document: dict) -> str:
    import yaml

    return yaml.safe_dump(document, sort_keys=False, width=120)


def add_kuberay_command(sub) -> None:
    p = sub.add_parser(
        "kuberay",
        help="the KubeRay RayJob (or --cluster: RayCluster) of an experiment or sweep, sized from its ray: section",
    )
    p.add_argument(
        "config", nargs="?", help="experiment or sweep YAML of a checkout, e.g. experiments/multimae_gpu.yaml"
    )
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, passed on to the job's `attent` command")
    p.add_argument("--image", default=None, help="the image deploy/kubernetes/Dockerfile built at the pinned commit")
    p.add_argument("--cluster", action="store_true", help="a RayCluster (autoscaled from zero pods), not a RayJob")
    p.add_argument(
        "--shared",
        action="store_true",
        help="no FILE: deploy/kubernetes/'s namespace, shared volume and tracking server in --namespace",
    )
    p.add_argument("--storage-class", default=None, help="--shared: the shared volume's ReadWriteMany class")
    p.add_argument(
        "--data-job", action="store_true", help="a Job filling the shared volume as the pods' user: `attent data cache`"
    )
    p.add_argument("--data-command", default=None, help="--data-job: a shell command to run first (a download)")
    p.add_argument("--name", default=None, help="default: the experiment's or sweep's name (RayCluster: attent)")
    p.add_argument("--namespace", default=NAMESPACE, help="every document's (default attent)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE in every pod's environment (repeatable)")
    p.add_argument(
        "--env-secret", action="append", default=[], help="a Secret whose keys every pod gets as variables (HF_TOKEN)"
    )
    p.add_argument("--queue", default=None, help="the Kueue LocalQueue that admits the job or cluster whole")
    p.add_argument("--workers-per-pod", type=int, default=1, help="Ray Train workers per pod (8: one 8-GPU node's)")
    p.add_argument("--max-pods", type=int, default=None, help="--cluster: the most worker pods (default: one run's)")
    p.add_argument("--memory-per-cpu", default="4Gi", help="pod memory per CPU (default 4Gi)")
    p.add_argument(
        "--credentials-secret",
        default=CREDENTIALS_SECRET,
        help=f"the Secret holding the MLflow user's credentials file, key credentials (default {CREDENTIALS_SECRET})",
    )
    p.add_argument("--out", default=None, help="write the manifest here (default: print it)")


def cmd_kuberay(args) -> int:
    from . import kuberay_shared

    pods = PodSettings(args.namespace, args.credentials_secret, parse_env(args.env), tuple(args.env_secret))
    if args.shared:
        if args.config:
            raise ValueError("--shared writes the documents every run shares: give no FILE with it")
        documents = kuberay_shared.shared_documents(args.namespace, args.image, args.storage_class)
    elif not args.config:
        raise ValueError("give an experiment or sweep file (or --shared)")
    elif not args.image:
        raise ValueError("--image: give the image deploy/kubernetes/Dockerfile built (registry/attent:tag)")
    elif args.data_job:
        documents = [
            kuberay_shared.data_job(args.config, args.overrides, image=args.image, pods=pods, command=args.data_command)
        ]
    else:
        documents = [
            manifest(
                args.config,
                args.overrides,
                image=args.image,
                cluster=args.cluster,
                name=args.name,
                pods=pods,
                workers_per_pod=args.workers_per_pod,
                max_pods=args.max_pods,
                memory_per_cpu=args.memory_per_cpu,
                queue=args.queue,
            )
        ]
    text = header(command_line(args)) + "---\n".join(to_yaml(document) for document in documents)
    if args.out:
        Path(args.out).write_text(text)
        kinds = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in documents)
        print(f"wrote {args.out} ({kinds})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def command_line(args) -> list[str]:
    """The arguments that write this manifest again, for its header: those away from their defaults."""
    argv = [*([args.config] if args.config else []), *args.overrides]
    argv += ["--image", args.image] if args.image else []
    argv += [f"--{flag.replace('_', '-')}" for flag in ("cluster", "shared", "data_job") if getattr(args, flag)]
    defaults = {
        "name": None,
        "namespace": NAMESPACE,
        "storage_class": None,
        "data_command": None,
        "queue": None,
        "workers_per_pod": 1,
        "max_pods": None,
        "memory_per_cpu": "4Gi",
        "credentials_secret": CREDENTIALS_SECRET,
    }
    argv += [
        f"--{key.replace('_', '-')}={getattr(args, key)}"
        for key, value in defaults.items()
        if getattr(args, key) != value
    ]
    argv += [f"--env={pair}" for pair in args.env] + [f"--env-secret={name}" for name in args.env_secret]
    return argv
