"""libp2p transport, gossip, content-addressed blob store, chunk exchange and S3 fallback."""
