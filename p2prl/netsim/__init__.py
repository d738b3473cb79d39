"""A discrete-event network simulator for patch fan-out past what one machine can host.

It drives the swarm's own decisions (``p2prl.net.selection``: rarest-first chunk choice, sparing
complete holders, superseeding; ``p2prl.net.pacing``: the upload cap) over simulated links, chunk
by chunk, and compares the swarm with a star and a relay tree on the same links.
"""

from p2prl.netsim.population import Spec
from p2prl.netsim.report import run_all
from p2prl.netsim.swarm import PROVIDER_ORDERS

__all__ = ["PROVIDER_ORDERS", "Spec", "run_all"]
