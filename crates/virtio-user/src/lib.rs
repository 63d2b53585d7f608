//! virtio-user bdev: a vhost-user-blk front end (being built).
