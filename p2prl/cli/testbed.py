"""``p2prl testbed up|down|exec|run``: hosts with rate-limited links and NATs on this machine (root)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import typer

app = typer.Typer(
    no_args_is_help=True, help="Hosts with rate-limited links and NAT routers (network namespaces)."
)


def _specs(hosts: int, nat: int, link_mbit: float, up_mbit: float, down_mbit: float) -> Any:
    from p2prl.testbed import hosts_spec

    if not 0 <= nat <= hosts:
        raise typer.BadParameter(f"--nat {nat} must be between 0 and --hosts {hosts}")
    return hosts_spec(hosts, nat, up_mbit or link_mbit, down_mbit or link_mbit)


_HOSTS = typer.Option(3, "--hosts", min=1, max=200, help="Number of hosts h0, h1, ...")
_NAT = typer.Option(0, "--nat", min=0, help="How many hosts (the last ones) sit behind their own NAT router.")
_LINK = typer.Option(50.0, "--link-mbit", min=0.0, help="Each host's link rate both ways (0: unlimited).")
_UP = typer.Option(0.0, "--up-mbit", help="Upload rate (default --link-mbit).")
_DOWN = typer.Option(0.0, "--down-mbit", help="Download rate (default --link-mbit).")


def _check() -> None:
    from p2prl.testbed import unavailable_reason

    reason = unavailable_reason()
    if reason:
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(2)


@app.command()
def up(
    hosts: int = _HOSTS,
    nat: int = _NAT,
    link_mbit: float = _LINK,
    up_mbit: float = _UP,
    down_mbit: float = _DOWN,
    tag: str = typer.Option("", "--tag", help="Name of the testbed (default: random)."),
) -> None:
    """Create a testbed that stays until ``p2prl testbed down --tag TAG``; prints its hosts as JSON."""
    from p2prl.testbed import Testbed

    _check()
    specs = _specs(hosts, nat, link_mbit, up_mbit, down_mbit)
    tb = Testbed(specs, tag=tag) if tag else Testbed(specs)
    tb.up(reaper=False)
    typer.echo(json.dumps(tb.describe(), indent=1))


@app.command()
def down(
    tag: str = typer.Option("", "--tag", help="The testbed to remove."),
    all_: bool = typer.Option(False, "--all", help="Remove every testbed namespace (p2tb-*)."),
) -> None:
    """Stop the processes inside a testbed and delete its namespaces, links and NAT rules."""
    from p2prl.testbed import down_all

    if not tag and not all_:
        raise typer.BadParameter("give --tag TAG or --all")
    gone = down_all(None if all_ else tag)
    typer.echo(f"removed {len(gone)} namespaces")


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    ctx: typer.Context,
    tag: str = typer.Argument(..., help="Testbed tag."),
    host: str = typer.Argument(..., help="Host name (h0, h1, ...)."),
) -> None:
    """Run a command inside one host: ``p2prl testbed exec TAG h0 -- p2prl node ...``."""
    from p2prl.testbed import PREFIX

    rc = subprocess.call(["ip", "netns", "exec", f"{PREFIX}{tag}-{host}", *ctx.args])
    raise typer.Exit(rc)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    hosts: int = _HOSTS,
    nat: int = _NAT,
    link_mbit: float = _LINK,
    up_mbit: float = _UP,
    down_mbit: float = _DOWN,
) -> None:
    """Bring a testbed up, run the command after ``--`` in every host ({host} and {ip} are replaced
    by the host's name and address), wait for all of them, and tear it down (also on Ctrl-C,
    SIGTERM, failure, or SIGKILL of this process: a watchdog removes what is left)."""
    from p2prl.testbed import Testbed

    _check()
    if not ctx.args:
        raise typer.BadParameter("give the command to run after --")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C tears down, even if inherited ignored
    rc = 0
    with Testbed(_specs(hosts, nat, link_mbit, up_mbit, down_mbit)) as tb:
        typer.echo(json.dumps(tb.describe()), err=True)
        procs = [
            tb.popen(h.name, [a.replace("{host}", h.name).replace("{ip}", h.ip) for a in ctx.args])
            for h in tb.hosts.values()
        ]
        for p in procs:
            rc = max(rc, p.wait())
    raise typer.Exit(rc)


@app.command()
def nat(
    miners: int = typer.Option(2, "--miners", min=2, max=16, help="Miners, each behind its own NAT router."),
    patches: int = typer.Option(2, "--patches", min=1, help="Patches the public node publishes."),
    size_kib: int = typer.Option(2048, "--size-kib", min=1, help="Size of each patch in KiB."),
    link_mbit: float = _LINK,
    hole_punch: bool = typer.Option(True, "--hole-punch/--no-hole-punch", help="Run DCUtR."),
) -> None:
    """NATed miners behind their own routers, a public relay: relayed dials, hole punching, patches,
    and how much of each miner's traffic went through the relay (JSON)."""
    from p2prl.bench.nat import run_nat
    from p2prl.testbed import nat_unavailable_reason

    reason = nat_unavailable_reason()
    if reason:
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(2)
    res = run_nat(miners, patches, size_kib, link_mbit=link_mbit or 1000.0, hole_punch=hole_punch)
    typer.echo(json.dumps(res, indent=1))
