//! The native data type `ratelimit`: one limiter state per key, persisted through the codec.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::ffi::{self, Level};
use super::guard;
use super::value;
use crate::codec::{self, ENCODING_VERSION, VERSION_GCRA_ONLY};

/// The type's name, written into every RDB file: exactly 9 characters, fixed forever.
pub const TYPE_NAME: &std::ffi::CStr = c"ratelimit";

static TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Returns the registered type (null before registration).
pub fn redis_type() -> *mut raw::RedisModuleType {
    TYPE.load(Ordering::Relaxed)
}

/// Registers the type with Redis; called once from `OnLoad`.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static str> {
    let mut methods = raw::RedisModuleTypeMethods {
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    };
    // SAFETY: `ctx` is the load context; the name is a NUL-terminated static; `methods`
    // outlives the call (Redis copies it).
    let t = unsafe {
        let create = raw::RedisModule_CreateDataType.ok_or("no CreateDataType API")?;
        create(
            ctx,
            TYPE_NAME.as_ptr(),
            c_int::from(ENCODING_VERSION),
            &mut methods,
        )
    };
    if t.is_null() {
        return Err("CreateDataType failed");
    }
    TYPE.store(t, Ordering::Relaxed);
    Ok(())
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The scratch buffer keeps at most this much between calls: enough for every effect and
/// every state but a large LOG, whose encoding is freed once used (so a `DUMP` of a big log
/// does not keep its size in `used_memory`).
const SCRATCH_KEEP: usize = 1024;

/// Calls `f` with the bytes that `encode` writes into a reused buffer (no allocation per
/// call in the steady state).
pub fn with_scratch<R>(encode: impl FnOnce(&mut Vec<u8>), f: impl FnOnce(&[u8]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            encode(&mut buf);
            let result = f(&buf);
            if buf.capacity() > SCRATCH_KEEP {
                *buf = Vec::new();
            }
            result
        }
        Err(_) => {
            let mut buf = Vec::new();
            encode(&mut buf);
            f(&buf)
        }
    })
}

/// Calls `f` with the codec encoding of a value.
///
/// # Safety
/// `value` must be null or a live value of our type, as for `value::view`.
unsafe fn with_encoding<R>(value: *mut c_void, f: impl FnOnce(&[u8]) -> R) -> R {
    // SAFETY: the caller's guarantee.
    let state = unsafe { value::view(value) };
    with_scratch(
        |buf| {
            if let Some(state) = state {
                codec::encode_state_into(state, buf);
            }
        },
        f,
    )
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback("rdb_load", ptr::null_mut(), || {
        if encver < c_int::from(VERSION_GCRA_ONLY) || encver > c_int::from(ENCODING_VERSION) {
            ffi::log(
                ptr::null_mut(),
                Level::Warning,
                &format!(
                    "redis-rl: cannot load a '{}' value of encoding version {encver}: this \
                     module reads versions {VERSION_GCRA_ONLY} to {ENCODING_VERSION}; upgrade \
                     the module",
                    TYPE_NAME.to_string_lossy()
                ),
            );
            return ptr::null_mut();
        }
        // SAFETY: `rdb` is the IO context Redis passes to this callback. The buffer Redis
        // returns holds `len` bytes, is ours to free with RedisModule_Free, and is read only
        // before it is freed.
        let decoded = unsafe {
            let Some(load) = raw::RedisModule_LoadStringBuffer else {
                return ptr::null_mut();
            };
            let mut len: usize = 0;
            let buf = load(rdb, &mut len);
            let failed = raw::RedisModule_IsIOError.is_some_and(|f| f(rdb) != 0);
            let decoded = if failed || buf.is_null() {
                None
            } else {
                Some(codec::decode(std::slice::from_raw_parts(
                    buf.cast::<u8>(),
                    len,
                )))
            };
            if !buf.is_null() {
                if let Some(free) = raw::RedisModule_Free {
                    free(buf.cast());
                }
            }
            decoded
        };
        match decoded {
            None => ptr::null_mut(),
            Some(Ok(state)) => value::from_state(state),
            Some(Err(e)) => {
                ffi::log(
                    ptr::null_mut(),
                    Level::Warning,
                    &format!("redis-rl: refusing to load a corrupt limiter value: {e}"),
                );
                ptr::null_mut()
            }
        }
    })
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback("rdb_save", (), || {
        // SAFETY: Redis passes a live value of our type and the IO context of this save; the
        // encoded bytes outlive the call.
        unsafe {
            let Some(save) = raw::RedisModule_SaveStringBuffer else {
                return;
            };
            with_encoding(value, |bytes| {
                save(rdb, bytes.as_ptr().cast::<c_char>(), bytes.len())
            });
        }
    })
}

extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard::callback("aof_rewrite", (), || {
        // SAFETY: Redis passes the AOF IO context, the key and its live value; the format
        // "sb" takes the key string and a (pointer, length) pair that outlives the call.
        // Redis appends the key's PEXPIREAT after these commands.
        unsafe {
            let Some(emit) = raw::RedisModule_EmitAOF else {
                return;
            };
            with_encoding(value, |bytes| {
                emit(
                    aof,
                    c"RL.APPLY".as_ptr(),
                    c"sb".as_ptr(),
                    key,
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                )
            });
        }
    })
}

/// Bytes the value occupies: the state's allocations (the server adds its own overhead).
extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a live value of our type.
    guard::callback("mem_usage", 0, || unsafe {
        value::heap_bytes(value.cast_mut())
    })
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard::callback("digest", (), || {
        // SAFETY: Redis passes the digest context and a live value of our type.
        unsafe {
            let (Some(add), Some(end)) = (
                raw::RedisModule_DigestAddStringBuffer,
                raw::RedisModule_DigestEndSequence,
            ) else {
                return;
            };
            with_encoding(value, |bytes| {
                add(md, bytes.as_ptr().cast::<c_char>(), bytes.len())
            });
            end(md);
        }
    })
}

extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis frees each value of our type exactly once, through this callback.
    guard::callback("free", (), || unsafe { value::free(value) })
}

extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard::callback("copy", ptr::null_mut(), || {
        // SAFETY: Redis passes a live value of our type.
        match unsafe { value::view(value.cast_mut()) } {
            Some(state) => value::from_state(state.to_state()),
            None => ptr::null_mut(),
        }
    })
}
