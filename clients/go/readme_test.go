package redisrl

// README.md's ```go blocks compiled as written, so that a snippet cannot rot (as the
// repository's README.md is checked by tests/readme.rs and clients/python/README.md by
// test_readme.py; clients/rust/README.md is compiled by its doc tests).
//
// The blocks go into a module of their own in a temporary directory, which requires this
// package by a replace directive to this directory and has this module's go.sum; `go build`
// and `go vet` check it, offline (GOPROXY=off, GOFLAGS=-mod=mod) and from the build cache,
// so it takes a few seconds. A `//line README.md:N` directive
// before each block makes every error name the README's line.
//
//   - A block that begins with `package` is a file as written (a directory of its own); a
//     `package main` one is also run, with REDIS_ADDR set to a server with the module, and
//     when a ```text block follows it (only blank lines between), it must print those lines.
//   - A block with a top-level `func` or `type` is a file's body: `package`, and the
//     imports it names, are added.
//   - Any other block is a fragment: the body of a function that returns an error (so it may
//     `return err`), with the names README fragments take as given (ctx, w, r, rdb,
//     limiter, exports, done, mux: see readmeGiven) as parameters unless the block declares
//     them, the packages it names imported (its own `import` lines kept), and `_ = name` for
//     what it declares (a fragment's variables are for the code after it).

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis-rl/redis-rl/clients/go/internal/testserver"
)

// readmeBlock is one fenced block of a README.
type readmeBlock struct {
	lang   string
	text   string
	line   int     // the line number of its first line of text
	output *string // the ```text block right after it, if any
}

// readmeBlocks is every fenced block of text, in order.
func readmeBlocks(text string) []readmeBlock {
	var out []readmeBlock
	var open *readmeBlock
	adjacent := false // only blank lines since the last block closed
	for i, line := range strings.Split(text, "\n") {
		if open != nil {
			if strings.TrimSpace(line) == "```" {
				b := *open
				open = nil
				if n := len(out); adjacent && b.lang == "text" && n > 0 && out[n-1].output == nil {
					out[n-1].output = &b.text
				}
				out = append(out, b)
				adjacent = true
				continue
			}
			open.text += line + "\n"
			continue
		}
		if lang, ok := strings.CutPrefix(strings.TrimSpace(line), "```"); ok {
			open = &readmeBlock{lang: strings.TrimSpace(lang), line: i + 2}
			continue
		}
		if strings.TrimSpace(line) != "" {
			adjacent = false
		}
	}
	return out
}

// readmePackages are the packages a README block may name without importing them.
var readmePackages = map[string]string{
	"context": "context",
	"errors":  "errors",
	"fmt":     "fmt",
	"http":    "net/http",
	"log":     "log",
	"os":      "os",
	"slog":    "log/slog",
	"time":    "time",
	"redis":   "github.com/redis/go-redis/v9",
	"redisrl": "github.com/redis-rl/redis-rl/clients/go",
	"rlhttp":  "github.com/redis-rl/redis-rl/clients/go/rlhttp",
}

// readmeGiven are the names a fragment may use without declaring them, and their types.
var readmeGiven = []struct{ name, typ string }{
	{"ctx", "context.Context"},
	{"w", "http.ResponseWriter"},
	{"r", "*http.Request"},
	{"rdb", "*redis.Client"},
	{"limiter", "*redisrl.Client"},
	{"exports", "redisrl.Lease"},
	{"done", "<-chan struct{}"},
	{"mux", "*http.ServeMux"},
}

// readmeImportLine is a fragment's one-line import ("import rlhttp \"…\"" or without the name).
var readmeImportLine = regexp.MustCompile(`^import\s+(?:[A-Za-z_][A-Za-z0-9_]*\s+)?"[^"]+"\s*$`)

