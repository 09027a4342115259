//! Sets the rpath to TensorFlow's libraries inside the project venv, so the server
//! (and its test binaries) run without LD_LIBRARY_PATH (a cargo `links` override
//! cannot carry an rpath), and compiles `src/tf/allocator_stats.cc` against the
//! C++ headers of the same wheel. scripts/setup.sh provides the path.

fn main() {
    println!("cargo:rerun-if-env-changed=SALUS_TF_LIB_DIR");
    println!("cargo:rerun-if-changed=src/tf/allocator_stats.cc");
    let dir = match std::env::var("SALUS_TF_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => dir,
        _ => panic!(
            "SALUS_TF_LIB_DIR is not set: run scripts/setup.sh first, so TensorFlow's C API \
             and headers are found in the project venv"
        ),
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    // The flags tf.sysconfig.get_compile_flags() gives for code built against
    // the wheel (its C++ ABI and Eigen alignment must match the libraries').
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(format!("{dir}/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("EIGEN_MAX_ALIGN_BYTES", "64")
        // TensorFlow's headers warn about their own deprecations.
        .warnings(false)
        .flag_if_supported("-w")
        // What this file instantiates of TensorFlow's headers (inline members,
        // vtables, typeinfo) stays its own: exported, the TensorFlow library
        // on the link line would keep it live (it may interpose), and with it
        // a need for TensorFlow in every binary of the crate, the
        // supervisor's too. The file uses no dynamic_cast or typeid.
        .flag("-fvisibility=hidden")
        .flag("-fvisibility-inlines-hidden")
        .file("src/tf/allocator_stats.cc")
        .compile("salus_allocator_stats");
}
