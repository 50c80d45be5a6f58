//! The sled-backed object store, outbox and registries. Not built yet: the storage-node issue fills it.
