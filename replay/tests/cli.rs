//! End-to-end runs of the `rl-replay` binary: on logs that `rl-loggen` generates (seeded mix
//! of visitors, an office behind one address, crawlers and one abusive client), on hand-written
//! edge lines, from standard input with gzip, and on bad arguments.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const ABUSER: &str = "203.0.113.66";

fn replay() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rl-replay"))
}

fn generate(lines: u64, seed: u64, format: &str) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_rl-loggen"))
        .args(["--lines", &lines.to_string(), "--seed", &seed.to_string()])
        .args(["--format", format])
        .output()
        .expect("run rl-loggen");
    assert!(out.status.success());
    out.stdout
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "rl-replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json report")).expect("json")
}

#[test]
fn generator_is_seeded() {
    let a = generate(2000, 5, "clf");
    assert_eq!(a, generate(2000, 5, "clf"));
    assert_ne!(a, generate(2000, 6, "clf"));
    assert_eq!(a.iter().filter(|&&b| b == b'\n').count(), 2000);
}

#[test]
fn generated_log_finds_the_abuser_and_draws_the_pictures() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, generate(60_000, 11, "clf")).unwrap();
    let json = dir.path().join("report.json");
    let pics = dir.path().join("pics");
    let decisions = dir.path().join("decisions.jsonl");
    let denied_keys = dir.path().join("keys.jsonl");
    let out = ok(replay()
        .arg(&log)
        .args(["-l", "GCRA 20 10 1 per {ip}"])
        .args(["-l", "WINDOW 5 60 LOG per {ip} on POST /login"])
        .args(["--suggest", "1", "--sweep", "2..200", "--steps", "12"])
        .arg("--json")
        .arg(&json)
        .arg("--out-dir")
        .arg(&pics)
        .arg("--decisions")
        .arg(&decisions)
        .arg("--keys")
        .arg(&denied_keys)
        .output()
        .unwrap());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Most limited keys of #2 WINDOW 5 60 LOG per {ip}"),
        "{text}"
    );
    assert!(text.contains("Suggested: GCRA"), "{text}");
    let r = read_json(&json);
    let input = &r["input"];
    assert_eq!(input["lines"], 60_000);
    assert_eq!(input["malformed"], 0);
    assert!(input["out_of_order"].as_u64().unwrap() > 0);
    assert_eq!(input["late"], 0);
    let n = |v: &Value| v.as_u64().unwrap();
    assert_eq!(
        n(&input["allowed"]) + n(&input["denied"]),
        n(&input["requests"])
    );
    // The login limit catches the abuser, and (nearly) only the abuser.
    let login = &r["limits"][1];
    assert_eq!(login["on"], "POST /login");
    assert_eq!(login["top"][0]["key"], ABUSER);
    assert!(n(&login["top"][0]["denied"]) > 500);
    assert!(n(&login["keys_denied"]) <= 3, "{login}");
    // Every request has its decision line.
    let lines = std::fs::read_to_string(&decisions).unwrap();
    assert_eq!(lines.lines().count(), 60_000);
    // The sweep: keys denied fall as the limit grows, and the suggestion meets the target.
    let s = &r["suggest"];
    let cands = s["candidates"].as_array().unwrap();
    assert!(cands.len() >= 8);
    let first = n(&cands[0]["keys_denied"]);
    let last = n(&cands[cands.len() - 1]["keys_denied"]);
    assert!(first > last, "{first} {last}");
    let pick = s["suggested"].as_str().unwrap();
    let c = cands.iter().find(|c| c["spec"] == pick).unwrap();
    assert!(n(&c["keys_denied"]) * 1000 <= n(&c["keys"]));
    // Refined to the exact size: the size just below it was replayed and misses the target.
    assert!(n(&s["refine_passes"]) >= 1);
    let below = cands
        .iter()
        .find(|b| n(&b["size"]) + 1 == n(&c["size"]))
        .expect("the size below the suggestion was replayed");
    assert!(n(&below["keys_denied"]) * 1000 > n(&below["keys"]));
    // --keys lists every key that saw a denial, under each limit; each limit's keys_denied
    // counts only the keys it denied itself, keys_with_a_denial those any limit denied.
    let listed = std::fs::read_to_string(&denied_keys).unwrap();
    let lines: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, l) in r["limits"].as_array().unwrap().iter().enumerate() {
        let of_limit: Vec<&Value> = lines
            .iter()
            .filter(|k| n(&k["limit"]) == i as u64 + 1)
            .collect();
        assert_eq!(of_limit.len() as u64, n(&l["keys_with_a_denial"]), "{l}");
        let by_it = of_limit
            .iter()
            .filter(|k| n(&k["denied_by_limit"]) > 0)
            .count();
        assert_eq!(by_it as u64, n(&l["keys_denied"]), "{l}");
    }
    assert!(listed.contains(ABUSER));
    // The abuser is denied by the login limit only: listed under #1, not counted by it, and
    // ranked below the keys #1 denied itself.
    let ip = &r["limits"][0];
    assert!(n(&ip["keys_denied"]) < n(&ip["keys_with_a_denial"]), "{ip}");
    let top: &Vec<Value> = ip["top"].as_array().unwrap();
    let abuser = top
        .iter()
        .position(|k| k["key"] == ABUSER)
        .expect("abuser under #1");
    assert_eq!(n(&top[abuser]["denied_by_limit"]), 0);
    assert!(top[..abuser].iter().all(|k| n(&k["denied_by_limit"]) > 0));
    assert!(text.contains("keys it denied"), "{text}");
    assert!(text.contains("(denied: by any of the limits"), "{text}");
    // The sweep's key shares are printed with the digits that show their side of the target.
    for c in cands {
        let spec = c["spec"].as_str().unwrap();
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{spec} ")))
            .unwrap_or_else(|| panic!("no sweep row for {spec}:\n{text}"));
        let shown: f64 = row
            .split('(')
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let (kd, keys) = (n(&c["keys_denied"]), n(&c["keys"]));
        let exact = (kd * 1000).cmp(&keys); // against the default target, 0.1 %
        assert_eq!(
            shown.partial_cmp(&0.1),
            Some(exact),
            "{row}: {kd} of {keys}"
        );
    }
    // Real charts: SVG with axes text and drawn shapes.
    for name in ["timeline.svg", "peaks.svg", "sweep.svg"] {
        let svg = std::fs::read_to_string(pics.join(name)).unwrap();
        assert!(svg.starts_with("<svg"), "{name}");
        assert!(svg.contains("<text") && (svg.contains("<polygon") || svg.contains("<rect")));
    }
    // The timeline names the limit that denied, in a panel of denials on their own scale.
    let timeline = std::fs::read_to_string(pics.join("timeline.svg")).unwrap();
    assert!(timeline.contains(ABUSER));
    assert!(timeline.contains("Denied requests ("), "no denials panel");
    assert!(
        timeline.contains("denied by #2 WINDOW 5 60 LOG per {ip} on POST /login"),
        "the abuser's panel names the login limit"
    );
    assert!(timeline.contains("#1 GCRA 20 10 1 per {ip}: "));
    // The peaks' bins end at the limit's lines: 6–10 and 11–20 (around 10 per second and a
    // burst of 20), not a power-of-two bin 16–31 across both.
    let peaks = std::fs::read_to_string(pics.join("peaks.svg")).unwrap();
    assert!(peaks.contains("limit: 10 per 1 s") && peaks.contains("burst: 20"));
    assert!(
        peaks.contains("6–10") || peaks.contains("11–20"),
        "bins around the limit"
    );
    assert!(!peaks.contains("16–31"));
}

