"""Every ``p2prl`` command the docs show exists in the real CLI, and the cheap ones run as written.

All fenced ``bash``/``console`` blocks of README.md, docs/**.md and docker/README.md are read;
each ``p2prl ...`` line (also inside ``$( ... )``, and the arguments of a ``docker run ... p2prl:TAG``
container) must name existing subcommands and options, give every required parameter and pass
values the options accept. ``--help`` of every command path shown is run. In the guides owned
here, the lines made only of cheap commands (keys, genesis, help) are run for real, in order, in a
fresh directory, the way a reader would type them; long-running ones (demo, node, benchmarks) get
the parse check only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cli_check
import pytest
from cli_check import CliMismatch, command_paths, resolve
from doc_commands import (
    DocCommand,
    ShellLine,
    doc_commands,
    fenced_blocks,
    inline_commands,
    shell_lines,
    simple_commands,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "benchmarks").glob("*.md")),
    ROOT / "docker" / "README.md",
]
GUIDES = [
    ROOT / "docs" / "QUICKSTART.md",
    ROOT / "docs" / "VOLUNTEER.md",
    ROOT / "docs" / "OPERATOR.md",
    ROOT / "docs" / "ARCHITECTURE.md",
    ROOT / "docs" / "BENCHMARKS.md",
    ROOT / "docker" / "README.md",
]

# Commands cheap enough to run for real here (no model build, no network, no long loop).
CHEAP = {("keys", "generate"), ("keys", "show"), ("network", "init"), ("network", "show")}
# Other programs a runnable doc line may use.
UTILITIES = {"python3", "python", "cat", "ls", "echo", "export", "test", "chmod", "mkdir"}
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _all_commands() -> list[DocCommand]:
    lines = [ln for doc in DOCS if doc.exists() for ln in (*shell_lines(doc), *inline_commands(doc))]
    return [c for line in lines for c in doc_commands(line)]


ALL_COMMANDS = _all_commands()


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize(
    "cmd", ALL_COMMANDS, ids=[f"{_rel(c.line.file)}:{c.line.lineno}:{c.argv[:2]}" for c in ALL_COMMANDS]
)
def test_command_parses(cmd: DocCommand) -> None:
    try:
        resolve(cmd.argv)
    except CliMismatch as e:
        pytest.fail(f"{_rel(cmd.line.file)}:{cmd.line.lineno}: `{cmd.line.text}`: {e}")


def test_guides_exist_and_show_commands() -> None:
    for doc in GUIDES:
        assert doc.exists(), f"{_rel(doc)} is missing"
    mine = [c for c in ALL_COMMANDS if c.line.file in GUIDES]
    shown = {c.argv[:2] for c in mine}
    # the guides cover the volunteer's and the operator's whole path
    for expected in [
        ("keys", "generate"),
        ("keys", "show"),
        ("node", "--role"),
        ("network", "init"),
        ("demo",),
    ]:
        assert any(s[: len(expected)] == expected for s in shown), (
            f"no guide shows p2prl {' '.join(expected)}"
        )
    assert any(c.in_container for c in mine), "the docker guide shows a p2prl container command"


def test_extraction_finds_what_a_reader_types(tmp_path: Path) -> None:
    """The extraction above can fail: console prompts, continuations, substitutions and docker runs."""
    doc = tmp_path / "x.md"
    doc.write_text(
        '```console\n$ p2prl keys show k --json\n{"a": 1}\n```\n'
        "```bash\n# comment\nPEER=$(p2prl keys show k --json | python3 -c 'print(1)')\n"
        "p2prl network init \\\n  --out g.json\n"
        "docker run --rm -v keys:/keys p2prl:cpu keys generate --out /keys/node.key\n```\n"
        "```python\np2prl = 1\n```\n"
        "```\nblobs/<sha256>\np2prl bench fanout \\\n  --json\n```\n"
    )
    lines = shell_lines(doc)
    assert [ln.lineno for ln in lines] == [2, 7, 8, 10, 17]
    cmds = [c for ln in lines for c in doc_commands(ln)]
    assert [c.argv for c in cmds] == [
        ("keys", "show", "k", "--json"),
        ("keys", "show", "k", "--json"),
        ("network", "init", "--out", "g.json"),
        ("keys", "generate", "--out", "/keys/node.key"),
        ("bench", "fanout", "--json"),
    ]
    assert [c.in_container for c in cmds] == [False, False, False, True, False]
    with pytest.raises(CliMismatch):
        resolve(("keys", "show", "a.key", "b.key"))
    # prose: usage notation, and placeholders with spaces
    prose = tmp_path / "y.md"
    prose.write_text(
        "Run `p2prl dashboard --node URL [--node …] [--once]` or `p2prl peers --connect ADDR… [--json]`.\n"
        "```bash\np2prl network init --bootstrap /ip4/1.2.3.4/tcp/4001/p2p/<trainer peer id> --out g.json\n```\n"
    )
    lines = [*inline_commands(prose), *shell_lines(prose)]
    assert [c.argv for ln in lines for c in doc_commands(ln)] == [
        ("dashboard", "--node", "URL", "--once"),
        ("peers", "--connect", "ADDR", "--json"),
        ("network", "init", "--bootstrap", "/ip4/1.2.3.4/tcp/4001/p2p/<trainer_peer_id>", "--out", "g.json"),
    ]
    with pytest.raises(CliMismatch):
        resolve(("keys", "generate", "--output", "x"))


# Full command lines (fenced); inline mentions in the prose such as `p2prl node --role miner` get the parse check.
NODE_COMMANDS = [
    c for c in ALL_COMMANDS if c.argv[:1] == ("node",) and "--help" not in c.argv and c.line.lang != "inline"
]


def node_config_of(argv: tuple[str, ...]) -> object:
    """The configuration `p2prl node ARGV` would run with (no config file, no environment)."""
    from p2prl.node.setup.config import coerce, load_config

    opts = resolve(argv).options
    flags = {}
    for name, value in opts.items():
        if value is None or name == "help":
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(value)
        flags[name] = coerce(name, value, from_text=True)
    return load_config(env={}, overrides=flags)


@pytest.mark.parametrize(
    "cmd", NODE_COMMANDS, ids=[f"{_rel(c.line.file)}:{c.line.lineno}" for c in NODE_COMMANDS]
)
def test_node_commands_are_valid_settings(cmd: DocCommand) -> None:
    """Beyond parsing: the node's own configuration check accepts the settings shown (role, ports, ...)."""
    from p2prl.node.setup.config import ConfigError

    if "--config" in cmd.argv:
        pytest.skip("settings come from a file; its example is checked by test_config_examples_load")
    try:
        node_config_of(cmd.argv)
    except ConfigError as e:
        pytest.fail(f"{_rel(cmd.line.file)}:{cmd.line.lineno}: `{cmd.line.text}`: {e}")


