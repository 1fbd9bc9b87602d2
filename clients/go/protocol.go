package redisrl

import (
	"fmt"
	"strconv"
	"strings"
)

// Mode says which commands decide: the module's, the Lua fallback's, or whichever the
// server has (docs/clients.md#module-or-fallback).
type Mode uint8

const (
	// ModeAuto asks the server once per Client (COMMAND INFO RL.GCRA): the module if it is
	// loaded, else the fallback.
	ModeAuto Mode = iota
	// ModeModule sends the module's RL.* commands.
	ModeModule
	// ModeFallback calls the Lua library: FCALL rl_gcra 1 key ..., or as a script (EVAL,
	// then EVALSHA) where the Functions library cannot run.
	ModeFallback
)

// String returns "auto", "module" or "fallback".
func (m Mode) String() string {
	switch m {
	case ModeModule:
		return "module"
	case ModeFallback:
		return "fallback"
	}
	return "auto"
}

func (m Mode) source() Source {
	if m == ModeFallback {
		return SourceFallback
	}
	return SourceModule
}

// op is one of the project's commands.
type op uint8

const (
	opGCRA op = iota
	opWindow
	opAll
	opRefund
	opLease
	opRelease
)

func (o op) command() string {
	return [...]string{"RL.GCRA", "RL.WINDOW", "RL.ALL", "RL.REFUND", "RL.LEASE", "RL.RELEASE"}[o]
}

func (o op) function() string {
	return [...]string{"rl_gcra", "rl_window", "rl_all", "rl_refund", "rl_lease", "rl_release"}[o]
}

// twin is the no-writes twin of a writing function that may grow memory (library 1.3.0):
// FCALL rl_<op> carries no allow-oom, so the server refuses it whole when out of memory, and
// FCALL_RO rl_<op>_ro answers what writes nothing (a denial, PEEK, QUANTITY 0, an error)
// and the module's OOM error where the call would write (docs/clients.md#out-of-memory).
// Refunds and releases only free: they have none.
func (o op) twin() (string, bool) {
	switch o {
	case opGCRA, opWindow, opAll, opLease:
		return o.function() + "_ro", true
	}
	return "", false
}

// twinFrame is FCALL_RO name numkeys key ... arg ..., and its first key's position.
func twinFrame(name string, keys []string, args []any) ([]any, int) {
	out := make([]any, 0, 3+len(keys)+len(args))
	out = append(out, "FCALL_RO", name, strconv.Itoa(len(keys)))
	for _, k := range keys {
		out = append(out, k)
	}
	return append(out, args...), 3
}

// scriptCall says how the fallback is called.
type scriptCall uint8

const (
	viaFunctions scriptCall = iota // FCALL
	viaSHA                         // EVALSHA sha
	viaText                        // EVAL text (caches it on that node too)
)

// frame builds the wire command for o: the module's command, or the fallback's call with
// the same arguments (the keys moved into FCALL's keys), and the position of the first key
// (for Cluster routing: go-redis cannot read RL.ALL's numkeys).
func frame(mode Mode, call scriptCall, sha string, o op, keys []string, args []any) ([]any, int) {
	out := make([]any, 0, 4+len(keys)+len(args))
	pos := 1
	if mode == ModeFallback {
		switch call {
		case viaSHA:
			out = append(out, "EVALSHA", sha)
		case viaText:
			out = append(out, "EVAL", scriptText())
		default:
			out = append(out, "FCALL", o.function())
		}
		out = append(out, strconv.Itoa(len(keys)))
		pos = 3
	} else {
		out = append(out, o.command())
		if o == opAll {
			out = append(out, strconv.Itoa(len(keys)))
			pos = 2
		}
	}
	for _, k := range keys {
		out = append(out, k)
	}
	if mode == ModeFallback && call != viaFunctions {
		out = append(out, o.function()) // ARGV[1] names the function
	}
	out = append(out, args...)
	return out, pos
}