#[test]
fn json_lines_and_gzip_on_standard_input_give_the_same_answer_as_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = generate(20_000, 3, "json");
    let log = dir.path().join("access.jsonl");
    std::fs::write(&log, &data).unwrap();
    let from_file = dir.path().join("file.json");
    ok(replay()
        .arg(&log)
        .args(["-l", "WINDOW 5 60 LOG per {ip} on POST /login", "-q"])
        .arg("--json")
        .arg(&from_file)
        .output()
        .unwrap());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&data).unwrap();
    let gz = gz.finish().unwrap();
    let from_stdin = dir.path().join("stdin.json");
    let mut child = replay()
        .args(["-", "-l", "WINDOW 5 60 LOG per {ip} on POST /login", "-q"])
        .arg("--json")
        .arg(&from_stdin)
        .arg("--out-dir")
        .arg(dir.path().join("pics"))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&gz).unwrap();
    assert!(child.wait().unwrap().success());
    let (a, b) = (read_json(&from_file), read_json(&from_stdin));
    assert_eq!(a["limits"], b["limits"]);
    assert_eq!(a["input"]["requests"], 20_000);
    assert_eq!(a["limits"][0]["top"][0]["key"], ABUSER);
    // The timeline came from a second pass over the spooled standard input.
    assert!(dir.path().join("pics/timeline.svg").exists());
}