// readmeFile is the Go file for block n; main is true for a `package main` file as written,
// own for a file that needs a package of its own (its top-level names are its own).
func readmeFile(readme string, n int, b readmeBlock) (src string, main, own bool, err error) {
	directive := fmt.Sprintf("//line %s:%d:1\n", readme, b.line)
	if strings.HasPrefix(strings.TrimSpace(b.text), "package ") {
		return directive + b.text, regexp.MustCompile(`(?m)^package main\s*$`).MatchString(b.text), true, nil
	}
	// The block's own import lines, blanked (its lines keep their numbers).
	imports := map[string]bool{}
	lines := strings.Split(b.text, "\n")
	for i, l := range lines {
		if readmeImportLine.MatchString(l) {
			imports[strings.TrimSpace(l[len("import"):])] = true
			lines[i] = ""
		}
	}
	body := strings.Join(lines, "\n")
	fileLevel := regexp.MustCompile(`(?m)^(func|type) `).MatchString(body)
	var wrapped string
	if fileLevel {
		wrapped = "package snippets\n" + directive + body
	} else {
		wrapped = fmt.Sprintf("package snippets\nfunc readme%d() error {\n%s%s\n}\n", n, directive, body)
	}
	fset := token.NewFileSet()
	f, perr := parser.ParseFile(fset, readme, wrapped, parser.SkipObjectResolution)
	if perr != nil {
		return "", false, false, perr
	}
	// What the block declares at its top level, and the names it uses.
	declared := map[string]bool{}
	var order []string
	declare := func(id *ast.Ident) {
		if id.Name != "_" && !declared[id.Name] {
			declared[id.Name] = true
			order = append(order, id.Name)
		}
	}
	var top []ast.Stmt
	if !fileLevel {
		top = f.Decls[0].(*ast.FuncDecl).Body.List
	}
	for _, s := range top {
		switch s := s.(type) {
		case *ast.AssignStmt:
			if s.Tok == token.DEFINE {
				for _, e := range s.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						declare(id)
					}
				}
			}
		case *ast.DeclStmt:
			if g, ok := s.Decl.(*ast.GenDecl); ok {
				for _, spec := range g.Specs {
					if v, ok := spec.(*ast.ValueSpec); ok {
						for _, id := range v.Names {
							declare(id)
						}
					}
				}
			}
		}
	}
	used := map[string]bool{}
	var visit func(ast.Node) bool
	visit = func(node ast.Node) bool {
		switch x := node.(type) {
		case *ast.SelectorExpr:
			ast.Inspect(x.X, visit)
			return false // not the selected name
		case *ast.KeyValueExpr:
			if _, field := x.Key.(*ast.Ident); !field {
				ast.Inspect(x.Key, visit)
			}
			ast.Inspect(x.Value, visit)
			return false
		case *ast.Ident:
			used[x.Name] = true
		}
		return true
	}
	ast.Inspect(f, visit)
	var params []string
	if !fileLevel {
		for _, g := range readmeGiven {
			if used[g.name] && !declared[g.name] {
				params = append(params, g.name+" "+g.typ)
				for q := range readmePackages {
					if strings.Contains(g.typ, q+".") {
						used[q] = true
					}
				}
			}
		}
	}
	for q, path := range readmePackages {
		if used[q] && !declared[q] {
			imports[fmt.Sprintf("%q", path)] = true
		}
	}
	var importLines []string
	for spec := range imports {
		importLines = append(importLines, spec)
	}
	importLines = dedupeImports(importLines)
	head := "package snippets\n\nimport (\n\t" + strings.Join(importLines, "\n\t") + "\n)\n"
	if len(importLines) == 0 {
		head = "package snippets\n"
	}
	if fileLevel {
		return head + directive + body, false, true, nil
	}
	var tail strings.Builder
	if len(top) == 0 {
		tail.WriteString("return nil\n")
	} else if _, returns := top[len(top)-1].(*ast.ReturnStmt); !returns {
		for _, name := range order {
			tail.WriteString("_ = " + name + "\n")
		}
		tail.WriteString("return nil\n")
	}
	return fmt.Sprintf("%s\nfunc readme%d(%s) error {\n%s%s\n%s}\n",
		head, n, strings.Join(params, ", "), directive, body, tail.String()), false, false, nil
}

// dedupeImports keeps one line per import path (an aliased one where the block wrote it),
// sorted by path.
func dedupeImports(lines []string) []string {
	byPath := map[string]string{}
	var paths []string
	for _, l := range lines {
		path := l[strings.Index(l, `"`):]
		if prev, ok := byPath[path]; !ok {
			paths = append(paths, path)
			byPath[path] = l
		} else if !strings.Contains(prev, " ") {
			byPath[path] = l
		}
	}
	sort.Strings(paths)
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, byPath[p])
	}
	return out
}

// goCommand runs the go command in dir, offline and from the build cache, with a deadline.
func goCommand(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("go %s: not done within 3 min: %w", strings.Join(args, " "), ctx.Err())
	}
	return string(out), err
}

