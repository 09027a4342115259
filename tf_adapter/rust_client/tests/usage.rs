//! The program starts, links TensorFlow's C API and refuses a wrong command line with its usage.
//! Also why `cargo test --workspace` builds the binary itself (with the workspace's features, reusing
//! its dependencies), which integration_tests/test_c_api_shim.py then runs as a real client.

use std::process::Command;

#[test]
fn a_wrong_command_line_gets_the_usage() {
    let mut program = Command::new(env!("CARGO_BIN_EXE_salus-tf-rust-train"));
    // The binary has no rpath to the venv's TensorFlow (scripts/setup.sh sets this variable for cargo).
    if let Ok(dir) = std::env::var("SALUS_TF_LIB_DIR") {
        program.env("LD_LIBRARY_PATH", dir);
    }
    let out = program
        .arg("only-one-argument")
        .output()
        .expect("the program runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("usage:") && stderr.contains("GRAPH.pb INIT_OP TRAIN_OP LOSS_OP STEPS"),
        "{stderr}"
    );
}
