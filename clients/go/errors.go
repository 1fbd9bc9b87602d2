package redisrl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable matches (with errors.Is) the error a call returns when Redis does not
// answer and the failure policy is FailError. errors.As gives the *UnavailableError with
// its cause.
var ErrUnavailable = errors.New("redis-rl: Redis unavailable")

// ErrRateLimited matches the error Acquire returns when no slot is free.
var ErrRateLimited = errors.New("redis-rl: rate limited")

// ErrLibrary matches the error of a server that has no module and where the fallback
// cannot run: the library is missing and loading it is not allowed (WithLoadLibrary(false)),
// or the server refuses FUNCTION and EVAL to this client.
var ErrLibrary = errors.New("redis-rl: fallback library unavailable")

// ErrUsage matches a call the API does not allow (a Lease passed to Check, an empty key,
// MaxWait on a window, ...).
var ErrUsage = errors.New("redis-rl: usage")

// UnavailableError is an outage under FailError: Cause is what the call met (a refused or
// lost connection, a timeout, OOM, LOADING, CLUSTERDOWN, ...).
type UnavailableError struct{ Cause error }

func (e *UnavailableError) Error() string {
	return "redis-rl: Redis unavailable: " + e.Cause.Error()
}

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Cause }

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

type usageError struct{ msg string }

func (e *usageError) Error() string        { return "redis-rl: " + e.msg }
func (e *usageError) Is(target error) bool { return target == ErrUsage }
func usage(format string, a ...any) error  { return &usageError{fmt.Sprintf(format, a...)} }

type libraryError struct{ msg string }

func (e *libraryError) Error() string        { return "redis-rl: " + e.msg }
func (e *libraryError) Is(target error) bool { return target == ErrLibrary }

// errTimedOut is the limiter's own command timeout (WithTimeout) running out: an outage.
var errTimedOut = errors.New("redis-rl: no reply within the command timeout")

// serverError is the error text of a Redis error reply, or "" for any other error.
func serverError(err error) string {
	var re redis.Error
	if errors.As(err, &re) {
		return re.Error()
	}
	return ""
}

// errorCode is the first word of a Redis error reply ("WRONGTYPE", "ERR", ...), or "".
func errorCode(err error) string {
	msg := serverError(err)
	code, _, _ := strings.Cut(msg, " ")
	return code
}

// isUnavailable tells an outage (the failure policy answers it) from a misuse (always an
// error): the one function that decides it. Outages: the connection refused, reset or
// lost, a timeout, an exhausted pool, and the server replies OOM, LOADING, MASTERDOWN,
// CLUSTERDOWN, TRYAGAIN and READONLY (a failover in progress). Misuses: every other error
// reply (a wrong argument, WRONGTYPE, CROSSSLOT, NOPERM) and a closed client.
func isUnavailable(err error) bool {
	if err == nil || errors.Is(err, redis.ErrClosed) {
		return false
	}
	if msg := serverError(err); msg != "" {
		switch errorCode(err) {
		case "OOM", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY":
			return true
		}
		return false
	}
	if errors.Is(err, errTimedOut) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// go-redis reports a deadline from its own read/write timeouts this way.
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT)
}

// isConnectionLevel is a failure of the connection (refused, reset, broken pipe, end of
// file), not a timeout: retried once on a fresh connection (docs/clients.md#recovery).
func isConnectionLevel(err error) bool {
	if serverError(err) != "" || errors.Is(err, errTimedOut) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// isUnknownCommand: the module is not (or no longer) loaded here.
func isUnknownCommand(err error) bool {
	msg := strings.ToLower(serverError(err))
	return strings.Contains(msg, "unknown command") && strings.Contains(msg, "rl.")
}

// isRefused: the server refuses a command to this client: unknown (Redis 6.x, a renamed or
// disabled command), not permitted by its ACL, or a scripting command on a server that runs
// no Lua at all (Valkey 9.1 with its lua engine module unloaded: "Could not find scripting
// engine 'lua'", "Engine 'lua' not found"). A NOPERM on one of the keys ("... access one of
// the keys") is not a refused command: it is reported as it is.
func isRefused(err error) bool {
	msg := strings.ToLower(serverError(err))
	noperm := errorCode(err) == "NOPERM" || strings.Contains(msg, "noperm")
	return strings.Contains(msg, "unknown command") || (noperm && strings.Contains(msg, "command")) ||
		strings.Contains(msg, "engine 'lua'") || strings.Contains(msg, "scripting engine")
}

// isOOM: the server is out of memory ("OOM command not allowed when used memory >
// 'maxmemory'.").
func isOOM(err error) bool { return errorCode(err) == "OOM" }

// isMissingFunction: the Functions library is not (or no longer) loaded.
func isMissingFunction(err error) bool {
	msg := strings.ToLower(serverError(err))
	return strings.Contains(msg, "function not found") || strings.Contains(msg, "no such function")
}

// isNoScript: the node has not cached the script (a restart, a failover, a new node).
func isNoScript(err error) bool {
	return strings.HasPrefix(serverError(err), "NOSCRIPT")
}
