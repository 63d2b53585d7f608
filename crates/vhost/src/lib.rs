//! vhost-user-blk target (being built).
