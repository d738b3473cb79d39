"""The CLI starts with every typer release pyproject.toml admits.

Typer before 0.29 maps only ``Path`` itself to a path option: an option declared with the
``PosixPath`` that ``type(default)`` gives stopped every command at start-up ("Type not yet
supported"). The declared types are checked here whatever typer is installed; the start-up itself
is run against the floor by ``P2PRL_LOWEST=1 bash scripts/bootstrap.sh test --fast``.
"""

import inspect
import subprocess
import sys
import typing
from pathlib import Path

import click
import typer.main
from typer.testing import CliRunner

from p2prl.cli.main import app


def _commands(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            out += _commands(sub, (*path, name))
    return out


def _callbacks(t: typer.Typer = app) -> list[typing.Any]:
    """The functions typer reads the options from (the click commands hold wrappers of them)."""
    out = [c.callback for c in t.registered_commands if c.callback is not None]
    for g in t.registered_groups:
        if g.typer_instance is not None:
            out += _callbacks(g.typer_instance)
    return out


def test_no_option_is_declared_with_a_concrete_path_class() -> None:
    bad = []
    assert len(_callbacks()) > 10
    for cb in _callbacks():
        for p in inspect.signature(cb).parameters.values():
            ann = p.annotation
            kinds = typing.get_args(ann) or (ann,)
            bad += [f"{cb.__name__}({p.name}: {k})" for k in kinds if isinstance(k, type) and issubclass(k, Path) and k is not Path]
    assert not bad, bad


def test_every_command_prints_its_help() -> None:
    runner = CliRunner()
    for path, _ in _commands(typer.main.get_command(app)):
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)


def test_the_module_starts_in_a_fresh_interpreter() -> None:
    res = subprocess.run([sys.executable, "-m", "p2prl", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "Usage" in res.stdout, res.stderr[-2000:]
