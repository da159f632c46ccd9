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
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
