"""The sample plan: pure arithmetic from shard sizes, config, topology and state to each worker's reads; no I/O, no torch."""
