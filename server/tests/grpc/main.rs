//! The real server on port 0, driven by gRPC clients the way TensorFlow's own clients drive it: the TF1 master
//! protocol (`master`) and TF2's remote-eager protocol (`eager`). One test binary for both: each file under
//! `tests/` is a crate of its own, and each such crate compiles the server's generic gRPC stack again (about
//! 37 s of release build apiece on 2 cores).

#[path = "../common/mod.rs"]
mod common;

mod eager;
mod master;