const EDGE: &str = r#"2001:db8::1 - - [03/Nov/2025:10:00:00 +0000] "GET /a HTTP/1.1" 200 5 "-" "ua"
::ffff:192.0.2.1 - alice [03/Nov/2025:10:00:01 +0000] "GET /b\"c HTTP/1.1" 200 - "-" "say \"hi\" \\"
10.0.0.1 - - [03/Nov/2025:10:00:02 +0000] "GET /x HTTP/1.1" 200 9 "-" "nginx \x22escapes\x22"
10.0.0.1 - - [03/Nov/2025:10:00:02 +0000] "\x16\x03\x01\x00" 400 157 "-" "-"
10.0.0.1 - - [03/Nov/2025:10:00:03 +0000] "GET / HTTP/1.1" 200
10.0.0.1 - - [03/Nov/2025:25:00:03 +0000] "GET / HTTP/1.1" 200 1
10.0.0.1 - - [03/Nov/2025:10:00:03] "GET / HTTP/1.1" 200 1

10.0.0.1 - - [03/Nov/2025:10:00:04 +0000] "GET / HTTP/1.1 200 1
2001:db8::1 - - [03/Nov/2025:09:59:58 +0000] "GET /a HTTP/1.1" 200 5
10.0.0.2 - - [03/Nov/2025:10:00:30 +0000] "GET / HTTP/1.1" 200 1
10.0.0.2 - - [03/Nov/2025:10:00:40 +0000] "GET / HTTP/1.1" 200 1
2001:db8::1 - - [03/Nov/2025:10:00:10 +0000] "GET /a HTTP/1.1" 200 5
2001:db8::1 - - [03/Nov/2025:10:00:25 +0000] "GET /a HTTP/1.1" 200 5 "-" "-" "extra"
"#;

