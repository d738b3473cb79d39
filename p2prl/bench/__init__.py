"""Measurement: the benchmarks whose figures docs/BENCHMARKS.md quotes, the reference codecs they
compare against (PULSE's patch format, grail's sketch) and the adversaries they run (dishonest miners,
flooders, the in-process arena of real hosts and roles).

Nothing in the node imports this part: it sits above every other part and uses them as a peer would.
Importing the package imports nothing heavy; each benchmark loads what it needs when it runs.
"""
