"""Configuration precedence: defaults < TOML < P2PRL_* environment < flags; bad values are errors."""

from pathlib import Path

import pytest

from p2prl.node.setup.config import ConfigError, NodeConfig, describe, load_config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "node.toml"
    p.write_text(text)
    return p


def test_defaults_need_only_network() -> None:
    cfg = load_config(env={}, overrides={"network": "g.json"})
    assert cfg.role == "miner"
    assert cfg.network == Path("g.json")
    assert cfg.key_path == Path("p2prl-data/node.key")
    assert cfg.model_cache_dir == Path("p2prl-data/model")
    with pytest.raises(ConfigError, match="network"):
        load_config(env={})


def test_precedence_toml_env_flags(tmp_path: Path) -> None:
    toml = write(
        tmp_path,
        'role = "validator"\nnetwork = "a.json"\nstatus_port = 7000\nheartbeat_s = 3\n'
        '[s3]\nbucket = "from-toml"\nendpoint = "http://toml"\n',
    )
    cfg = load_config(config_file=toml, env={})
    assert (cfg.role, cfg.status_port, cfg.s3_bucket, cfg.s3_endpoint) == (
        "validator",
        7000,
        "from-toml",
        "http://toml",
    )
    assert cfg.heartbeat_s == 3.0
    env = {"P2PRL_STATUS_PORT": "7100", "P2PRL_S3_BUCKET": "from-env", "P2PRL_BOOTSTRAP": "/a, /b"}
    cfg = load_config(config_file=toml, env=env)
    assert (cfg.status_port, cfg.s3_bucket, cfg.bootstrap) == (7100, "from-env", ["/a", "/b"])
    assert cfg.s3_endpoint == "http://toml"  # untouched by env
    cfg = load_config(
        config_file=toml, env=env, overrides={"status_port": 7200, "s3_bucket": None, "data_dir": Path("/d")}
    )
    assert (cfg.status_port, cfg.s3_bucket) == (7200, "from-env")  # None = flag not given
    assert cfg.data_dir == Path("/d") and cfg.key_path == Path("/d/node.key")


def test_config_file_from_env(tmp_path: Path) -> None:
    toml = write(tmp_path, 'network = "b.json"\nrole = "trainer"\n')
    cfg = load_config(env={"P2PRL_CONFIG": str(toml)})
    assert cfg.role == "trainer"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('network = "a"\nbogus = 1\n', "unknown setting"),
        ('network = "a"\nstatus_port = "x"\n', "integer"),
        ('network = "a"\nrole = "king"\n', "role"),
        ('network = "a"\ns3_enable = "yes"\n', "boolean"),
        ('network = "a"\nbootstrap = "x"\n', "list"),
        ("network = [\n", "cannot read"),
        ('network = "a"\ntrainer_key = "zz"\n', "trainer_key"),
        ('network = "a"\nmax_upload_mb_s = -1.0\n', "max_upload_mb_s"),
        ('network = "a"\nchecked_per_group = -1\n', "checked_per_group"),
        ('network = "a"\nsuperseed_s = -1.0\n', "superseed_s"),
        ('network = "a"\nreference_engine = "hf-avx512"\n', "own, vllm or hf-avx2"),
        ('network = "a"\nreference_engine = "hf-avx2"\ndevice = "cuda"\n', "a CPU's engine"),
    ],
)
def test_bad_toml(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(config_file=write(tmp_path, text), env={})


def test_bad_env() -> None:
    with pytest.raises(ConfigError, match="status_port"):
        load_config(env={"P2PRL_STATUS_PORT": "eighty", "P2PRL_NETWORK": "g"})
    cfg = load_config(env={"P2PRL_S3_ENABLE": "off", "P2PRL_NETWORK": "g", "P2PRL_LOG_LEVEL": "INFO"})
    assert cfg.s3_enable is False


def test_every_setting_is_documented() -> None:
    rows = describe()
    assert {r[0] for r in rows} == set(NodeConfig.__dataclass_fields__)
    assert all(help_text for _, _, help_text in rows)
    doc = (Path(__file__).parents[3] / "docs" / "NODE.md").read_text()
    missing = [name for name, _, _ in rows if f"`{name}`" not in doc]
    assert not missing, f"docs/NODE.md does not describe {missing}"
