#!/usr/bin/env python3
"""Keeps docs/reference.md honest.

Checks, for every rule (a `#### R-…` heading) of the reference:

* it has an "Implemented in" line whose files exist (linked as `../path`) and whose names occur
  in them (each `A::b` segment as a word; a lower-case name must be defined there as a
  function: `fn`, `def` or `function`);
* it has a "Proved by" line naming tests that exist and are tests (`file::name` or
  `file::tests::name`: a Rust `fn name` under `#[test]`, a Python `def test_…`, a Go
  `func TestName(t *testing.T)` in a `_test.go` file), or saying
  "none yet", in which case the rule is listed under "Rules without a test" (and only then);
* no rule id is used twice.

And, outside the rules:

* every `#anchor` link of the reference, and every link into another markdown file of the
  repository (`../README.md#anchor`, `internals.md#anchor`, …), points at a file and heading;
* every `docs/reference.md#anchor` cited in the code (Rust, Python, Go, Lua, …), the tests,
  the scripts and the README points at a heading of the reference;
* no file there cites `SPEC.md`, a file that is not in the repository.

Prints one summary line in the form `make test` counts, and exits 1 on any problem.
Run from anywhere: `python3 scripts/check-reference.py`.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = "docs/reference.md"
# Where code cites the reference (and must not cite SPEC.md).
CITING_TREES = ["src", "tests", "replay", "bench", "clients", "scripts", "examples", "fuzz"]
CITING_FILES = ["README.md", "BENCHMARKS.md", "Makefile"]
SKIP_DIRS = {"target", ".venv", ".venv-py", ".venv-compat", "node_modules", "__pycache__",
             ".git", "corpus", "artifacts", ".mypy_cache", ".pytest_cache", "build", "dist"}
TEXT_EXT = (".rs", ".py", ".go", ".lua", ".md", ".sh", ".toml", ".c", ".mjs", ".js", ".txt")

problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown):
    out = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if m:
            base = slug(m.group(2))
            n = out.get(base, 0)
            out[base] = n + 1
            if n:
                out[f"{base}-{n}"] = 1
    return set(out)


def defined(text, name):
    """Whether `name` is defined as a function in `text` (Rust, Python or Lua)."""
    return re.search(rf"\b(fn|def|function)\s+{re.escape(name)}\b", text) is not None


def check_names(where, path, names):
    text = read(path)
    for name in names:
        segments = name.split("::")
        for seg in segments:
            if not re.search(rf"\b{re.escape(seg)}\b", text):
                problem(where, f"`{name}`: '{seg}' does not occur in {path}")
                break
        else:
            last = segments[-1]
            if last[:1].islower() and not defined(text, last):
                problem(where, f"`{name}`: no function '{last}' is defined in {path}")


def is_rust_test(lines, index):
    """Whether the `fn` on line `index` carries a #[test] attribute."""
    j = index - 1
    while j >= 0:
        s = lines[j].strip()
        if s.startswith("#[") or s.startswith("//") or s == "":
            if re.match(r"#\[(\w+::)?test\b", s):
                return True
            j -= 1
            continue
        return False
    return False


