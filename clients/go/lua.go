package redisrl

import (
	"crypto/sha1"
	_ "embed" // the Lua library
	"encoding/hex"
	"strings"
	"sync"
)

//go:generate go run ./internal/copylua ../../scripts/lua/redis_rl.lua redis_rl.lua

// LuaLibrary is the project's Lua fallback, the Functions library redis_rl, embedded from
// the repository's one copy, scripts/lua/redis_rl.lua.
//
// The package directory holds a copy written by `go generate` and committed, so that the
// module builds on its own (see GENERATED.md: do not edit it); TestLibraryIsTheRepositoryCopy
// and make lint fail when the copy differs from scripts/lua/redis_rl.lua. Load it
// yourself with FUNCTION LOAD REPLACE where clients may not run FUNCTION LOAD (see
// WithLoadLibrary).
//
//go:embed redis_rl.lua
var LuaLibrary string

// LibraryName is the Functions library's name (#!lua name=redis_rl).
const LibraryName = "redis_rl"

// scriptText is the fallback as a script, for servers where FUNCTION is not allowed: the
// library without its #!lua line, run as EVAL/EVALSHA sha numkeys key ... name arg ...
// (ARGV[1] names the function).
func scriptText() string {
	if _, rest, ok := strings.Cut(LuaLibrary, "\n"); ok {
		return rest
	}
	return LuaLibrary
}

// scriptSHA is the SHA1 the server knows scriptText by (EVALSHA), lower-case hex.
var scriptSHA = sync.OnceValue(func() string {
	sum := sha1.Sum([]byte(scriptText()))
	return hex.EncodeToString(sum[:])
})

// libraryVersion is the version a library's code declares (local VERSION = '1.1.0').
func libraryVersion(code string) string {
	_, rest, ok := strings.Cut(code, "local VERSION = '")
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, "'")
	return v
}
