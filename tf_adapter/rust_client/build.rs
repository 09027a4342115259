//! The rpath to TensorFlow's libraries in the project venv (as server/build.rs), so the
//! program runs without LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rerun-if-env-changed=SALUS_TF_LIB_DIR");
    if let Ok(dir) = std::env::var("SALUS_TF_LIB_DIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
