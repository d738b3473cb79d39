"""docker/compose.yaml: a whole network whose every ``p2prl`` command exists and whose parts fit together.

Without a Docker engine the services cannot start here, so the test checks what would break them:
commands and options the CLI does not have, node settings the node would refuse, keys written in
one place and read from another, a genesis that names another bootstrap host or bucket than the
ones the file sets up, unpinned images, ports open beyond the host. The one-shot init script is
also run for real, in a temporary directory standing in for its volumes.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from dockerfile_parse import image_env as dockerfile_image_env

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"


def _load_cli_check() -> Any:
    spec = importlib.util.spec_from_file_location(
        "p2prl_tests_cli_check", ROOT / "tests" / "docs" / "cli_check.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


cli_check = _load_cli_check()

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$\$")


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Compose's variable interpolation with an empty environment (defaults apply); ``$$`` is ``$``."""
    env = env or {}
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, op, arg = m.group(1), m.group(2), m.group(3)
            if name in env and (env[name] or op not in (":-", ":?")):
                return env[name]
            if op in (":?", "?"):
                raise AssertionError(f"compose needs ${name}: {arg}")
            return arg or ""

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE.read_text()))


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def is_p2prl_image(svc: dict[str, Any]) -> bool:
    build = svc.get("build")
    return isinstance(build, dict) and build.get("dockerfile", "").startswith("docker/Dockerfile")


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def image_env() -> dict[str, str]:
    return dockerfile_image_env(ROOT / "docker" / "Dockerfile")


def shell_commands(script: str) -> list[list[str]]:
    """Simple commands of a shell script, including those inside ``$( ... )``."""
    script = re.sub(r"\\\n", " ", script)
    lines: list[str] = []
    for line in script.splitlines():
        rest, subs = cli_check.substitutions(line)
        lines += [*subs, rest]
    out: list[list[str]] = []
    for line in lines:
        for seg in cli_check.split_segments(line):
            while seg and seg[0] in ("if", "then", "else", "do", "!", "fi", "done"):
                seg = seg[1:]
            if seg:
                out.append(seg)
    return out


def p2prl_commands(name: str, svc: dict[str, Any]) -> list[list[str]]:
    """Every p2prl argv a service runs (command, shell script, healthcheck)."""
    found: list[list[str]] = []
    entry = svc.get("entrypoint")
    command = svc.get("command")
    if is_p2prl_image(svc) and entry is None and command is not None:
        found.append(list(command) if isinstance(command, list) else command.split())
    elif entry and entry[0] in ("/bin/sh", "sh", "/bin/bash", "bash"):
        for script in command if isinstance(command, list) else [command]:
            for seg in shell_commands(script):
                argv = cli_check.p2prl_argv(seg)
                if argv is not None:
                    found.append(argv)
    test = (svc.get("healthcheck") or {}).get("test")
    if test and test[0] == "CMD" and test[1] == "p2prl":
        found.append(test[2:])
    return found


ROLES = {"trainer": 1, "validator": 1, "miner": 2}


def node_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        n: s
        for n, s in services(compose).items()
        if is_p2prl_image(s) and isinstance(s.get("command"), list) and s["command"][:1] == ["node"]
    }


def node_config(svc: dict[str, Any]) -> Any:
    """The NodeConfig the node would load: image ENV < service environment < flags."""
    from p2prl.node.setup.config import ENV_PREFIX, load_config

    resolved = cli_check.resolve(svc["command"])
    env = {**image_env(), **env_of(svc)}
    for name, value in resolved.options.items():
        if name == "config" or value is None:
            continue
        env[ENV_PREFIX + name.upper()] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
    return load_config(env=env, overrides={})


SCHEMA = Path(__file__).with_name("compose-spec.schema.json")


