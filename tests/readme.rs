//! README.md's examples, run as written against real servers, and what they print compared
//! with what the README shows:
//!
//! * `redis-cli` transcripts (lines after a `127.0.0.1:6379> ` prompt): each command is sent
//!   by the real `redis-cli --no-raw` and its output must be the lines shown, exactly;
//! * ```python blocks: run by the Python that has the package installed (`$RL_PYTHON`, else
//!   `.venv-py/bin/python`, which `make test` fills), as a file;
//! * ```rust blocks: compiled as written into `target/clients/readme-snippets` (the crate in
//!   `docs/snippets/`, built by `make test`; `$RL_README_SNIPPETS` names another build),
//!   which runs one block per call;
//! * ```sh blocks of the five jobs: run by `sh -e` from the repository root; the install
//!   block's `redis-server --loadmodule` line is run as written, with a free port appended.
//!
//! A block's output is the ```text block right after it: its lines must be printed, exactly
//! (trailing spaces aside). Every example gets `REDIS_URL` pointing at the test's server and
//! runs on a frozen clock (the module's and the Lua fallback's replies are then exact, however
//! slowly the machine runs): the module server for every job but the last two, where Redis is
//! stopped (job 4) or has no module (job 5); each example of jobs 1 to 3 runs once more on the
//! server without the module, where the client packages use the Lua fallback, and must print
//! the same. The checks of the README's promises: every Python and Rust example reads
//! `REDIS_URL` (default `redis://127.0.0.1:6379`) and states its failure policy with a comment
//! beside it; every shell example reads `REDIS_URL`; every example of a job shows what it
//! prints, and each job shows a 429.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, module_path, now_ns, q, Clock, Server};

const README: &str = include_str!("../README.md");
/// The prompt of a transcript line.
const PROMPT: &str = "127.0.0.1:6379> ";
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
/// How long one example may run (a bound against a hang, not a measure: it prints the same
/// however slowly it runs).
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(300);
/// A day in nanoseconds: the frozen clock stands at a day's start, so every window in the
/// examples (a minute, a day) starts there too, and each run prints the same figures.
const DAY_NS: u64 = 86_400_000_000_000;

/// One fenced block of the README.
#[derive(Debug)]
struct Block {
    /// The `### ` heading it is under ("" before the first).
    heading: String,
    /// The `## ` heading it is under.
    section: String,
    /// The fence's info string (`python`, `rust`, `sh`, `text`, or empty).
    lang: String,
    text: String,
    /// Its first line's number in README.md.
    line: usize,
    /// The ```text block right after it (only blank lines between), if any.
    output: Option<String>,
}

fn blocks() -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    let (mut section, mut heading) = (String::new(), String::new());
    let mut open: Option<Block> = None;
    // Whether only blank lines came since the last block closed.
    let mut adjacent = false;
    for (i, line) in README.lines().enumerate() {
        if let Some(block) = open.as_mut() {
            if line == "```" {
                let block = open.take().unwrap();
                match out.last_mut() {
                    Some(prev) if adjacent && block.lang == "text" && prev.output.is_none() => {
                        prev.output = Some(block.text.clone());
                        out.push(block);
                    }
                    _ => out.push(block),
                }
                adjacent = true;
            } else {
                block.text.push_str(line);
                block.text.push('\n');
            }
            continue;
        }
        if let Some(lang) = line.strip_prefix("```") {
            open = Some(Block {
                heading: heading.clone(),
                section: section.clone(),
                lang: lang.to_owned(),
                text: String::new(),
                line: i + 2,
                output: None,
            });
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            section = h.to_owned();
            heading.clear();
        } else if let Some(h) = line.strip_prefix("### ") {
            heading = h.to_owned();
        }
        if !line.trim().is_empty() {
            adjacent = false;
        }
    }
    assert!(open.is_none(), "README.md: a fence is not closed");
    out
}

/// The job a block belongs to (1 to 5), or None outside "Five common jobs".
fn job(b: &Block) -> Option<u8> {
    if b.section != "Five common jobs" {
        return None;
    }
    let n = b.heading.split('.').next()?.parse().ok()?;
    assert!((1..=5).contains(&n), "README.md:{}: job {n}?", b.line);
    Some(n)
}

