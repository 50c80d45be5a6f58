//! Cluster-level tests with real processes. Not built yet: the cluster issue fills it.