def test_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    """The Compose Specification's JSON schema (compose-spec, Apache-2.0; as shipped by the dclint
    package) accepts the file: no misspelt key, wrong type or unknown depends_on condition."""
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema comes with the test extra (via moto[server])"
    )
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)
    broken = {
        **compose,
        "services": {**compose["services"], "trainer": {**compose["services"]["trainer"], "helthcheck": {}}},
    }
    assert list(validator.iter_errors(broken)), "the schema check can fail"


def test_services_and_roles(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    assert {"s3", "bucket", "init"} <= set(svcs)
    roles: dict[str, int] = {}
    for svc in node_services(compose).values():
        cfg = node_config(svc)
        roles[cfg.role] = roles.get(cfg.role, 0) + 1
    assert roles == ROLES


def test_every_p2prl_command_exists(compose: dict[str, Any]) -> None:
    seen = 0
    for name, svc in services(compose).items():
        for argv in p2prl_commands(name, svc):
            try:
                cli_check.resolve(argv, env={**image_env(), **env_of(svc)})
            except cli_check.CliMismatch as e:
                pytest.fail(f"service {name}: p2prl {' '.join(argv)}: {e}")
            seen += 1
    # node x4, dashboard, and the init script's keys generate x2, keys show, network init, network show
    assert seen >= 10


def test_checker_rejects_a_wrong_command() -> None:
    """The command check above can fail: a removed option, an unknown role, a missing subcommand."""
    with pytest.raises(cli_check.CliMismatch):
        cli_check.resolve(["node", "--role", "trainer", "--no-such-flag"])
    with pytest.raises(cli_check.CliMismatch):
        cli_check.resolve(["network", "start"])
    with pytest.raises(cli_check.CliMismatch):
        cli_check.resolve(["keys", "generate", "--out"])


def test_node_settings_are_accepted(compose: dict[str, Any]) -> None:
    for name, svc in node_services(compose).items():
        cfg = node_config(svc)
        assert cfg.status_port > 0, f"{name}: the healthcheck needs a fixed status port"
        assert cfg.status_host == "0.0.0.0", f"{name}: status must be reachable from the dashboard service"
        # the genesis the node reads is the one init writes, on a volume mounted read-only here
        assert str(cfg.network) == "/genesis/genesis.json"
        assert f"genesis:{PurePosixPath(cfg.network).parent}:ro" in svc["volumes"]
        # the healthcheck probes the node's health listener, from the port file in its data directory
        probe = " ".join(svc["healthcheck"]["test"])
        assert "'P2PRL_DATA_DIR'" in probe and "'health.port'" in probe and "/healthz" in probe
        assert str(cfg.data_dir) == "/data"
        assert any(p.endswith(f":{cfg.status_port}") and p.startswith("127.0.0.1:") for p in svc["ports"])


def test_no_misspelt_settings(compose: dict[str, Any]) -> None:
    """The node ignores P2PRL_ variables it does not know, so a typo would silently do nothing: none here."""
    from p2prl.node.setup.config import ENV_PREFIX, FIELDS

    known = {ENV_PREFIX + n.upper() for n in FIELDS} | {"P2PRL_CONFIG", "P2PRL_LOG_LEVEL"}
    for name, svc in node_services(compose).items():
        unknown = sorted(
            k for k in {**image_env(), **env_of(svc)} if k.startswith(ENV_PREFIX) and k not in known
        )
        assert not unknown, f"{name}: unknown settings {unknown}"


def _init_script(compose: dict[str, Any]) -> str:
    return "\n".join(services(compose)["init"]["command"])


def _mounts(svc: dict[str, Any]) -> dict[str, str]:
    """container path -> volume name."""
    out = {}
    for v in svc.get("volumes", []):
        vol, path = v.split(":")[:2]
        out[path] = vol
    return out


def test_keys_written_by_init_are_the_nodes_keys(compose: dict[str, Any]) -> None:
    """The trainer and validator keys init creates land, via the named volumes, at each node's key file."""
    svcs = services(compose)
    init_mounts = _mounts(svcs["init"])
    script = _init_script(compose)
    generated = set()
    for seg in shell_commands(script):
        argv = cli_check.p2prl_argv(seg)
        if argv and argv[:2] == ["keys", "generate"]:
            generated.add(cli_check.resolve(argv).options["path"])
    network_init = [
        cli_check.resolve(a)
        for a in (cli_check.p2prl_argv(s) for s in shell_commands(script))
        if a and a[:2] == ["network", "init"]
    ]
    assert len(network_init) == 1
    init_opts = network_init[0].options
    for name, svc in node_services(compose).items():
        cfg = node_config(svc)
        if cfg.role == "miner":
            continue  # miners create their own identity on first start
        key_dir = str(PurePosixPath(cfg.key_path).parent)
        volume = _mounts(svc)[key_dir]
        init_dir = next(p for p, v in init_mounts.items() if v == volume)
        init_key = f"{init_dir}/{PurePosixPath(cfg.key_path).name}"
        assert init_key in generated, f"{name}: init does not create {init_key}"
        if cfg.role == "trainer":
            assert init_opts["key"] == init_key, "genesis must be signed by the trainer's own key"
        else:
            assert init_key in init_opts["validators"], f"{name}: genesis does not list this validator"


def test_genesis_points_at_the_compose_services(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    script = _init_script(compose)
    argv = next(
        a
        for a in (cli_check.p2prl_argv(s) for s in shell_commands(script))
        if a and a[:2] == ["network", "init"]
    )
    opts = cli_check.resolve(argv).options
    init_env = env_of(svcs["init"])
    trainer = next(s for s in node_services(compose).values() if node_config(s).role == "trainer")
    listen_port = node_config(trainer).listen.rsplit("/", 1)[-1]
    trainer_name = next(n for n, s in node_services(compose).items() if s is trainer)
    (boot,) = opts["bootstrap"]
    # py-libp2p resolves /dns4 names with its own DNS queries, so the trainer gets a fixed address
    ip = trainer["networks"]["p2prl"]["ipv4_address"]
    subnet = compose["networks"]["p2prl"]["ipam"]["config"][0]["subnet"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(subnet)
    assert init_env["TRAINER_IP"] == ip
    assert boot.replace("$TRAINER_IP", ip).startswith(f"/ip4/{ip}/tcp/{listen_port}/p2p/")
    assert trainer_name == "trainer"
    s3_port = services(compose)["s3"]["command"][services(compose)["s3"]["command"].index("--port") + 1]
    assert opts["s3_endpoint"] == f"http://s3:{s3_port}"
    assert env_of(svcs["bucket"])["S3_ENDPOINT"] == opts["s3_endpoint"]
    bucket = opts["s3_bucket"].replace("$BUCKET", init_env["BUCKET"])
    assert bucket == env_of(svcs["bucket"])["BUCKET"]
    assert opts["out"] == "/genesis/genesis.json"


def test_shell_scripts_parse(compose: dict[str, Any]) -> None:
    """The one-shot services' scripts are valid POSIX sh (after compose turns `$$` into `$`)."""
    scripts = 0
    for name, svc in services(compose).items():
        entry = svc.get("entrypoint") or []
        if entry[:1] and entry[0].endswith("sh"):
            for script in svc["command"]:
                proc = subprocess.run(
                    ["/bin/sh", "-n", "-c", script], capture_output=True, text=True, timeout=10
                )
                assert proc.returncode == 0, f"{name}: {proc.stderr}"
                scripts += 1
    assert scripts >= 1
    broken = subprocess.run(["/bin/sh", "-n", "-c", "if true; then echo"], capture_output=True, timeout=10)
    assert broken.returncode != 0


def test_base_model_built_once_and_shared(compose: dict[str, Any]) -> None:
    """init builds the base model into a volume; every node reads that volume at its model cache, read-only."""
    svcs = services(compose)
    argv = next(
        a
        for a in (cli_check.p2prl_argv(s) for s in shell_commands(_init_script(compose)))
        if a and a[:2] == ["network", "init"]
    )
    init_cache = cli_check.resolve(argv).options["model_cache"]
    volume = _mounts(svcs["init"])[init_cache]
    for name, svc in node_services(compose).items():
        cache = str(node_config(svc).model_cache_dir)
        assert _mounts(svc).get(cache) == volume, f"{name} does not read the shared model at {cache}"
        assert f"{volume}:{cache}:ro" in svc["volumes"]


def test_wiring(compose: dict[str, Any]) -> None:
    svcs = services(compose)
    declared_volumes = set(compose["volumes"])
    for name, svc in svcs.items():
        assert list(svc.get("networks", [])) == ["p2prl"], f"{name} must be on the private network only"
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image ({image})"
        for dep in svc.get("depends_on", {}):
            assert dep in svcs, f"{name} depends on unknown {dep}"
        for vol in _mounts(svc).values():
            assert vol in declared_volumes
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: publish only on the host's loopback ({port})"
        long_running = "profiles" not in svc and name not in ("init", "bucket")
        if long_running:
            assert svc.get("healthcheck", {}).get("test"), f"{name} needs a healthcheck"
    assert "ports" not in svcs["s3"], "the S3 endpoint has no access control: never publish it"
    for svc in node_services(compose).values():
        deps = svc["depends_on"]
        assert deps["init"]["condition"] == "service_completed_successfully"
        assert deps["bucket"]["condition"] == "service_completed_successfully"
        assert node_config(svc).s3_endpoint == env_of(svcs["bucket"])["S3_ENDPOINT"]
    assert svcs["bucket"]["depends_on"]["s3"]["condition"] == "service_healthy"
    # only the trainer signs S3 requests (it writes the mirror); the others read the public bucket
    for svc in node_services(compose).values():
        assert node_config(svc).s3_sign == (node_config(svc).role == "trainer")
    assert "public_read_policy" in " ".join(svcs["bucket"]["command"])


def test_no_image_from_a_registry(compose: dict[str, Any]) -> None:
    """Every service runs p2prl's own image, built from this repository: `up` works where no registry
    (Docker Hub) is reachable."""
    for name, svc in services(compose).items():
        assert is_p2prl_image(svc), f"{name} runs {svc['image']}, which would be pulled from a registry"
        assert svc["image"] == services(compose)["init"]["image"]


# What Compose 1.29 (Debian bookworm's docker-compose) accepts at the top level of a file without
# `version:`; Compose v2 accepts these too (and `name:`, which 1.29 refuses).
COMPOSE_129_TOP_LEVEL = {"version", "services", "networks", "volumes", "secrets", "configs"}


def test_top_level_keys_compose_129_accepts() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    extra = {k for k in raw if k not in COMPOSE_129_TOP_LEVEL and not k.startswith("x-")}
    assert not extra, f"docker-compose 1.29 refuses the top-level keys {sorted(extra)}"


@pytest.mark.parametrize(
    "binary", [["docker-compose"], ["docker", "compose"]], ids=["compose-1", "compose-2"]
)
def test_compose_itself_accepts_the_file(binary: list[str], tmp_path: Path) -> None:
    """The compose binaries installed here parse and interpolate the file (`config`), as `up` would."""
    import shutil

    if shutil.which(binary[0]) is None:
        pytest.skip(f"{binary[0]} is not installed")
    version = subprocess.run([*binary, "version"], capture_output=True, text=True, timeout=60)
    if version.returncode != 0:
        pytest.skip(f"{' '.join(binary)} is not available: {version.stderr.strip()[:200]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P2PRL_", "COMPOSE_"))}
    proc = subprocess.run(
        [*binary, "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)
    assert set(resolved["services"]) == set(services(interpolate(yaml.safe_load(COMPOSE.read_text()))))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_s3_service_and_bucket_script_run(compose: dict[str, Any], tmp_path: Path) -> None:
    """The `s3` service's command serves S3 (its healthcheck passes), the `bucket` script makes the
    bucket twice over (idempotent), and what the trainer writes signed, a node reads unsigned."""
    import time

    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    svcs = services(compose)
    s3, bucket = svcs["s3"], svcs["bucket"]
    port = _free_port()
    args = [a.replace("0.0.0.0", "127.0.0.1") for a in s3["command"]]
    args[args.index("--port") + 1] = str(port)
    assert s3["entrypoint"][0] == "python"
    server = subprocess.Popen(
        [sys.executable, *s3["entrypoint"][1:], *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        probe = [
            sys.executable if a == "python" else a.replace(":9000/", f":{port}/")
            for a in s3["healthcheck"]["test"][1:]
        ]
        deadline = time.monotonic() + 60
        while subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
            assert server.poll() is None, "the S3 server exited"
            assert time.monotonic() < deadline, "the S3 service never became healthy"
            time.sleep(0.5)
        env = {**os.environ, **env_of(bucket), "S3_ENDPOINT": f"http://127.0.0.1:{port}"}
        assert bucket["entrypoint"] == ["python", "-c"]
        for _ in range(2):
            run = subprocess.run(
                [sys.executable, "-c", bucket["command"][0]],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, run.stderr
        name = env["BUCKET"]
        signed = boto3.client(
            "s3",
            endpoint_url=env["S3_ENDPOINT"],
            region_name="us-east-1",
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        signed.put_object(Bucket=name, Key="k", Body=b"patch")
        anon = boto3.client(
            "s3",
            endpoint_url=env["S3_ENDPOINT"],
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED),
        )
        assert anon.get_object(Bucket=name, Key="k")["Body"].read() == b"patch"
        policy = json.loads(signed.get_bucket_policy(Bucket=name)["Policy"])
        assert any(
            st.get("Effect") == "Allow" and "s3:GetObject" in json.dumps(st) for st in policy["Statement"]
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_init_script_runs(compose: dict[str, Any], tmp_path: Path) -> None:
    """Run the init service's script with its volumes as temporary directories; run it twice (idempotent)."""
    script = _init_script(compose)
    script = re.sub(r"(?<![\w/.])/(keys|genesis|model)(?=/|\b)", lambda m: f"{tmp_path}/{m.group(1)}", script)
    if os.geteuid() != 0:
        script = script.replace("chown -R 10001:10001", ": chown")
    for d in ("keys/trainer", "keys/validator", "genesis"):
        (tmp_path / d).mkdir(parents=True)
    cli_check.stand_in_base_model(tmp_path / "model")
    env = {
        **os.environ,
        **env_of(services(compose)["init"]),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    first = subprocess.run(["/bin/sh", "-ec", script], env=env, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    genesis = tmp_path / "genesis" / "genesis.json"
    before = genesis.read_bytes()
    assert (tmp_path / "keys" / "trainer" / "node.key").stat().st_mode & 0o077 == 0
    second = subprocess.run(["/bin/sh", "-ec", script], env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    assert genesis.read_bytes() == before, "a second `up` must not re-sign the genesis"

    from p2prl.crypto.keys import load_identity
    from p2prl.net.identity import peer_id_for
    from p2prl.node.setup.genesis import read_genesis

    g = read_genesis(genesis).genesis
    trainer = load_identity(tmp_path / "keys" / "trainer" / "node.key")
    assert g.trainer == trainer.public_hex
    assert list(g.validators) == [load_identity(tmp_path / "keys" / "validator" / "node.key").public_hex]
    assert g.s3 is not None and g.s3.bucket == env["BUCKET"] and g.s3.endpoint == "http://s3:9000"
    assert g.bootstrap == (f"/ip4/{env['TRAINER_IP']}/tcp/4001/p2p/{peer_id_for(trainer)}",)
