"""Before a node runs: its configuration and each role's settings, the genesis (made by ``network
init``, verified and pinned at start) and the network layer's settings derived from both."""