// checkReadme writes the ```go blocks of the README at readmePath into a module in a
// temporary directory, builds and vets it, and runs its programs; it returns how many blocks
// it checked and what failed (at README lines, named by the README's absolute path).
func checkReadme(t *testing.T, readmePath string) (int, error) {
	t.Helper()
	text, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := filepath.Abs(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	_, self, _, _ := runtime.Caller(0)
	pkgDir := filepath.Dir(self) // clients/go
	gomod, err := os.ReadFile(filepath.Join(pkgDir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gosum, err := os.ReadFile(filepath.Join(pkgDir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(string(gomod), "module readmesnippets") +
		"\nrequire github.com/redis-rl/redis-rl/clients/go v0.0.0\n\nreplace github.com/redis-rl/redis-rl/clients/go => " + pkgDir + "\n"
	write := func(name, content string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", mod)
	write("go.sum", string(gosum))
	var mains []readmeBlock
	var mainDirs []string
	n := 0
	for _, b := range readmeBlocks(string(text)) {
		if b.lang != "go" {
			continue
		}
		n++
		src, isMain, own, err := readmeFile(readme, n, b)
		if err != nil {
			return n, err
		}
		switch {
		case isMain:
			d := fmt.Sprintf("program%d", n)
			write(filepath.Join(d, "main.go"), src)
			mains = append(mains, b)
			mainDirs = append(mainDirs, d)
		case own:
			write(filepath.Join(fmt.Sprintf("file%d", n), "file.go"), src)
		default:
			write(filepath.Join("snippets", fmt.Sprintf("block%d.go", n)), src)
		}
	}
	if n == 0 {
		return 0, nil
	}
	// The compiler first (it names every error, vet only the first), its programs into bin/.
	bindir := filepath.Join(dir, "bin") + string(filepath.Separator)
	build := []string{"build", "./..."}
	if len(mains) > 0 {
		build = []string{"build", "-o", bindir, "./..."} // (-o fails where there is no program)
	}
	if out, err := goCommand(t, dir, build...); err != nil {
		return n, fmt.Errorf("go build of %s's go blocks: %v\n%s", readme, err, out)
	}
	if out, err := goCommand(t, dir, "vet", "./..."); err != nil {
		return n, fmt.Errorf("go vet of %s's go blocks: %v\n%s", readme, err, out)
	}
	for i, b := range mains {
		bin := filepath.Join(bindir, mainDirs[i])
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "REDIS_ADDR="+testserver.Shared(t, true).Addr())
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if err != nil {
			return n, fmt.Errorf("the program at %s:%d: %v\n%s%s", readme, b.line, err, stdout.String(), stderr.String())
		}
		if b.output != nil && strings.TrimRight(stdout.String(), "\n ") != strings.TrimRight(*b.output, "\n ") {
			return n, fmt.Errorf("the program at %s:%d printed\n%s\nnot, as the README shows,\n%s", readme, b.line, stdout.String(), *b.output)
		}
	}
	return n, nil
}

func TestReadmeGoBlocksCompile(t *testing.T) {
	n, err := checkReadme(t, "README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("README.md has %d ```go blocks: fewer than the 5 it had when this test was written (a fence spelt otherwise is not checked)", n)
	}
}

// The check itself: a broken fragment and a program that prints otherwise than its README
// shows both fail it, naming the README's line; a program that prints what it shows passes.
func TestReadmeCheckItself(t *testing.T) {
	for _, tc := range []struct {
		name, readme string
		want         []string
	}{
		{"fragment", "# x\n\n```go\nd, err := limiter.Check(ctx, \"k\", redisrl.NoSuchLimit)\n```\n", []string{"README.md:4:", "undefined: redisrl.NoSuchLimit"}},
		{"output", "# x\n\n```go\npackage main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"one\") }\n```\n\n```text\ntwo\n```\n", []string{"README.md:4 printed\none\n"}},
		{"program", "# x\n\n```go\npackage main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(os.Getenv(\"REDIS_ADDR\") != \"\") }\n```\n\n```text\ntrue\n```\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "README.md")
			if err := os.WriteFile(p, []byte(tc.readme), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := checkReadme(t, p)
			if tc.want == nil && err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("want an error with %q, got %v", want, err)
				}
			}
		})
	}
}
