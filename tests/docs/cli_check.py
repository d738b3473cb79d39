"""Check ``p2prl ...`` command lines against the real CLI tree, without running them.

Used by the docs and docker tests: a command shown to a user (in a doc, a compose file, a
healthcheck) must name subcommands and options that exist, give every required parameter,
and pass values that the option's type accepts (file paths are not checked: they belong to
the machine that runs the command).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import BadParameter, UsageError
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import BadParameter, UsageError

ROOT = Path(__file__).resolve().parents[2]

# Values that stand for something filled in later: shell variables, compose interpolation,
# ``<peer id>``, and usage-notation metavariables such as ``URL`` or ``K``.
_PLACEHOLDER = re.compile(r"\$\{?[A-Za-z_]|<[^>]+>|^[A-Z][A-Z0-9_]*$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_OPS = {"|", "||", "&&", ";", "&"}


class CliMismatch(AssertionError):
    """A command line that the real CLI would reject."""


@dataclass
class Resolved:
    """A command line resolved to a leaf command of the CLI."""

    path: tuple[str, ...]
    command: Any
    options: dict[str, object] = field(default_factory=dict)
    arguments: list[str] = field(default_factory=list)
    wants_help: bool = False


def root_command() -> Any:
    from p2prl.cli.main import app

    return typer.main.get_command(app)


def split_segments(line: str) -> list[list[str]]:
    """Split a shell line into simple commands (at ``|``, ``&&``, ``;``), dropping comments."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token in _SHELL_OPS:
            segments.append([])
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


def p2prl_argv(tokens: list[str]) -> list[str] | None:
    """The arguments after ``p2prl`` if this simple command runs p2prl (env prefixes allowed)."""
    i = 0
    while i < len(tokens) and _ENV_ASSIGN.match(tokens[i]):
        i += 1
    if i < len(tokens) and Path(tokens[i]).name == "p2prl":
        return tokens[i + 1 :]
    return None


def _is_group(cmd: Any) -> bool:
    return isinstance(getattr(cmd, "commands", None), dict)


def _is_option(p: Any) -> bool:
    return p.param_type_name == "option"


def _context(cmd: Any, name: str, parent: Any) -> Any:
    return cmd.context_class(cmd, info_name=name, parent=parent)


def _names(cmd: Any, ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in cmd.get_params(ctx):
        if _is_option(p):
            for n in (*p.opts, *p.secondary_opts):
                out[n] = p
    return out


def _check_value(param: Any, value: object, ctx: Any, where: str) -> None:
    """Convert a value with the parameter's own type, except paths, files and placeholders."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(not isinstance(v, str) or _PLACEHOLDER.search(v) for v in values):
        return
    desc = getattr(param, "type_descriptor", None)
    try:
        if desc is not None:
            if desc.is_path or desc.is_file:
                return
            param.get_runtime_param().coerce(value, param=param, ctx=ctx)
        else:  # pragma: no cover - click types
            if type(param.type).__name__ in ("Path", "File"):
                return
            for v in values:
                param.type.convert(v, param, ctx)
    except BadParameter as e:
        raise CliMismatch(f"{where}: bad value {value!r} for {param.name}: {e.format_message()}") from e


def resolve(argv: Iterable[str], env: Mapping[str, str] | None = None) -> Resolved:
    """Walk the command tree with click's own parser; raise ``CliMismatch`` where the CLI would refuse.

    ``env`` holds environment variables the command will see (they can supply options with
    an ``envvar``).
    """
    env = dict(env or {})
    args = list(argv)
    cmd = root_command()
    path: list[str] = []
    parent: Any = None
    while True:
        where = "p2prl " + " ".join(path) if path else "p2prl"
        ctx = _context(cmd, path[-1] if path else "p2prl", parent)
        parser = cmd.make_parser(ctx)
        try:
            opts, rest, _order = parser.parse_args(args=list(args))
        except UsageError as e:
            raise CliMismatch(f"{where}: {e.format_message()}") from e
        # --help and --version are eager: click prints and exits before checking the rest.
        eager_exit = bool(opts.get("help")) or bool(opts.get("version"))
        by_name = {p.name: p for p in cmd.get_params(ctx)}
        for name, value in opts.items():
            if name in by_name:
                _check_value(by_name[name], value, ctx, where)
        if _is_group(cmd) and not eager_exit:
            if not rest:
                raise CliMismatch(f"{where}: needs a subcommand (one of {sorted(cmd.commands)})")
            sub = cmd.get_command(ctx, rest[0])
            if sub is None:
                raise CliMismatch(f"{where}: no subcommand {rest[0]!r} (have {sorted(cmd.commands)})")
            path.append(rest[0])
            args = rest[1:]
            parent = ctx
            cmd = sub
            continue
        if eager_exit:
            return Resolved(tuple(path), cmd, dict(opts), list(rest), wants_help=True)
        _check_leaf(cmd, ctx, opts, rest, env, where)
        return Resolved(tuple(path), cmd, dict(opts), list(rest))


def _check_leaf(
    cmd: Any, ctx: Any, opts: dict[str, object], rest: list[str], env: Mapping[str, str], where: str
) -> None:
    """The parser has already placed arguments in ``opts``; what is left over is extra."""
    if rest and not ctx.allow_extra_args:
        raise CliMismatch(f"{where}: unexpected extra arguments {rest}")
    for p in cmd.get_params(ctx):
        if not p.required or opts.get(p.name) not in (None, (), []):
            continue
        envvars = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar or [])
        if any(e in env for e in envvars):
            continue
        kind = "option" if _is_option(p) else "argument"
        raise CliMismatch(f"{where}: missing required {kind} {getattr(p, 'human_readable_name', p.name)}")


def command_paths(cmd: Any = None, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every command path of the tree (groups included)."""
    cmd = cmd or root_command()
    out = {prefix}
    if _is_group(cmd):
        for name, sub in cmd.commands.items():
            out |= command_paths(sub, (*prefix, name))
    return out


def option_names(path: tuple[str, ...]) -> set[str]:
    """All option spellings of the command at ``path``."""
    cmd = root_command()
    ctx = _context(cmd, "p2prl", None)
    for name in path:
        cmd = cmd.commands[name]
        ctx = _context(cmd, name, ctx)
    return set(_names(cmd, ctx))


def substitutions(line: str) -> tuple[str, list[str]]:
    """Cut ``$( ... )`` (balanced, quotes respected) out of a line: (line with a marker, their contents)."""
    out: list[str] = []
    subs: list[str] = []
    i = 0
    while i < len(line):
        if line.startswith("$(", i):
            depth, j, quote = 1, i + 2, ""
            while j < len(line) and depth:
                c = line[j]
                if quote:
                    quote = "" if c == quote else quote
                elif c in "'\"":
                    quote = c
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                j += 1
            subs.append(line[i + 2 : j - 1])
            out.append("SUBSTITUTED")
            i = j
        else:
            out.append(line[i])
            i += 1
    return "".join(out), subs


def stand_in_base_model(cache: Path) -> None:
    """A model-cache entry naming the default model, so `network init` skips its minute-long build.

    Building the real base model is tested with the RL core; here the commands and their order matter.
    """
    import json

    from p2prl.rl.model import DEFAULT_MODEL_NAME, META_FILE
    from p2prl.rl.tokenizer import CharTokenizer

    d = cache / DEFAULT_MODEL_NAME
    d.mkdir(parents=True)
    CharTokenizer().save(d)
    (d / "config.json").write_text("{}")
    (d / META_FILE).write_text(
        json.dumps({"name": DEFAULT_MODEL_NAME, "parameters": 1, "weights_hash": "ab" * 32})
    )
