//! Copies each ```rust block of the repository's README.md, as written, to
//! `$OUT_DIR/snippet_<n>.rs` (n counted from 0, in README order), and writes
//! `$OUT_DIR/snippets.rs`: one module per block, `SNIPPETS` (each block's number and a way to
//! its `main`), and `README_RUST_HASH`, by which `tests/readme.rs` tells whether this build
//! holds the README's current blocks. Each block is a whole program: its `main` returns
//! `Result<(), Box<dyn Error>>`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    println!("cargo:rerun-if-changed={}", readme_path.display());
    let readme = std::fs::read_to_string(&readme_path).expect("README.md");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let blocks = rust_blocks(&readme);
    let mut generated = String::new();
    let mut table = String::new();
    for (n, block) in blocks.iter().enumerate() {
        let file = out.join(format!("snippet_{n}.rs"));
        // The block as written, then a way for the dispatcher to reach its private `main`.
        let shim =
            "\npub(crate) fn run() -> Result<(), Box<dyn std::error::Error>> {\n    main()\n}\n";
        std::fs::write(&file, format!("{block}{shim}")).expect("write a snippet");
        writeln!(
            generated,
            "#[path = {:?}]\nmod snippet_{n};",
            file.display().to_string()
        )
        .unwrap();
        writeln!(table, "    ({n}, snippet_{n}::run),").unwrap();
    }
    writeln!(
        generated,
        "/// A block's `main`.\n\
         pub type Main = fn() -> Result<(), Box<dyn std::error::Error>>;\n\
         /// Each README block's number and its `main`.\n\
         pub const SNIPPETS: &[(usize, Main)] = &[\n{table}];\n\
         /// FNV-1a of the README's ```rust blocks, each followed by a NUL byte.\n\
         pub const README_RUST_HASH: u64 = {};",
        fnv1a(&blocks)
    )
    .unwrap();
    std::fs::write(out.join("snippets.rs"), generated).expect("write snippets.rs");
}

/// The text of every block fenced as ```rust, in order (tests/readme.rs reads them alike).
fn rust_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match current.as_mut() {
            None if line == "```rust" => current = Some(String::new()),
            Some(_) if line == "```" => blocks.extend(current.take()),
            Some(text) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// FNV-1a (64-bit) of the blocks, each followed by a NUL byte.
fn fnv1a(blocks: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in blocks.iter().flat_map(|b| b.bytes().chain([0])) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
