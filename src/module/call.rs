//! The one place where a command's raw `(ctx, argv, argc)` becomes safe values: [`Call`]
//! (the arguments as byte slices, replies, the key opener, the context flags) and the
//! per-command trampoline that Redis calls ([`trampoline`]), which catches panics, counts the
//! call for `INFO rl` and turns errors into error replies.
//!
//! Command handlers (`commands/`, where `unsafe` is forbidden) see only [`Call`] and [`Arg`].

use std::ffi::{c_int, c_long, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;

use redis_module::raw;

use super::command::{Command, Counted, Keys};
use super::ffi;
use super::guard;
use super::keys::LimiterKey;
use super::maxmemory;
use super::stats;

/// The used-memory ratio from which [`Call::is_out_of_memory`] asks the server's OOM flag.
const NEAR_MAXMEMORY: f32 = 0.98;

/// The `deny-oom` command that does nothing (`commands/oom_check.rs`), through which
/// [`Call::is_out_of_memory`] asks the server's own out-of-memory verdict.
const OOM_PROBE: &CStr = c"RL.OOMCHECK";

/// Arg is one argument of the current command, valid for the command's duration.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Arg<'a> {
    string: NonNull<raw::RedisModuleString>,
    _call: PhantomData<&'a raw::RedisModuleString>,
}

impl<'a> Arg<'a> {
    /// Returns the argument's bytes (binary-safe), borrowed for the command's duration.
    pub fn bytes(self) -> &'a [u8] {
        // SAFETY: `string` is one of the command's argv entries (see `Call::new`), alive and
        // unmodified while the command runs, which `'a` does not outlive.
        unsafe { ffi::bytes(self.string.as_ptr()) }
    }

    /// The raw string, for the few raw calls that take one (opening a key, replicating).
    pub(super) fn raw(self) -> *mut raw::RedisModuleString {
        self.string.as_ptr()
    }
}

/// Access says how a command opens a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only: denials, PEEK and QUANTITY 0 never write.
    Read,
    /// Read and write.
    Write,
}

/// Call is one running command: its context and arguments.
pub struct Call<'a> {
    ctx: *mut raw::RedisModuleCtx,
    args: &'a [Arg<'a>],
}

impl<'a> Call<'a> {
    /// Wraps a command's raw context and arguments.
    ///
    /// # Safety
    /// `ctx` must be the live context of the running command, and `argv` must point to
    /// `argc` non-null strings that stay valid for `'a` (Redis guarantees both for the
    /// duration of a command callback).
    unsafe fn new(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> Self {
        let args: &'a [Arg<'a>] = match usize::try_from(argc) {
            // SAFETY: `Arg` is a `repr(transparent)` `NonNull<RedisModuleString>`, and the
            // caller guarantees `argc` valid non-null pointers at `argv` for `'a`.
            Ok(n) if n > 0 && !argv.is_null() => unsafe {
                std::slice::from_raw_parts(argv.cast::<Arg<'a>>(), n)
            },
            _ => &[],
        };
        Self { ctx, args }
    }

    /// The arguments, `args()[0]` being the command's name.
    pub fn args(&self) -> &'a [Arg<'a>] {
        self.args
    }

