"""Extract the openAPIV3Schema of KubeRay's RayCluster and RayJob CRDs into this folder, as JSON
(kubeconform's naming: <kind>_<version>.json), from a KubeRay checkout at the release README.md names:

    git clone --branch v1.7.0 https://github.com/ray-project/kuberay /tmp/kuberay
    python deploy/kubernetes/schemas/extract.py /tmp/kuberay

The schemas are written as they are in the CRDs (KubeRay generates them without descriptions), keys
sorted, so that a re-extraction from the same release changes no byte."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CRDS = {"raycluster": "ray.io_rayclusters.yaml", "rayjob": "ray.io_rayjobs.yaml"}


def extract(kuberay: Path) -> None:
    for kind, name in CRDS.items():
        crd = yaml.safe_load((kuberay / "ray-operator" / "config" / "crd" / "bases" / name).read_text())
        for version in crd["spec"]["versions"]:
            if version["name"] != "v1":  # the API the manifests use (ray.io/v1), the storage version
                continue
            schema = version["schema"]["openAPIV3Schema"]
            out = HERE / f"{kind}_{version['name']}.json"
            out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
            print(f"{out.name}: {crd['spec']['group']}/{version['name']} {crd['spec']['names']['kind']}")


if __name__ == "__main__":
    extract(Path(sys.argv[1]))
