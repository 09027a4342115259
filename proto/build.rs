//! Compiles the .proto files with protox (pure Rust; no system protoc exists here).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/tensorflow/master_service.proto",
        "proto/tensorflow/eager_service.proto",
        "proto/tensorflow/worker_service.proto",
        "proto/tensorflow/graph.proto",
        "proto/tensorflow/step_stats.proto",
        "proto/salus/v1/admin.proto",
        "proto/salus/v1/callbacks.proto",
        "proto/salus/seam/v1/seam.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Tensor payloads and pass-through messages stay zero-copy `Bytes`.
        .bytes(".")
        // Malformed requests become INVALID_ARGUMENT instead of INTERNAL.
        .codec_path("crate::codec::ProstCodec")
        .compile_fds(fds)?;
    Ok(())
}
