//! Link flags of the `proxima` binary.
//!
//! Relative relocations packed (`DT_RELR`): a position-independent executable carries one
//! 24-byte `.rela.dyn` entry per pointer in its data (vtables, string tables): 470 KB for
//! this binary, which the dynamic loader reads in full at start and which then stays
//! resident for the process's lifetime. Packed, they are 9.5 KB (`.relr.dyn` and what is
//! left of `.rela.dyn`); the code is the same. At 100 Services × 10 pods under load the
//! RSS goes from 15.0-15.3 to 14.8-14.9 MB (benches/load/README.md, "The binary's pages"
//! under the 100 Services × 10 pods section, issue 29).
//!
//! Needs glibc >= 2.36 where the binary runs (it asks for `GLIBC_ABI_DT_RELR`; without
//! it was 2.34): the image's distroless cc-debian12 and the rust:bookworm builder have
//! 2.36; a binary copied to an older host (Ubuntu 22.04: 2.35) will not start there. And a
//! linker that knows the flag (GNU ld >= 2.38, lld >= 15).
//!
//! Functions that run placed together (`symbol-order.txt`, written by
//! `benches/load/symbol-order.sh` from a callgrind run of the dist build under load): the
//! kernel maps a binary's code by 64 KB windows around each page that runs, so code that
//! runs once (the YAML reader at start, clap) or now and then (timers, the admin port)
//! kept 130 of the text's 186 windows resident, 7.1-7.4 MB of code for what is about
//! 1 MB of functions that ran. Listed first, those functions fill a few contiguous windows
//! (the numbers: benches/load/README.md, "The binary's pages"). Only rustc's own linker
//! for x86_64 Linux (rust-lld, the default since Rust 1.90) is given the file, when no
//! other linker is configured; GNU ld has no such option. Names the file lists that a build does not have (another profile,
//! changed code) are skipped without a warning; the order only moves code, it never
//! changes it.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if links_with_rust_lld() && std::env::var("PROFILE").as_deref() == Ok("release") {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
        let order = std::path::Path::new(&dir).join("symbol-order.txt");
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={},--no-warn-symbol-ordering",
            order.display()
        );
        println!("cargo:rerun-if-changed=symbol-order.txt");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// x86_64 Linux with no linker chosen in cargo's config (`RUSTC_LINKER`) or the flags.
fn links_with_rust_lld() -> bool {
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu")
        && std::env::var_os("RUSTC_LINKER").is_none()
        && !flags.contains("linker")
}
