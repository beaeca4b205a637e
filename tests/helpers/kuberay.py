"""Offline validation of Kubernetes manifests: KubeRay's RayCluster and RayJob against the
openAPIV3Schema of the pinned release's CRDs (deploy/kubernetes/schemas/, KubeRay v1.7.0), unknown
fields refused as `kubeconform -strict` refuses them (every object schema with properties and no
``additionalProperties`` or ``x-kubernetes-preserve-unknown-fields`` closed; a required field with a
default filled in as the API server does), then the cross-field rules
KubeRay's operator applies that a schema cannot say (ray-operator/controllers/ray/utils/validation.go:
ValidateRayClusterSpec, ValidateRayJobSpec, the metadata's names), and the structure of the plain
objects the deployment ships: Namespace, PersistentVolumeClaim, Deployment, Service.

The plain objects are checked against the Kubernetes schemas the RayCluster CRD embeds (KubeRay
generates them from k8s.io/api): a Deployment's pod template against the head group's PodTemplateSpec,
a claim's spec against the ephemeral volume's PersistentVolumeClaimSpec, a Service against the head
group's ``headService``; the fields of a Deployment's own spec (replicas, selector, strategy, ...) by a
schema written here. Then what no schema says: every volume mount names a volume of its pod, a
Deployment's selector matches its pods, a claim's access modes and size. Not checked: the CEL rules
(``x-kubernetes-validations``) beyond those re-implemented here, the full Kubernetes OpenAPI, formats.

    problems(document) -> ["spec.workerGroupSpecs[0].replicaz: unknown field", ...]   # [] when valid
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

import jsonschema
import yaml

from tests.helpers.paths import REPO

SCHEMAS = REPO / "deploy" / "kubernetes" / "schemas"
RELEASE = "v1.7.0"
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_RAYCLUSTER_NAME, MAX_RAYJOB_NAME = 53, 47  # KubeRay's MaxRayClusterNameLength, MaxRayJobNameLength
TOKEN_AUTH_MIN_RAY = (2, 52, 0)  # validation.go: authOptions.mode token needs Ray 2.52.0 or later
ACCESS_MODES = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def strict(schema):
    """``schema`` with every object that lists properties closed to others (kubeconform -strict), and a
    required field that has a default no longer required (the API server fills defaults in first)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        defaults = {name for name, field in schema.get("properties", {}).items() if "default" in field}
        if defaults & set(schema.get("required", [])):
            schema["required"] = [name for name in schema["required"] if name not in defaults]
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


# ObjectMeta, as much of it as a manifest writes (the CRDs say only ``type: object``)
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}


@functools.cache
def crd_schema(kind: str) -> dict:
    schema = strict(json.loads((SCHEMAS / f"{kind.lower()}_v1.json").read_text()))
    schema["properties"]["metadata"] = METADATA
    schema["properties"]["apiVersion"] = {"enum": ["ray.io/v1"]}
    schema["properties"]["kind"] = {"enum": [kind]}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["properties"].pop("status", None)  # the operator's, never a manifest's
    return schema


