//! Sets the rpath to TensorFlow's libraries inside the project venv, so the server
//! (and its test binaries) run without LD_LIBRARY_PATH. A cargo `links` override
//! cannot carry an rpath, so it is set here; scripts/setup.sh provides the path.

fn main() {
    println!("cargo:rerun-if-env-changed=SALUS_TF_LIB_DIR");
    match std::env::var("SALUS_TF_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
        _ => {
            println!(
                "cargo:warning=SALUS_TF_LIB_DIR is not set: run scripts/setup.sh first so \
                 TensorFlow's C API can be linked from the project venv"
            );
        }
    }
}
