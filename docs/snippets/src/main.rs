//! The README's Rust snippets as one program, built from README.md by `build.rs`:
//! `readme-snippets N` runs the N-th ```rust block (counted from 0) as written, with the
//! environment it is given (`REDIS_URL`); `readme-snippets --hash` prints the hash of the
//! blocks it was built from. `tests/readme.rs` runs each block and checks what it prints.

use std::process::ExitCode;

include!(concat!(env!("OUT_DIR"), "/snippets.rs"));

fn main() -> ExitCode {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg == "--hash" {
        println!("{README_RUST_HASH}");
        return ExitCode::SUCCESS;
    }
    let Some((_, run)) = SNIPPETS.iter().find(|(n, _)| n.to_string() == arg) else {
        eprintln!(
            "usage: readme-snippets N (N from 0 to {}) | --hash",
            SNIPPETS.len().saturating_sub(1)
        );
        return ExitCode::from(2);
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("README snippet {arg}: {e}");
            ExitCode::FAILURE
        }
    }
}
