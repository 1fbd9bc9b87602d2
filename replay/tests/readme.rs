//! The READMEs' rl-replay worked example, run as written: replay/README.md's, and the
//! repository README's while it keeps one. Its commands run in a shell, from a directory whose
//! `target/replay` holds the binaries this test was built with (what
//! `cargo build --profile replay -p rl-replay` leaves in the workspace). Every line of the
//! output the README shows must be printed (the replay time aside), and the pictures it shows
//! must be the ones the commands draw.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fenced code blocks of the README's section under `heading`, in order.
fn worked_example_blocks(readme: &str, heading: &str) -> Vec<String> {
    let start = readme.find(heading).expect("README has a worked example");
    let section = &readme[start..];
    let end = section[4..].find("\n#").map_or(section.len(), |e| e + 4);
    section[..end]
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|b| {
            b.trim_start_matches(|c: char| c.is_ascii_alphanumeric())
                .to_owned()
        })
        .collect()
}

/// The value after `flag` in a command text.
fn after<'a>(commands: &'a str, flag: &str) -> &'a str {
    let rest = &commands[commands.find(flag).expect(flag) + flag.len()..];
    rest.split_whitespace().next().expect(flag)
}

/// Runs the worked example of the README at `path` (relative to the repository) under
/// `heading`, and checks its output and its pictures `names`, which the README shows from
/// `pictures` (a path relative to the README).
fn worked_example_runs_as_written(path: &str, heading: &str, pictures: &str, names: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join(path)).expect(path);
    let blocks = worked_example_blocks(&readme, heading);
    assert!(blocks.len() >= 2, "{path}: a command block and its output");
    let (commands, shown) = (&blocks[0], &blocks[1]);

    let dir = tempfile::tempdir().unwrap();
    let bins: PathBuf = Path::new(env!("CARGO_BIN_EXE_rl-replay"))
        .parent()
        .unwrap()
        .to_path_buf();
    std::fs::create_dir(dir.path().join("target")).unwrap();
    std::os::unix::fs::symlink(&bins, dir.path().join("target/replay")).unwrap();
    let out = Command::new("sh")
        .args(["-e", "-c", commands])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{path}: the commands failed:\n{commands}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each line shown, in order (lines elided with "…" aside; the first line up to the
    // replay time, which varies).
    let printed: Vec<&str> = stdout.lines().collect();
    let mut at = 0;
    for want in shown.lines().filter(|l| l.trim() != "…" && !l.is_empty()) {
        let want = want.split("; replayed in").next().unwrap();
        match printed[at..].iter().position(|l| l.starts_with(want)) {
            Some(i) => at += i + 1,
            None => {
                panic!("{path} shows\n{want}\nwhich the run did not print (in order):\n{stdout}")
            }
        }
    }
    // The pictures the README shows are the ones the run draws.
    let out_dir = dir.path().join(after(commands, "--out-dir"));
    for name in names {
        let shown = format!("]({pictures}{name})");
        assert!(readme.contains(&shown), "{path} shows {name}");
        let drawn = std::fs::read(out_dir.join(name)).expect(name);
        let committed = std::fs::read(root.join("replay/docs").join(name)).unwrap();
        assert!(
            drawn == committed,
            "replay/docs/{name} is not what the worked example draws: copy {} there",
            out_dir.join(name).display()
        );
    }
}

#[test]
fn replay_readme_worked_example_runs_as_written() {
    worked_example_runs_as_written(
        "replay/README.md",
        "## A worked example",
        "docs/",
        &["timeline.svg", "peaks.svg", "sweep.svg"],
    );
}

#[test]
fn readme_worked_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    if !readme.contains("### A worked example") {
        return; // the README links to replay/README.md instead
    }
    worked_example_runs_as_written(
        "README.md",
        "### A worked example",
        "replay/docs/",
        &["timeline.svg", "sweep.svg"],
    );
}
