"""A running node: the runtime that owns the threads, the network host, the blob store and the status
record, and the typed door (``role``) through which it runs one role."""
