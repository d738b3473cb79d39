"""Entry point: assembles the command groups into one ``p2prl`` command."""

from __future__ import annotations

import logging
import os
import sys

import typer

from p2prl import __version__
from p2prl.cli import bench, keys, model, net, node, patch, rl, testbed, verify
from p2prl.cli.noise import quiet_dependencies
from p2prl.cli.status import status

app = typer.Typer(
    name="p2prl",
    help="Peer-to-peer RL post-training: signed sparse patches, verifiable rollouts, GRPO.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # plain help: the boxed layout truncated option names, showed `<bool>` on flags and took ~300
    # lines at 80 columns for `node` (a flag column as wide as its longest --x/--no-x pair)
    rich_markup_mode=None,
)
app.add_typer(keys.app, name="keys")
app.add_typer(patch.app, name="patch")
app.add_typer(bench.app, name="bench")
app.add_typer(net.blob_app, name="blob")
app.add_typer(testbed.app, name="testbed")
app.add_typer(model.app, name="model")
app.command("eval")(model.evaluate)
app.command("peers")(net.peers)
app.command("train-local")(rl.train_local)
app.command("status")(status)
app.command("verify-batch")(verify.verify_batch)
node.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"p2prl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
    log_level: str = typer.Option(
        os.environ.get("P2PRL_LOG_LEVEL", "WARNING"),
        "--log-level",
        help="Python log level (env P2PRL_LOG_LEVEL).",
    ),
) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        quiet_dependencies()


def os_error_line(e: OSError) -> str:
    """One line for a file or port the user named (read-only directory, port in use, ...)."""
    what = f"{e.strerror or e}".lower() if e.strerror else str(e)
    if e.filename is not None:
        return f"{e.filename}: {what}"
    return what


def main() -> None:
    """Run the command; an OSError that reaches here (the user's files, ports) prints one line, not a
    traceback (``--log-level DEBUG`` shows the traceback)."""
    try:
        app()
    except OSError as e:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        raise SystemExit(1) from None
    except SystemExit as e:
        dist = sys.modules.get("p2prl.rl.distributed")  # imported only by runs that may be sharded
        if dist is None or not dist.launched():
            raise
        # A rank under torchrun ends without interpreter teardown: a gloo worker thread that frees
        # its last collective's tensors then needs the GIL, is made to exit by the finalizing
        # interpreter, and aborts the process (rc -6) after a run that succeeded.
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