func protocolError(want string, got any) error {
	return fmt.Errorf("redis-rl: unexpected reply: wanted %s, got %T %v", want, got, got)
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// ints reads a flat array of n integers.
func ints(v any, n int) ([]int64, error) {
	items, ok := v.([]any)
	if !ok || len(items) != n {
		return nil, protocolError(fmt.Sprintf("an array of %d integers", n), v)
	}
	out := make([]int64, n)
	for i, it := range items {
		x, ok := toInt(it)
		if !ok {
			return nil, protocolError("an integer", it)
		}
		out[i] = x
	}
	return out, nil
}

func five(v any) ([5]int64, error) {
	var r [5]int64
	got, err := ints(v, 5)
	if err != nil {
		return r, err
	}
	copy(r[:], got)
	return r, nil
}

// allReply reads RL.ALL's reply: the combined five integers, then each key's.
func allReply(v any) ([5]int64, [][5]int64, error) {
	parts, ok := v.([]any)
	if !ok || len(parts) != 2 {
		return [5]int64{}, nil, protocolError("RL.ALL's two-element reply", v)
	}
	combined, err := five(parts[0])
	if err != nil {
		return combined, nil, err
	}
	each, ok := parts[1].([]any)
	if !ok {
		return combined, nil, protocolError("RL.ALL's per-key replies", parts[1])
	}
	out := make([][5]int64, len(each))
	for i, e := range each {
		if out[i], err = five(e); err != nil {
			return combined, nil, err
		}
	}
	return combined, out, nil
}

// commandExists reads a COMMAND INFO name reply: whether the command exists.
func commandExists(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case []any:
		for _, it := range x {
			if it != nil {
				return true
			}
		}
		return false
	case map[any]any:
		for _, it := range x {
			if it != nil {
				return true
			}
		}
		return false
	}
	return true
}

// libraryPlan is what to do with one server's redis_rl library.
type libraryPlan uint8

const (
	planKeep    libraryPlan = iota // the server runs our version
	planLoad                       // not loaded: load ours
	planReplace                    // an older (or unreadable) version: replace it
	planNewer                      // a newer version (a rolling deploy): leave it
)

func versionKey(v string) ([]uint64, bool) {
	var out []uint64
	for _, p := range strings.Split(v, ".") {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil, false
		}
		out = append(out, n)
	}
	return out, true
}

// planFor compares the server's library version (loaded false: no library) with ours: a
// client never replaces a newer library with an older one (docs/clients.md#the-fallback-where-users-are).
func planFor(theirs string, loaded bool, ours string) libraryPlan {
	if !loaded {
		return planLoad
	}
	if theirs == ours {
		return planKeep
	}
	t, ok1 := versionKey(theirs)
	o, ok2 := versionKey(ours)
	if ok1 && ok2 {
		for i := 0; i < len(t) || i < len(o); i++ {
			var a, b uint64
			if i < len(t) {
				a = t[i]
			}
			if i < len(o) {
				b = o[i]
			}
			if a != b {
				if a > b {
					return planNewer
				}
				return planReplace
			}
		}
		if len(t) > len(o) {
			return planNewer
		}
	}
	return planReplace
}

// settingLines are the fallback's setting lines (local LOG_MAX_LIMIT = 100000), which an
// operator edits: kept when a library is replaced.
var settingLines = [...]string{"LOG_MAX_LIMIT", "LEASE_MAX_LIMIT", "ALL_MAX_KEYS"}

func setting(code, variable string) (uint64, bool) {
	prefix := "local " + variable + " = "
	for _, line := range strings.Split(code, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, err := strconv.ParseUint(strings.TrimRight(v, " \t\r"), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// configuredCode is our library's code with the settings of the library it replaces kept,
// so an upgrade does not reset an operator's rl.log-max-limit, rl.lease-max-limit or
// rl.all-max-keys (the library checks each value's range when it loads).
func configuredCode(ours, theirs string) string {
	code := ours
	for _, variable := range settingLines {
		kept, ok1 := setting(theirs, variable)
		def, ok2 := setting(ours, variable)
		if !ok1 || !ok2 || kept == 0 || kept == def {
			continue
		}
		code = strings.Replace(code,
			fmt.Sprintf("local %s = %d\n", variable, def),
			fmt.Sprintf("local %s = %d\n", variable, kept), 1)
	}
	return code
}

func text(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// listedLibrary reads FUNCTION LIST LIBRARYNAME redis_rl WITHCODE (RESP2 or RESP3): the
// loaded library's version and code, loaded false when it is not there.
func listedLibrary(listing any) (version, code string, loaded bool) {
	entries, ok := listing.([]any)
	if !ok {
		return "", "", false
	}
	for _, entry := range entries {
		fields := map[string]any{}
		switch e := entry.(type) {
		case []any:
			for i := 0; i+1 < len(e); i += 2 {
				if k, ok := text(e[i]); ok {
					fields[k] = e[i+1]
				}
			}
		case map[any]any:
			for k, v := range e {
				if ks, ok := text(k); ok {
					fields[ks] = v
				}
			}
		case map[string]any:
			fields = e
		default:
			continue
		}
		if name, _ := text(fields["library_name"]); name != LibraryName {
			continue
		}
		code, _ = text(fields["library_code"])
		return libraryVersion(code), code, true
	}
	return "", "", false
}