#[test]
fn edge_lines_are_parsed_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("edge.log");
    std::fs::write(&log, EDGE).unwrap();
    let json = dir.path().join("r.json");
    let out = ok(replay()
        .arg(&log)
        .args(["-l", "GCRA 1 1 60 per {ip}", "--skew", "5"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap());
    let text = String::from_utf8(out.stdout).unwrap();
    let r = read_json(&json);
    let input = &r["input"];
    assert_eq!(input["lines"], 14);
    assert_eq!(input["malformed"], 5, "{text}");
    assert_eq!(input["requests"], 9);
    // 09:59:58 comes after 10:00:02 (4 s back: within the 5 s skew); 10:00:10 and 10:00:25
    // come after 10:00:40, when 10:00:30 has been decided (beyond the skew: late).
    assert_eq!(input["out_of_order"], 3);
    assert_eq!(input["late"], 2);
    let examples = input["examples"].as_array().unwrap();
    let shown: Vec<(u64, &str)> = examples
        .iter()
        .map(|e| (e["line"].as_u64().unwrap(), e["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        shown,
        [
            (5, "missing bytes"),
            (6, "bad timestamp"),
            (7, "bad timestamp"),
            (8, "empty line"),
            (9, "unterminated quote in request"),
        ]
    );
    assert!(text.contains("edge.log:6: bad timestamp"), "{text}");
    // Late: earlier than a request already decided (here 10:00:30), so decided at the
    // replay's clock. 09:59:58 is out of order too, but was put back in its place.
    assert!(
        text.contains("out of order 3 (late, decided at the replay's clock: 2)"),
        "{text}"
    );
    // 2001:db8::1: 09:59:58 allowed (reordered first), 10:00:00 denied (1 per minute), and
    // the two late lines are decided at 10:00:30: denied.
    let ip = &r["limits"][0];
    let top = &ip["top"][0];
    assert_eq!(top["key"], "2001:db8::1");
    assert_eq!(
        (top["requests"].as_u64(), top["denied"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(top["first_denied"], "2025-11-03T10:00:00Z");
    assert_eq!(top["last_denied"], "2025-11-03T10:00:30Z");
    assert_eq!(ip["keys"], 4);
}

#[test]
fn bad_arguments_exit_2_and_name_the_argument() {
    let cases = [
        (vec!["-l", "GCRA 0 1 1"], "burst must be a positive integer"),
        (vec!["-l", "WINDOW 5 1e3"], "window must be seconds"),
        (vec!["-l", "GCRA 1 1 1 per ip"], "names no field"),
        (vec!["-l", "GCRA 1 1 1 on login"], "needs a path prefix"),
        (vec!["-l", "GCRA 1 1 1 on GET/x"], "'GET/x' is not a method"),
        (vec!["-l", "GCRA 1 1 1 at /x"], "unexpected 'at'"),
        (vec!["-l", "WINDOW 200000 1 LOG"], "rl.log-max-limit"),
        (
            vec!["-l", "GCRA 10 5 1 COST 2"],
            "COST is not supported by rl-replay: each log line is one request",
        ),
        (
            vec!["-l", "GCRA 1 1 1", "--suggest", "2"],
            "there are 1 limits",
        ),
        (vec!["-l", "GCRA 1 1 1", "--skew", "1e3"], "--skew"),
        (
            vec!["-l", "GCRA 1 1 1", "--json", "-", "--keys", "-"],
            "standard output named by more than one",
        ),
    ];
    for (args, want) in cases {
        let out = replay().args(&args).stdin(Stdio::null()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = replay()
        .args(["/no/such/file", "-l", "GCRA 1 1 1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/file"));
}

#[test]
fn keys_and_decisions_to_standard_output_print_json_lines_and_the_summary_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, generate(5_000, 4, "clf")).unwrap();
    for option in ["--keys", "--decisions"] {
        let out = ok(replay()
            .current_dir(dir.path())
            .arg(&log)
            .args(["-l", "GCRA 2 1 60 per {ip}", option, "-"])
            .output()
            .unwrap());
        // No file named "-" is written: the lines went to standard output.
        assert!(!dir.path().join("-").exists(), "{option}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(!stdout.is_empty(), "{option}: nothing on standard output");
        for line in stdout.lines() {
            let v: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{option}: {e}: {line}"));
            assert!(v.is_object(), "{option}: {line}");
        }
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains("rl-replay: 5,000 lines"),
            "{option}: summary on stderr: {stderr}"
        );
    }
}

/// The rotated logs and the JSON log that `--help`'s examples name, in `dir`:
/// `access.log.2.gz` (oldest), `access.log.1.gz`, `access.log.gz`, `access.log` (newest, an
/// hour apart each), and `app.jsonl` with its time under `ts` and its client under
/// `request.remote_ip`.
fn write_example_logs(dir: &Path) {
    let clf = |start: u64| -> Vec<u8> {
        let out = Command::new(env!("CARGO_BIN_EXE_rl-loggen"))
            .args([
                "--lines",
                "3000",
                "--seed",
                "4",
                "--start",
                &start.to_string(),
            ])
            .output()
            .expect("run rl-loggen");
        assert!(out.status.success());
        out.stdout
    };
    let gzip = |data: &[u8]| -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    };
    let t0 = 1_762_128_000;
    std::fs::write(dir.join("access.log.2.gz"), gzip(&clf(t0))).unwrap();
    std::fs::write(dir.join("access.log.1.gz"), gzip(&clf(t0 + 3600))).unwrap();
    std::fs::write(dir.join("access.log.gz"), gzip(&clf(t0 + 7200))).unwrap();
    std::fs::write(dir.join("access.log"), clf(t0 + 10_800)).unwrap();
    let mut app = String::new();
    for line in String::from_utf8(generate(3000, 4, "json"))
        .unwrap()
        .lines()
    {
        let v: Value = serde_json::from_str(line).unwrap();
        let moved = serde_json::json!({
            "ts": v["msec"],
            "request": { "remote_ip": v["remote_addr"], "line": v["request"] },
            "status": v["status"],
        });
        app.push_str(&moved.to_string());
        app.push('\n');
    }
    std::fs::write(dir.join("app.jsonl"), app).unwrap();
}

#[test]
fn help_examples_run_as_written_and_read_their_logs_in_time_order() {
    let help = ok(replay().arg("--help").output().unwrap());
    let help = String::from_utf8(help.stdout).unwrap();
    let examples: Vec<&str> = help
        .split("Examples:\n")
        .nth(1)
        .expect("an Examples section")
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    assert!(examples.len() >= 4, "{examples:?}");
    let dir = tempfile::tempdir().unwrap();
    write_example_logs(dir.path());
    // `rl-replay` on the PATH, as an installed binary would be.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rl-replay"), bin.join("rl-replay")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, example) in examples.iter().enumerate() {
        let json = dir.path().join(format!("example-{i}.json"));
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{example} -q --json {}", json.display()))
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let input = read_json(&json)["input"].clone();
        assert!(
            input["requests"].as_u64().unwrap() >= 3000,
            "{example}: {input}"
        );
        assert_eq!(input["malformed"], 0, "{example}");
        // Logs fed newest first would be decided at the wrong times: every line late.
        assert_eq!(input["late"], 0, "{example}: logs out of time order");
    }
}

#[test]
fn a_suggestion_needs_keys_to_judge() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("empty.log");
    std::fs::write(&log, "").unwrap();
    let json = dir.path().join("r.json");
    let out = ok(replay()
        .arg(&log)
        .args(["-l", "GCRA 20 10 1 per {ip}", "--suggest"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap());
    let text = String::from_utf8(out.stdout).unwrap();
    let r = read_json(&json);
    assert_eq!(r["suggest"]["suggested"], Value::Null, "{text}");
    assert!(!text.contains("Suggested:"), "{text}");
    assert!(
        text.contains("No suggestion: limit #1 applied to no request: nothing to suggest."),
        "{text}"
    );
}

/// Every field name in `v` (objects inside arrays and objects too).
fn field_names(v: &Value, out: &mut std::collections::BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                out.insert(k.clone());
                field_names(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| field_names(v, out)),
        _ => {}
    }
}

#[test]
fn every_json_field_is_documented() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/json.md");
    let doc = std::fs::read_to_string(&doc_path).expect("replay/docs/json.md");
    let section = |flag: &str| -> String {
        let start = doc
            .find(&format!("## `{flag}"))
            .unwrap_or_else(|| panic!("json.md has no section for {flag}"));
        let rest = &doc[start + 3..];
        rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut data = generate(20_000, 2, "clf");
    data.extend_from_slice(b"not a log line\n");
    std::fs::write(&log, data).unwrap();
    let (json, keys, decisions) = (
        dir.path().join("r.json"),
        dir.path().join("keys.jsonl"),
        dir.path().join("decisions.jsonl"),
    );
    ok(replay()
        .arg(&log)
        .args(["-l", "GCRA 20 10 1 per {ip}"])
        .args(["-l", "WINDOW 5 60 LOG per {ip} on POST /login", "-q"])
        .args(["--suggest", "--steps", "6"])
        .arg("--json")
        .arg(&json)
        .arg("--keys")
        .arg(&keys)
        .arg("--decisions")
        .arg(&decisions)
        .output()
        .unwrap());
    let mut report = std::collections::BTreeSet::new();
    field_names(&read_json(&json), &mut report);
    let lines = |path: &Path| {
        let mut names = std::collections::BTreeSet::new();
        for line in std::fs::read_to_string(path).unwrap().lines() {
            field_names(&serde_json::from_str(line).unwrap(), &mut names);
        }
        names
    };
    for (flag, names) in [
        ("--json", report),
        ("--keys", lines(&keys)),
        ("--decisions", lines(&decisions)),
    ] {
        assert!(names.len() > 5, "{flag}: {names:?}");
        let text = section(flag);
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !text.contains(&format!("`{n}`")))
            .collect();
        assert!(missing.is_empty(), "{flag}: undocumented {missing:?}");
    }
}

#[test]
fn a_gzip_log_cut_short_is_replayed_up_to_the_cut_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = generate(20_000, 8, "clf");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&data).unwrap();
    let gz = gz.finish().unwrap();
    // Copied while logrotate was still compressing it: the second half is missing.
    let cut = dir.path().join("access.log.1.gz");
    std::fs::write(&cut, &gz[..gz.len() / 2]).unwrap();
    let next = dir.path().join("access.log");
    std::fs::write(
        &next,
        "10.9.9.9 - - [04/Nov/2025:00:00:00 +0000] \"GET / HTTP/1.1\" 200 1\n",
    )
    .unwrap();
    let json = dir.path().join("r.json");
    let out = ok(replay()
        .arg(&cut)
        .arg(&next)
        .args(["-l", "GCRA 20 10 1 per {ip}"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap());
    let text = String::from_utf8(out.stdout).unwrap();
    let r = read_json(&json);
    let input = &r["input"];
    let lines = input["lines"].as_u64().unwrap();
    // Every whole line before the cut was replayed, and the next file too.
    assert!(lines > 2_000 && lines < 20_000, "{input}");
    assert_eq!(input["malformed"], 1, "{input}");
    assert_eq!(input["requests"].as_u64().unwrap(), lines - 1);
    assert!(r["limits"][0]["keys"].as_u64().unwrap() > 100, "{r}");
    let damaged = &input["damaged"][0];
    assert!(damaged["source"]
        .as_str()
        .unwrap()
        .ends_with("access.log.1.gz"));
    assert_eq!(damaged["line"].as_u64().unwrap(), lines - 1);
    let reason = damaged["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("gzip data cut short or damaged"),
        "{reason}"
    );
    assert!(
        text.contains(&format!(
            "access.log.1.gz:{}: gzip data cut short or damaged",
            lines - 1
        )) && text.contains("the rest of this input is lost"),
        "{text}"
    );
}
