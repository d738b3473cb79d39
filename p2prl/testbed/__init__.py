"""Hosts with rate-limited links and NAT routers on one machine (network namespaces), for measuring
and testing the network the way volunteers see it."""

from p2prl.testbed.bed import HostSpec, Testbed, down_all, hosts_spec
from p2prl.testbed.netns import PREFIX, enter, list_namespaces, nat_unavailable_reason, unavailable_reason

__all__ = [
    "PREFIX",
    "HostSpec",
    "Testbed",
    "down_all",
    "enter",
    "hosts_spec",
    "list_namespaces",
    "nat_unavailable_reason",
    "unavailable_reason",
]
