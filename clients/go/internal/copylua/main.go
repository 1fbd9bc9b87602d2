// Command copylua copies the repository's one Lua library, scripts/lua/redis_rl.lua, into
// the package directory, where lua.go embeds it. `go generate` in clients/go runs it (make
// test and make lint compare the two instead); the copy is committed so that the module
// builds from its own files, and it is generated, never edited (GENERATED.md). It writes
// only when the text differs.
package main

import (
	"bytes"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: copylua SOURCE DEST")
		os.Exit(2)
	}
	src, dst := os.Args[1], os.Args[2]
	text, err := os.ReadFile(src)
	if err != nil {
		fmt.Fprintf(os.Stderr, "copylua: %v (run go generate from clients/go in a checkout of the repository)\n", err)
		os.Exit(1)
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, text) {
		return
	}
	if err := os.WriteFile(dst, text, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "copylua: %v\n", err)
		os.Exit(1)
	}
}