fn is_transcript(b: &Block) -> bool {
    b.lang.is_empty() && b.text.starts_with(PROMPT)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with the package installed.
fn python() -> PathBuf {
    let p = std::env::var_os("RL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-py/bin/python"));
    assert!(
        p.exists(),
        "no Python with the package at {}: `python3 -m venv .venv-py && .venv-py/bin/pip install \
         './clients/python[test]'` (make test does it), or set RL_PYTHON",
        p.display()
    );
    p
}

/// The build of the README's Rust blocks, checked to hold the README's current blocks.
fn snippets_binary() -> PathBuf {
    let p = std::env::var_os("RL_README_SNIPPETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/clients/readme-snippets"));
    let rebuild = "`cargo build --profile clients -p readme-snippets` (make test does it)";
    assert!(p.exists(), "no {}: {rebuild}", p.display());
    let out = Command::new(&p)
        .arg("--hash")
        .output()
        .expect("run readme-snippets");
    let built = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        built,
        rust_hash().to_string(),
        "{} was built from other README blocks: {rebuild}",
        p.display()
    );
    p
}

/// FNV-1a of the README's ```rust blocks, each followed by a NUL byte (docs/snippets/build.rs
/// computes the same over what it compiles).
fn rust_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in blocks().iter().filter(|b| b.lang == "rust") {
        for byte in b.text.bytes().chain([0]) {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Runs `cmd` to its end (within EXAMPLE_DEADLINE) and returns its stdout; panics with its
/// output if it fails.
fn run(what: &str, mut cmd: Command) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let deadline = Instant::now() + EXAMPLE_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {EXAMPLE_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        status.success(),
        "{what} failed ({status}):\n{stdout}\n{stderr}"
    );
    stdout
}

/// Whether `printed` is `shown`, line by line, trailing spaces aside.
fn same_lines(printed: &str, shown: &str) -> bool {
    let lines = |s: &str| -> Vec<String> { s.lines().map(|l| l.trim_end().to_owned()).collect() };
    lines(printed) == lines(shown)
}

fn url(s: &Server) -> String {
    format!("redis://127.0.0.1:{}", s.port)
}

/// The servers the examples run on, on one frozen clock.
struct Servers {
    module: Server,
    plain: Server,
    /// A server that was started and stopped: "Redis is down".
    stopped: Server,
    /// Kept while the servers run (dropped after them: the shim maps its file).
    _clock: Clock,
}

impl Servers {
    /// None where the clock shim cannot govern the server (Valkey 9.1): there the test says
    /// SKIPPED (make test runs it on Redis 7.0).
    fn start() -> Option<Servers> {
        let clock = Clock::new();
        let module = Server::builder().clock(&clock).start();
        if !clock.governs(&mut module.conn()) {
            return None;
        }
        clock.freeze_at(now_ns() / DAY_NS * DAY_NS);
        let plain = Server::builder().no_module().clock(&clock).start();
        let mut stopped = Server::builder().no_module().start();
        stopped.stop();
        Some(Servers {
            module,
            plain,
            stopped,
            _clock: clock,
        })
    }

    /// Empties a server before an example: its keys, and (before a client example or a shell
    /// block, which load the Lua library themselves) its functions.
    fn fresh(s: &Server, functions: bool) {
        let mut c = s.conn();
        let _: () = q(&mut c, &["FLUSHALL"]);
        if functions {
            let _: () = q(&mut c, &["FUNCTION", "FLUSH"]);
        }
    }
}

/// Runs a transcript's commands through redis-cli and checks each command's output.
fn check_transcript(b: &Block, s: &Server) {
    let mut steps: Vec<(String, String)> = Vec::new();
    for line in b.text.lines() {
        match line.strip_prefix(PROMPT) {
            Some(command) => steps.push((command.to_owned(), String::new())),
            None => {
                let (_, shown) = steps.last_mut().expect("a transcript starts with a prompt");
                shown.push_str(line);
                shown.push('\n');
            }
        }
    }
    for (command, shown) in steps {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-u", &url(s), "--no-raw"]);
        // redis-cli reads the command from standard input as its prompt would.
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        std::fs::write(&input, format!("{command}\n")).unwrap();
        let what = format!("README.md:{}: redis-cli {command}", b.line);
        let child = cmd
            .stdin(std::fs::File::open(&input).unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let out = child.wait_with_output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            same_lines(&printed, &shown),
            "{what} printed\n{printed}\nwhere the README shows\n{shown}"
        );
    }
}

/// Runs a Python, Rust or shell example against `target` and checks what it printed.
fn check_example(b: &Block, target: &Server, on: &str) {
    let what = format!("README.md:{} ({} example, {on})", b.line, b.lang);
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = match b.lang.as_str() {
        "python" => {
            let file = dir.path().join("example.py");
            std::fs::write(&file, &b.text).unwrap();
            let mut cmd = Command::new(python());
            cmd.arg(file).current_dir(dir.path());
            cmd
        }
        "rust" => {
            let n = blocks()
                .iter()
                .filter(|o| o.lang == "rust")
                .position(|o| o.line == b.line)
                .unwrap();
            let mut cmd = Command::new(snippets_binary());
            cmd.arg(n.to_string()).current_dir(dir.path());
            cmd
        }
        "sh" => {
            let mut cmd = Command::new("sh");
            cmd.args(["-e", "-c", &b.text]).current_dir(root());
            cmd
        }
        other => panic!("{what}: no way to run a ```{other} block"),
    };
    cmd.env("REDIS_URL", url(target)).env_remove("RUST_LOG");
    let printed = run(&what, cmd);
    if let Some(shown) = &b.output {
        assert!(
            same_lines(&printed, shown),
            "{what} printed\n{printed}\nwhere the README shows\n{shown}"
        );
    }
}

#[test]
fn every_example_of_the_readme_runs_as_written() {
    let Some(servers) = Servers::start() else {
        return;
    };
    let all = blocks();
    let mut ran = 0;
    for b in &all {
        let Some(job) = job(b) else { continue };
        if b.lang == "text" {
            continue;
        }
        if is_transcript(b) {
            let s = if job == 5 {
                &servers.plain
            } else {
                &servers.module
            };
            // A transcript goes on from the shell block before it in its job (job 5 loads the
            // library by hand), so only the keys are emptied.
            Servers::fresh(s, false);
            check_transcript(b, s);
            eprintln!("README.md:{}: the transcript ran", b.line);
            ran += 1;
            continue;
        }
        let targets: Vec<(&Server, &str)> = match job {
            4 => vec![(&servers.stopped, "Redis stopped")],
            5 => vec![(&servers.plain, "no module: the Lua fallback")],
            _ => vec![
                (&servers.module, "the module"),
                (&servers.plain, "no module: the Lua fallback"),
            ],
        };
        for (s, on) in targets {
            if job != 4 {
                Servers::fresh(s, true);
            }
            check_example(b, s, on);
            eprintln!("README.md:{}: the {} example ran on {on}", b.line, b.lang);
            ran += 1;
        }
        if b.lang == "sh" && job == 5 {
            // The library it loaded answers.
            let version: String = q(&mut servers.plain.conn(), &["FCALL_RO", "rl_version", "0"]);
            assert!(!version.is_empty());
        }
    }
    assert!(ran >= 10, "only {ran} examples found in the five jobs");
}

#[test]
fn every_example_reads_redis_url_and_states_its_failure_policy() {
    for b in blocks().iter().filter(|b| job(b).is_some()) {
        let at = format!("README.md:{} ({})", b.line, b.heading);
        let lines: Vec<&str> = b.text.lines().collect();
        // The line naming the failure policy, or the line before it, says why.
        let policy_explained = |name: &str, comment: &str| {
            lines.iter().enumerate().any(|(i, l)| {
                l.contains(name)
                    && (l.contains(comment) || (i > 0 && lines[i - 1].contains(comment)))
            })
        };
        match b.lang.as_str() {
            "python" => {
                assert!(
                    b.text
                        .contains(&format!("os.environ.get(\"REDIS_URL\", \"{DEFAULT_URL}\")")),
                    "{at}: a Python example reads REDIS_URL"
                );
                assert!(
                    policy_explained("on_error", "#"),
                    "{at}: a Python example states its on_error and why"
                );
            }
            "rust" => {
                assert!(
                    b.text.contains("std::env::var(\"REDIS_URL\")")
                        && b.text.contains(&format!("\"{DEFAULT_URL}\"")),
                    "{at}: a Rust example reads REDIS_URL"
                );
                assert!(
                    policy_explained(".on_error(", "//"),
                    "{at}: a Rust example states its on_error and why"
                );
            }
            "sh" => assert!(
                b.text.contains(&format!("${{REDIS_URL:-{DEFAULT_URL}}}")),
                "{at}: a shell example reads REDIS_URL"
            ),
            _ => {}
        }
        if matches!(b.lang.as_str(), "python" | "rust") {
            assert!(b.output.is_some(), "{at}: an example shows what it prints");
        }
    }
}

#[test]
fn each_of_the_five_jobs_shows_its_429() {
    let all = blocks();
    for n in 1..=5 {
        let shown = all.iter().filter(|b| job(b) == Some(n)).any(|b| {
            b.output.as_deref().is_some_and(|o| o.contains("429"))
                || (is_transcript(b) && b.text.contains("1) (integer) 0"))
        });
        assert!(shown, "README.md: job {n} shows no 429");
    }
}

#[test]
fn the_install_commands_build_and_load_the_module() {
    let install = blocks()
        .into_iter()
        .find(|b| b.section == "Install" && b.lang == "sh")
        .expect("an install block");
    let lines: Vec<&str> = install
        .text
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    // The build is make test's own first step (scripts/test.sh); the module it names is the
    // one under test.
    assert_eq!(lines[0], "cargo build --release");
    let load = lines[1];
    let words: Vec<&str> = load.split_whitespace().collect();
    assert_eq!(words[..2], ["redis-server", "--loadmodule"], "{load}");
    assert_eq!(
        root().join(words[2]).canonicalize().unwrap(),
        module_path().canonicalize().unwrap(),
        "the README loads the module under test"
    );
    // Run as written from the repository root, on a free port (no --dir: the server would
    // change to it before loading the module's relative path; with no persistence it writes
    // nothing where it runs).
    let port = free_port();
    let mut child = Command::new(common::server_binary())
        .args(&words[1..])
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .current_dir(root())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    let modules = loop {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "MODULE", "LIST"])
            .output()
            .expect("redis-cli");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.starts_with("name") {
            break text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("`{load}` exited ({status})");
        }
        assert!(
            Instant::now() < deadline,
            "the server did not answer: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    // redis-cli's raw form: "name", then a module's name, on lines of their own. Other modules
    // may be listed too (Valkey 9.1 loads its Lua engine as the module `lua`).
    let lines: Vec<&str> = modules.lines().collect();
    let names: Vec<&str> = lines
        .windows(2)
        .filter(|pair| pair[0] == "name")
        .map(|pair| pair[1])
        .collect();
    assert!(names.contains(&"rl"), "{modules}");
}

/// The anchor GitHub gives a heading (as scripts/check-reference.py computes it): lower case,
/// backticks and punctuation dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (a repeated heading gets `-1`, `-2`, …).
fn anchors(markdown: &str) -> std::collections::HashSet<String> {
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    let mut out = std::collections::HashSet::new();
    let mut code = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            code = !code;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if code || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The README's and docs/internals.md's links point at files that exist and, with an anchor,
/// at a heading there (the client packages' READMEs, the reference, BENCHMARKS.md, …): a
/// section moved or renamed elsewhere fails here, not in a reader's browser.
#[test]
fn every_link_of_the_readme_and_the_internals_points_somewhere() {
    let mut problems = Vec::new();
    for doc in ["README.md", "docs/internals.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let dir = root().join(doc).parent().unwrap().to_path_buf();
        let mut code = false;
        for (n, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                code = !code;
            }
            if code {
                continue;
            }
            for link in line.split("](").skip(1) {
                let Some(target) = link.split(')').next() else {
                    continue;
                };
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    root().join(doc)
                } else {
                    dir.join(path)
                };
                let at = format!("{doc}:{}: ({target})", n + 1);
                if !file.exists() {
                    problems.push(format!("{at}: no {}", file.display()));
                } else if !anchor.is_empty() {
                    let md = std::fs::read_to_string(&file).unwrap_or_default();
                    if !anchors(&md).contains(anchor) {
                        problems.push(format!("{at}: no such heading"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
