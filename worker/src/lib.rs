//! The node daemon: hosts elastic workers, loads function blocks, delivers matches. Not built yet: the cluster and delivery issues fill it.