def check_test(where, ref):
    m = re.match(r"^([\w./-]+\.(rs|py|go))::(.+)$", ref)
    if not m:
        problem(where, f"`{ref}` is not of the form file::test")
        return
    path, ext, rest = m.group(1), m.group(2), m.group(3)
    parts = rest.split("::")
    name = parts[-1]
    if not os.path.isfile(os.path.join(ROOT, path)):
        problem(where, f"`{ref}`: no file {path}")
        return
    text = read(path)
    if ext == "go":
        # go test runs the top-level func TestXxx(t *testing.T) of a _test.go file.
        if not path.endswith("_test.go"):
            problem(where, f"`{ref}`: a Go test is in a _test.go file")
        if not re.fullmatch(r"Test[A-Z0-9_]\w*", rest):
            problem(where, f"`{ref}`: a Go test's name is TestXxx (a top-level test, no ::)")
        elif not re.search(rf"^func\s+{re.escape(rest)}\s*\(\s*\w+\s+\*testing\.T\s*\)", text, re.M):
            problem(where, f"`{ref}`: no func {rest}(t *testing.T) in {path}")
        return
    if ext == "py":
        if not name.startswith("test_"):
            problem(where, f"`{ref}`: a pytest test's name starts with test_")
        if not re.search(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(", text, re.M):
            problem(where, f"`{ref}`: no test function {name} in {path}")
        return
    for module in parts[:-1]:
        if not re.search(rf"\bmod\s+{re.escape(module)}\b", text):
            problem(where, f"`{ref}`: no module '{module}' in {path}")
    lines = text.splitlines()
    found = [i for i, l in enumerate(lines)
             if re.match(rf"^\s*(pub\s+)?(async\s+)?fn\s+{re.escape(name)}\s*[(<]", l)]
    if not found:
        problem(where, f"`{ref}`: no fn {name} in {path}")
    elif not any(is_rust_test(lines, i) for i in found):
        problem(where, f"`{ref}`: fn {name} in {path} is not a #[test]")


def check_reference():
    doc = read(REFERENCE)
    own_anchors = anchors(doc)
    lines = doc.splitlines()

    # Split into rule blocks.
    rules = {}
    order = []
    current = None
    for n, line in enumerate(lines, 1):
        m = re.match(r"^#{1,6}\s", line)
        if m:
            r = re.match(r"^####\s+(R-[A-Z0-9]+-\d+)\s*$", line)
            if r:
                rid = r.group(1)
                if rid in rules:
                    problem(f"{REFERENCE}:{n}", f"rule {rid} defined twice")
                current = rid
                rules[rid] = {"line": n, "impl": [], "proved": None, "tests": []}
                order.append(rid)
            else:
                if line.startswith("####"):
                    problem(f"{REFERENCE}:{n}", f"a level-4 heading that is not a rule id: {line}")
                current = None
            continue
        if current is None:
            continue
        rule = rules[current]
        where = f"{REFERENCE}:{n} ({current})"
        if line.startswith("- **Implemented in:**"):
            entries = re.findall(r"\[`([^`]+)`\]\(([^)]+)\)\s*—\s*((?:`[^`]+`(?:,\s*)?)+)", line)
            if not entries:
                problem(where, "an Implemented-in line names no file and function")
            for path, link, names in entries:
                if link != "../" + path:
                    problem(where, f"link {link} does not point at {path}")
                if not os.path.isfile(os.path.join(ROOT, path)):
                    problem(where, f"no file {path}")
                    continue
                check_names(where, path, re.findall(r"`([^`]+)`", names))
                rule["impl"].append(path)
        elif line.startswith("- **Proved by:**"):
            body = line[len("- **Proved by:**"):]
            rule["proved"] = "none" if body.strip().startswith("none yet") else "tests"
            refs = re.findall(r"`([^`]+)`", body)
            for ref in refs:
                check_test(where, ref)
            rule["tests"].extend(refs)
            if rule["proved"] == "tests" and not refs:
                problem(where, "a Proved-by line names no test")

    # Every rule: implemented and proved (or listed as without a test).
    untested = {rid for rid, r in rules.items() if r["proved"] == "none"}
    for rid in order:
        r = rules[rid]
        where = f"{REFERENCE}:{r['line']} ({rid})"
        if not r["impl"]:
            problem(where, "no Implemented-in line")
        if r["proved"] is None:
            problem(where, "no Proved-by line")

    section = re.search(r"^## Rules without a test\s*$(.*?)(?=^## |\Z)", doc, re.M | re.S)
    listed = set()
    if not section:
        problem(REFERENCE, "no section '## Rules without a test'")
    else:
        listed = set(re.findall(r"^\*\s+\[(R-[A-Z0-9]+-\d+)\]", section.group(1), re.M))
    for rid in sorted(untested - listed):
        problem(REFERENCE, f"{rid} has no test but is not listed under 'Rules without a test'")
    for rid in sorted(listed - untested):
        if rid not in rules:
            problem(REFERENCE, f"'Rules without a test' lists {rid}, which is no rule")
        else:
            problem(REFERENCE, f"'Rules without a test' lists {rid}, which names tests")

    # Links inside the reference and into the other documents (the README, internals.md, …).
    other_anchors = {}
    for n, line in enumerate(lines, 1):
        for target in re.findall(r"\]\((#[^)\s]+)\)", line):
            if target[1:] not in own_anchors:
                problem(f"{REFERENCE}:{n}", f"link {target} points at no heading")
        for path, target in re.findall(r"\]\(([^)\s#:]+\.md)#([^)\s]+)\)", line):
            rel = os.path.normpath(os.path.join(os.path.dirname(REFERENCE), path))
            if not os.path.isfile(os.path.join(ROOT, rel)):
                problem(f"{REFERENCE}:{n}", f"link {path}#{target}: no file {rel}")
                continue
            if rel not in other_anchors:
                other_anchors[rel] = anchors(read(rel))
            if target not in other_anchors[rel]:
                problem(f"{REFERENCE}:{n}", f"link {path}#{target} points at no heading of {rel}")
    return rules, own_anchors


def citing_files():
    own = os.path.relpath(os.path.abspath(__file__), ROOT)
    for rel in CITING_FILES:
        if os.path.isfile(os.path.join(ROOT, rel)):
            yield rel
    for tree in CITING_TREES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, tree)):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
            for f in filenames:
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                if f.endswith(TEXT_EXT) and rel != own:
                    yield rel


def check_citations(own_anchors):
    cited = 0
    for rel in citing_files():
        text = read(rel)
        for n, line in enumerate(text.splitlines(), 1):
            for anchor in re.findall(r"docs/reference\.md#([\w-]+)", line):
                cited += 1
                if anchor not in own_anchors:
                    problem(f"{rel}:{n}", f"cites docs/reference.md#{anchor}, which is no heading")
            if re.search(r"\bSPEC\.md\b", line):
                problem(f"{rel}:{n}", "cites SPEC.md, which is not in the repository: cite docs/reference.md")
    return cited


def main():
    rules, own_anchors = check_reference()
    cited = check_citations(own_anchors)
    tests = sum(len(r["tests"]) for r in rules.values())
    untested = sum(1 for r in rules.values() if r["proved"] == "none")
    for p in problems:
        print(f"check-reference: {p}")
    print(f"check-reference: {len(rules)} rules ({untested} without a test), "
          f"{tests} test references, {cited} citations in the code")
    if problems:
        print(f"test result: FAILED. 0 passed; 1 failed; 0 ignored ({len(problems)} problems, listed above)")
        return 1
    print("test result: ok. 1 passed; 0 failed; 0 ignored (docs/reference.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
