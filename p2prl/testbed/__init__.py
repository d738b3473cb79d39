"""Hosts with rate-limited links and NAT routers on one machine (network namespaces), for measuring
and testing the network the way volunteers see it."""