def test_node_settings_check_can_fail() -> None:
    from p2prl.node.setup.config import ConfigError

    with pytest.raises(ConfigError):
        node_config_of(("node", "--role", "farmer", "--network", "g.json"))
    with pytest.raises(ConfigError):
        node_config_of(("node", "--role", "miner"))  # no genesis


def _all_option_names() -> set[str]:
    from cli_check import option_names

    return {n for path in command_paths() for n in option_names(path)}


# Flags of other programs (docker, pytest) that the guides mention in prose.
_FOREIGN_FLAGS = {"--gpus", "--build", "--build-arg", "--rm", "--restart", "--strict-markers"}


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: _rel(p))
def test_flags_named_in_prose_exist(doc: Path) -> None:
    """A flag a guide names on its own (`--keep-versions`) is an option of some p2prl command."""
    known = _all_option_names() | _FOREIGN_FLAGS
    named = set(re.findall(r"`(--[a-z][a-z0-9-]*)`", doc.read_text()))
    unknown = sorted(named - known)
    assert not unknown, f"{_rel(doc)} names options no p2prl command has: {unknown}"


@pytest.mark.slow
def test_help_of_every_command_shown() -> None:
    from typer.testing import CliRunner

    from p2prl.cli.main import app

    paths = set()
    for c in ALL_COMMANDS:
        try:
            paths.add(resolve(c.argv).path)
        except CliMismatch:
            continue  # reported by test_command_parses
    assert paths <= command_paths()
    runner = CliRunner()
    for path in sorted(paths):
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, f"p2prl {' '.join(path)} --help: {result.output}"
        assert "Usage" in result.output