@functools.cache
def embedded() -> dict[str, dict]:
    """The Kubernetes schemas inside the RayCluster CRD."""
    head = crd_schema("RayCluster")["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]
    pod = head["template"]
    affinity = pod["properties"]["spec"]["properties"]["affinity"]["properties"]["podAffinity"]["properties"]
    volume = pod["properties"]["spec"]["properties"]["volumes"]["items"]["properties"]
    return {
        "pod_template": pod,
        "label_selector": affinity["requiredDuringSchedulingIgnoredDuringExecution"]["items"]["properties"][
            "labelSelector"
        ],
        "pvc_spec": volume["ephemeral"]["properties"]["volumeClaimTemplate"]["properties"]["spec"],
        "service": head["headService"],
    }


def object_schema(api_version: str, kind: str, spec: dict | None, *, spec_required: bool = True) -> dict:
    properties = {"apiVersion": {"enum": [api_version]}, "kind": {"enum": [kind]}, "metadata": METADATA}
    if spec is not None:
        properties["spec"] = spec
    required = ["apiVersion", "kind", "metadata", *(["spec"] if spec is not None and spec_required else [])]
    return {"type": "object", "required": required, "additionalProperties": False, "properties": properties}


def integer(minimum: int = 0) -> dict:
    return {"type": "integer", "minimum": minimum}


@functools.cache
def plain_schemas() -> dict[str, dict]:
    parts = embedded()
    deployment_spec = {
        "type": "object",
        "required": ["selector", "template"],
        "additionalProperties": False,
        "properties": {
            "replicas": integer(),
            "minReadySeconds": integer(),
            "paused": {"type": "boolean"},
            "progressDeadlineSeconds": integer(1),
            "revisionHistoryLimit": integer(),
            "selector": parts["label_selector"],
            "strategy": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["Recreate", "RollingUpdate"]},
                    "rollingUpdate": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"maxSurge": {"type": ["integer", "string"]}, "maxUnavailable": {}},
                    },
                },
            },
            "template": parts["pod_template"],
        },
    }
    service = copy.deepcopy(parts["service"])
    service["properties"].pop("status", None)
    service["properties"].update(apiVersion={"enum": ["v1"]}, kind={"enum": ["Service"]}, metadata=METADATA)
    service["required"] = ["apiVersion", "kind", "metadata", "spec"]
    namespace = {"type": "object", "additionalProperties": False, "properties": {"finalizers": {"type": "array"}}}
    job_fields = {"backoffLimit": integer(), "ttlSecondsAfterFinished": integer(), "activeDeadlineSeconds": integer(1)}
    job_properties = {**job_fields, "template": parts["pod_template"]}  # batch/v1 JobSpec, the fields we write
    job_spec = {"type": "object", "required": ["template"], "additionalProperties": False, "properties": job_properties}
    return {
        "Job": object_schema("batch/v1", "Job", job_spec),
        "Namespace": object_schema("v1", "Namespace", namespace, spec_required=False),
        "PersistentVolumeClaim": object_schema("v1", "PersistentVolumeClaim", parts["pvc_spec"]),
        "Deployment": object_schema("apps/v1", "Deployment", deployment_spec),
        "Service": service,
    }


def dotted(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the document)"


def schema_problems(document: dict, schema: dict) -> list[str]:
    """Each schema error as ``field.path: what``: an unknown field and a missing one by name."""
    found = []
    for error in jsonschema.Draft4Validator(schema).iter_errors(document):
        path = list(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - known):
                found.append(f"{dotted([*path, key])}: unknown field (not in the pinned KubeRay {RELEASE} schema)")
        elif error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            found.append(f"{dotted([*path, missing])}: required field missing")
        else:
            found.append(f"{dotted(path)}: {error.message}")
    return sorted(set(found))


def problems(document: dict) -> list[str]:
    """Everything wrong with one manifest ([] when it would be accepted)."""
    kind = document.get("kind")
    if kind in ("RayCluster", "RayJob"):
        found = schema_problems(document, crd_schema(kind))
        if not found:
            found = metadata_rules(document) + (
                rayjob_rules(document["spec"]) if kind == "RayJob" else raycluster_rules(document["spec"], "spec")
            )
        return found
    if kind in plain_schemas():
        return schema_problems(document, plain_schemas()[kind]) or plain_rules(document)
    return [f"kind: {kind!r} is none of RayCluster, RayJob, {', '.join(plain_schemas())}"]


def metadata_rules(document: dict) -> list[str]:
    name, limit = document["metadata"]["name"], MAX_RAYJOB_NAME if document["kind"] == "RayJob" else MAX_RAYCLUSTER_NAME
    found = [] if DNS_1035.fullmatch(name) else [f"metadata.name: {name!r} is no DNS-1035 label"]
    return found + ([f"metadata.name: {name!r} is over {limit} characters"] if len(name) > limit else [])


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def raycluster_rules(spec: dict, at: str) -> list[str]:
    """ValidateRayClusterSpec's rules that concern a manifest (feature gates assumed off)."""
    found = []
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    groups = [("headGroupSpec", spec["headGroupSpec"])] + [
        (f"workerGroupSpecs[{i}]", group) for i, group in enumerate(spec.get("workerGroupSpecs", []))
    ]
    for where, group in groups:
        if not group["template"].get("spec", {}).get("containers"):
            found.append(f"{at}.{where}.template.spec.containers: a Ray group needs at least one container")
        params = group.get("rayStartParams", {})
        if group.get("resources") and {"num-cpus", "num-gpus", "memory", "resources"} & set(params):
            found.append(f"{at}.{where}.resources: set in rayStartParams too; use only one")
        if "labels" in params:
            found.append(f"{at}.{where}.rayStartParams.labels: not supported; use the group's labels field")
        if where == "headGroupSpec":
            continue
        low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)  # the CRD's defaults
        if low > high:
            found.append(f"{at}.{where}.minReplicas: {low} is greater than maxReplicas {high}")
        if group.get("idleTimeoutSeconds") is not None and spec.get("autoscalerOptions", {}).get("version") != "v2":
            found.append(f"{at}.{where}.idleTimeoutSeconds: needs autoscalerOptions.version v2")
        if group.get("suspend") and autoscaling:
            found.append(f"{at}.{where}.suspend: a worker group cannot be suspended with the autoscaler on")
    auth = spec.get("authOptions") or {}
    if auth.get("mode", "disabled") == "token":
        if not spec.get("rayVersion"):
            found.append(f"{at}.rayVersion: required with authOptions.mode token (Ray 2.52.0 or later)")
        elif version(spec["rayVersion"]) < TOKEN_AUTH_MIN_RAY:
            found.append(
                f"{at}.rayVersion: {spec['rayVersion']} is below 2.52.0, the least authOptions.mode token needs"
            )
    elif auth.get("enableK8sTokenAuth"):
        found.append(f"{at}.authOptions.enableK8sTokenAuth: needs authOptions.mode token")
    if auth.get("enableK8sTokenAuth") and auth.get("secretName"):
        found.append(f"{at}.authOptions.secretName: not with enableK8sTokenAuth")
    if spec.get("autoscalerOptions", {}).get("idleTimeoutSeconds", 0) < 0:
        found.append(f"{at}.autoscalerOptions.idleTimeoutSeconds: must be non-negative")
    for key in ("networkPolicy", "tlsOptions", "historyServerOptions"):
        if key in spec:
            found.append(f"{at}.{key}: needs a KubeRay feature gate that is off by default")
    for where, group in groups:
        found += pod_rules(group["template"].get("spec", {}), f"{at}.{where}.template.spec")
    return found


