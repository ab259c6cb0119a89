//! The `sandlane` binary. The server, CLI and composition root arrive with the server
//! issue; until then it says so.

fn main() {
    eprintln!("sandlane {}: the server is not built yet", env!("CARGO_PKG_VERSION"));
    std::process::exit(2);
}