def _runnable(line: ShellLine) -> bool:
    """A line made only of cheap p2prl commands and harmless utilities (and at least one p2prl command)."""
    has_p2prl = False
    for seg in simple_commands(line.text):
        while seg and _ASSIGN.match(seg[0]):
            seg = seg[1:]
        if not seg:
            continue
        if seg[0] == "p2prl":
            try:
                r = resolve(seg[1:])
            except CliMismatch:
                return False
            if not (r.wants_help or r.path in CHEAP):
                return False
            has_p2prl = True
        elif seg[0] not in UTILITIES or any("~" in t or t.startswith("/") for t in seg[1:]):
            return False
    return has_p2prl


def _a_networks_genesis(operator: Path, out: Path) -> None:
    """The genesis.json a volunteer is given (signed by a trainer key that is not in the reader's directory)."""
    from p2prl.node.setup.netinit import NetworkSpec, init_network

    cli_check.stand_in_base_model(operator / "model")
    init_network(
        NetworkSpec(network_id="my-network"),
        key_path=operator / "trainer.key",
        model_cache=operator / "model",
        out=out,
    )


@pytest.mark.slow
@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: _rel(p))
def test_cheap_commands_run_as_written(doc: Path, tmp_path: Path) -> None:
    if not doc.exists():
        pytest.fail(f"{_rel(doc)} is missing")
    lines = [ln for ln in shell_lines(doc) if _runnable(ln)]
    if not lines:
        pytest.skip(f"{_rel(doc)} shows no command cheap enough to run (all are parse-checked)")
    work = tmp_path / "work"
    work.mkdir()
    cli_check.stand_in_base_model(work / "p2prl-data" / "model")
    if any("genesis.json" in ln.text for ln in lines):
        _a_networks_genesis(tmp_path / "operator", work / "genesis.json")
    script = "set -eu\n" + "".join(f"echo '>>> {ln.where}'\n{ln.text}\n" for ln in lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("P2PRL_", "AWS_"))} | {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    proc = subprocess.run(
        ["/bin/sh", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{_rel(doc)}: a shown command failed\n{proc.stdout}\n{proc.stderr}"


TOML_BLOCKS = [(doc, n, text) for doc in DOCS if doc.exists() for n, text in fenced_blocks(doc, "toml")]


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=[f"{_rel(d)}:{n}" for d, n, _ in TOML_BLOCKS])
def test_config_examples_load(block: tuple[Path, int, str], tmp_path: Path) -> None:
    """A node config file shown in the docs is one the node accepts (unknown keys are errors)."""
    from p2prl.node.setup.config import ConfigError, load_config

    doc, n, text = block
    f = tmp_path / "node.toml"
    f.write_text(text)
    try:
        load_config(config_file=f, env={})
    except ConfigError as e:
        pytest.fail(f"{_rel(doc)}:{n}: {e}")


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", GUIDES, ids=lambda p: _rel(p))
def test_relative_links_resolve(doc: Path) -> None:
    for target in _LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        assert (doc.parent / target).exists(), f"{_rel(doc)} links to missing {target}"


def test_benchmarks_index_matches_the_writeups() -> None:
    """docs/BENCHMARKS.md indexes every write-up in docs/benchmarks/ and quotes commands only as the docs it
    links to show them (so a figure and its command come from the same place)."""
    index = ROOT / "docs" / "BENCHMARKS.md"
    writeups = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))
    text = index.read_text()
    for f in writeups:
        assert f"(benchmarks/{f.name})" in text, f"BENCHMARKS.md does not link benchmarks/{f.name}"
    linked = {(index.parent / t).resolve() for t in _LINK.findall(text) if not re.match(r"^[a-z]+://", t)}
    sources = {f.resolve() for f in writeups} | {f for f in linked if f.is_file()}
    theirs = {c.argv for c in ALL_COMMANDS if c.line.file.resolve() in sources}
    ours = {c.argv for c in ALL_COMMANDS if c.line.file == index}
    assert ours, "BENCHMARKS.md shows the commands"
    missing = sorted(" ".join(a) for a in ours - theirs)
    assert not missing, f"commands in BENCHMARKS.md that no linked write-up shows: {missing}"
