//! Sets the rpath to TensorFlow's libraries inside the project venv, as
//! server/build.rs does for the server's own binaries (a build script's link
//! arguments apply only to its own package). scripts/setup.sh provides the path.

fn main() {
    println!("cargo:rerun-if-env-changed=SALUS_TF_LIB_DIR");
    match std::env::var("SALUS_TF_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}"),
        _ => println!(
            "cargo:warning=SALUS_TF_LIB_DIR is not set: run scripts/setup.sh first so \
             TensorFlow's C API can be linked from the project venv"
        ),
    }
}