def rayjob_rules(spec: dict) -> list[str]:
    """ValidateRayJobSpec's rules (feature gates off), then the embedded cluster's."""
    found = []
    shutdown, selector = spec.get("shutdownAfterJobFinishes", False), spec.get("clusterSelector") or {}
    if spec.get("suspend") and not shutdown:
        found.append("spec.suspend: a RayJob can be suspended only with shutdownAfterJobFinishes: true")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        found.append("spec.ttlSecondsAfterFinished: must be non-negative")
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not shutdown:
        found.append(
            "spec.ttlSecondsAfterFinished: needs shutdownAfterJobFinishes: true (nothing is deleted without it)"
        )
    if "deletionStrategy" in spec:
        found += deletion_rules(spec)
    if "rayClusterSpec" not in spec and not selector:
        found.append("spec.rayClusterSpec: one of rayClusterSpec or clusterSelector is needed")
    if selector:
        if not selector.get("ray.io/cluster"):
            found.append("spec.clusterSelector: names no cluster (ray.io/cluster)")
        if spec.get("submissionMode") == "SidecarMode":
            found.append("spec.clusterSelector: not supported in SidecarMode")
        if spec.get("backoffLimit", 0) > 0:
            found.append("spec.backoffLimit: incompatible with clusterSelector")
        if spec.get("suspend"):
            found.append("spec.suspend: not supported with clusterSelector")
    if spec.get("submissionMode") == "InteractiveMode" and spec.get("backoffLimit", 0) > 0:
        found.append("spec.backoffLimit: incompatible with InteractiveMode")
    if spec.get("submissionMode") == "SidecarMode" and {"submitterPodTemplate", "submitterConfig"} & set(spec):
        found.append("spec.submitterPodTemplate: SidecarMode takes no submitter")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if key in spec and spec[key] <= 0:
            found.append(f"spec.{key}: must be positive")
    try:
        yaml.safe_load(spec.get("runtimeEnvYAML", "") or "")
    except yaml.YAMLError as error:
        found.append(f"spec.runtimeEnvYAML: not valid YAML ({' '.join(str(error).split())})")
    cluster = spec.get("rayClusterSpec")
    if cluster:
        if (cluster.get("authOptions") or {}).get("enableK8sTokenAuth"):
            found.append("spec.rayClusterSpec.authOptions.enableK8sTokenAuth: not supported for a RayJob")
        found += raycluster_rules(cluster, "spec.rayClusterSpec")
    return found


DELETION_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")  # TTLs must not decrease along it


