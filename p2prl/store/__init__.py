"""Local content-addressed blob storage on disk: what the chain keeps and the network serves."""

from p2prl.store.blobs import BlobStore, StoreError

__all__ = ["BlobStore", "StoreError"]