    /// Opens `key` for this command; the key is closed when the returned value drops.
    pub fn open(&self, key: Arg<'a>, access: Access) -> LimiterKey<'a> {
        LimiterKey::open(self.ctx, key, access)
    }

    /// Replies with an array of integers.
    pub fn reply_integers(&self, values: &[i64]) {
        ffi::reply_integers(self.ctx, values);
    }

    /// Starts an array reply of `len` elements (each added by a later reply call).
    pub fn reply_array(&self, len: usize) {
        let len = c_long::try_from(len).unwrap_or(c_long::MAX);
        // SAFETY: the API table is filled at load and never changed; `ctx` is the live
        // context of this command (see `Call::new`).
        unsafe {
            if let Some(array) = raw::RedisModule_ReplyWithArray {
                array(self.ctx, len);
            }
        }
    }

    /// Replies with a simple string (`+OK`).
    pub fn reply_simple(&self, text: &CStr) {
        ffi::reply_simple(self.ctx, text);
    }

    /// Whether this call comes from the master's replication stream or from loading the AOF
    /// (the only places an internal command may come from).
    pub fn is_replicated_or_loading(&self) -> bool {
        let gate = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
        ffi::context_flags(self.ctx) & gate != 0
    }

    /// Whether the server is out of memory: it refuses `deny-oom` commands now, because
    /// `maxmemory` is reached and its eviction pass could not make room. Limiting commands
    /// check it themselves (they are not flagged `deny-oom`) so that denials and reports
    /// still answer while only writes are refused.
    pub fn is_out_of_memory(&self) -> bool {
        // Four steps, each asked only when the one before says yes. Without `maxmemory` the
        // server never refuses a write for memory (`maxmemory` follows that setting). The
        // used-memory ratio (less replica and AOF buffers) is the cheapest read. The
        // context's OOM flag says used memory is above `maxmemory` now. Neither is the
        // server's verdict: when its eviction pass runs out of its time budget, eviction
        // goes on in the background and the server accepts `deny-oom` commands although used
        // memory is still above `maxmemory`. That verdict is read through the `deny-oom`
        // probe RL.OOMCHECK, which the server then refuses exactly as it would refuse SET.
        maxmemory::is_limited()
            && ffi::used_memory_ratio() >= NEAR_MAXMEMORY
            && ffi::context_flags(self.ctx) & raw::REDISMODULE_CTX_FLAGS_OOM != 0
            && ffi::server_refuses_deny_oom(self.ctx, OOM_PROBE)
    }

    /// Propagates this command as received to the AOF and sub-replicas (a replica applying
    /// its master's effect records the same effect).
    pub fn replicate_verbatim(&self) {
        // SAFETY: the API table is filled at load and never changed; `ctx` is the live
        // context of this command.
        unsafe {
            if let Some(verbatim) = raw::RedisModule_ReplicateVerbatim {
                verbatim(self.ctx);
            }
        }
    }

    /// Whether Redis only asks where this call's keys are (cluster routing, `COMMAND
    /// GETKEYS`) instead of running it.
    pub fn is_keys_position_request(&self) -> bool {
        // SAFETY: the API table is filled at load and never changed; `ctx` is the live
        // context of this command.
        unsafe {
            match raw::RedisModule_IsKeysPositionRequest {
                Some(is_request) => is_request(self.ctx) != 0,
                None => false,
            }
        }
    }

    /// Answers a key-position request: argument `index` is a key.
    pub fn key_at(&self, index: usize) {
        let Ok(pos) = c_int::try_from(index) else {
            return;
        };
        // SAFETY: the API table is filled at load and never changed; `ctx` is the live
        // context of a key-position request.
        unsafe {
            if let Some(key_at) = raw::RedisModule_KeyAtPos {
                key_at(self.ctx, pos);
            }
        }
    }
}

/// The function Redis calls for command `C`: builds the [`Call`], answers key-position
/// requests for commands with movable keys, runs `C::run` behind the panic boundary, counts
/// the call, and sends the error reply when the handler fails.
pub extern "C" fn trampoline<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: Redis calls a command callback with the command's live context and its
    // `argc` argument strings, valid until the callback returns.
    let call = unsafe { Call::new(ctx, argv, argc) };
    let spec = &C::SPEC;
    if spec.keys == Keys::AfterNumkeys && call.is_keys_position_request() {
        guard::callback(spec.display, (), || C::key_positions(&call));
        return raw::Status::Ok as c_int;
    }
    let outcome = guard::command(spec.display, || C::run(&call));
    if let Some(counters) = spec.counters {
        let counted = match &outcome {
            Ok(counted) => *counted,
            Err(_) => Counted::Error,
        };
        stats::record(counters, counted);
    }
    if let Err(e) = outcome {
        ffi::reply_error(ctx, &e.reply_text());
    }
    raw::Status::Ok as c_int
}