def deletion_rules(spec: dict) -> list[str]:
    """validateDeletionConfiguration: legacy onSuccess/onFailure, or deletionRules, never both."""
    strategy, at = spec["deletionStrategy"], "spec.deletionStrategy"
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    autoscaling = bool((spec.get("rayClusterSpec") or {}).get("enableInTreeAutoscaling"))
    legacy, rules = {"onSuccess", "onFailure"} & set(strategy), strategy.get("deletionRules") or []
    if rules and shutdown:
        return [f"{at}.deletionRules: not with shutdownAfterJobFinishes: true"]
    if rules and legacy:
        return [f"{at}.deletionRules: not with onSuccess/onFailure"]
    if not rules and len(legacy) < 2:
        return [f"{at}: needs both onSuccess and onFailure, or deletionRules"]
    found = []
    if legacy:
        policies = {key: strategy[key].get("policy") for key in ("onSuccess", "onFailure")}
        found += [f"{at}.{key}.policy: required field missing" for key, policy in policies.items() if policy is None]
        if autoscaling and "DeleteWorkers" in policies.values():
            found.append(f"{at}: DeleteWorkers does not work with the autoscaler on")
        if shutdown and "DeleteNone" in policies.values():
            found.append(f"{at}: DeleteNone contradicts shutdownAfterJobFinishes: true")
        return found
    ttls: dict[tuple[str, str], dict[str, int]] = {}
    for i, rule in enumerate(rules):
        condition = rule.get("condition", {})
        keys = {"jobStatus", "jobDeploymentStatus"} & set(condition)
        if len(keys) != 1:
            found.append(f"{at}.deletionRules[{i}].condition: exactly one of jobStatus, jobDeploymentStatus")
            continue
        if autoscaling and rule.get("policy") == "DeleteWorkers":
            found.append(f"{at}.deletionRules[{i}].policy: DeleteWorkers does not work with the autoscaler on")
        key = keys.pop()
        seen = ttls.setdefault((key, condition[key]), {})
        if rule.get("policy") in seen:
            found.append(f"{at}.deletionRules[{i}]: a second rule for {rule.get('policy')} on {key} {condition[key]}")
        seen[rule.get("policy")] = condition.get("ttlSeconds", 0)
    for (key, value), by_policy in ttls.items():
        ordered = [by_policy[p] for p in DELETION_ORDER if p in by_policy]
        if ordered != sorted(ordered):
            found.append(
                f"{at}.deletionRules: on {key} {value}, TTLs must be DeleteWorkers <= DeleteCluster <= DeleteSelf"
            )
    return found


def pod_rules(pod: dict, at: str) -> list[str]:
    """What the pod schema cannot say: every mount names a volume of the pod, names are unique."""
    found, volumes = [], [volume["name"] for volume in pod.get("volumes", [])]
    if len(set(volumes)) != len(volumes):
        found.append(f"{at}.volumes: a name is used twice")
    for part in ("initContainers", "containers"):
        names = [c["name"] for c in pod.get(part, [])]
        if len(set(names)) != len(names):
            found.append(f"{at}.{part}: a name is used twice")
        for i, container in enumerate(pod.get(part, [])):
            for j, mount in enumerate(container.get("volumeMounts", [])):
                if mount["name"] not in volumes:
                    found.append(f"{at}.{part}[{i}].volumeMounts[{j}].name: {mount['name']!r} is no volume of the pod")
            env = [e["name"] for e in container.get("env", [])]
            if len(set(env)) != len(env):
                found.append(f"{at}.{part}[{i}].env: a variable is set twice")
    return found


def plain_rules(document: dict) -> list[str]:
    kind, name = document["kind"], document["metadata"]["name"]
    rule = DNS_1035 if kind == "Service" else DNS_1123_SUBDOMAIN
    found = [] if rule.fullmatch(name) else [f"metadata.name: {name!r} is no valid {kind} name"]
    spec = document.get("spec", {})
    if kind == "Deployment":
        labels = spec["template"].get("metadata", {}).get("labels", {})
        wanted = spec["selector"].get("matchLabels", {})
        if not wanted or any(labels.get(key) != value for key, value in wanted.items()):
            found.append("spec.selector.matchLabels: do not select the pod template's labels")
        found += pod_rules(spec["template"].get("spec", {}), "spec.template.spec")
    if kind == "Job":
        restart = spec["template"].get("spec", {}).get("restartPolicy")
        if restart not in ("Never", "OnFailure"):  # the API server's rule for a Job's pods
            found.append(f"spec.template.spec.restartPolicy: {restart!r} (a Job's pods: Never or OnFailure)")
        found += pod_rules(spec["template"].get("spec", {}), "spec.template.spec")
    if kind == "PersistentVolumeClaim":
        modes = spec.get("accessModes", [])
        if not modes or set(modes) - ACCESS_MODES:
            found.append(f"spec.accessModes: {modes} (give some of {sorted(ACCESS_MODES)})")
        if "storage" not in spec.get("resources", {}).get("requests", {}):
            found.append("spec.resources.requests.storage: required field missing")
    if kind == "Service" and not spec.get("ports"):
        found.append("spec.ports: required field missing")
    return found
