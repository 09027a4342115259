//! The `salus` binary (see the library's docs).

fn main() {
    std::process::exit(salus_cli::main());
}
