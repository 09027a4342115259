//! # salus-proto
//!
//! Generated gRPC and protobuf types.
//!
//! # Layout
//! - [`tensorflow`]: a wire-compatible subset of TensorFlow's master protocol
//!   (`/tensorflow.MasterService/*`), of `tensorflow.WorkerService` (GetStatus,
//!   RecvTensor) and the framework messages they carry; [`tensorflow::eager`]:
//!   the remote-eager protocol TF2 clients speak.
//! - [`salus::v1`]: Salus's own services (administration).
//! - [`codec`]: the gRPC codec of every service.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

pub mod codec;

pub mod tensorflow {
    tonic::include_proto!("tensorflow");

    pub mod error {
        tonic::include_proto!("tensorflow.error");
    }

    /// The remote-eager protocol (`/tensorflow.eager.EagerService/*`).
    pub mod eager {
        tonic::include_proto!("tensorflow.eager");
    }
}

pub mod salus {
    pub mod v1 {
        tonic::include_proto!("salus.v1");
    }

    /// The supervisor <-> executor seam (not a gRPC service: framed messages on a socketpair).
    pub mod seam {
        pub mod v1 {
            tonic::include_proto!("salus.seam.v1");
        }
    }
}
