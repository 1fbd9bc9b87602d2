//! The native data type `ratelimit`: one limiter state per key, persisted through the codec.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::ffi::{self, Level};
use super::guard;
use super::value;
use crate::codec::{self, ENCODING_VERSION};

/// The type's name, written into every RDB file: exactly 9 characters, fixed forever.
pub const TYPE_NAME: &std::ffi::CStr = c"ratelimit";

static TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// Returns the registered type (null before registration).
pub fn redis_type() -> *mut raw::RedisModuleType {
    TYPE.load(Ordering::Relaxed)
}

/// Registers the type with Redis; called once from `OnLoad`.
pub fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), &'static str> {
    let create = unsafe { raw::RedisModule_CreateDataType }.ok_or("no CreateDataType API")?;
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
    let t = unsafe {
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

/// Calls `f` with the bytes that `encode` writes into a reused buffer (no allocation per
/// call in the steady state).
pub fn with_scratch<R>(encode: impl FnOnce(&mut Vec<u8>), f: impl FnOnce(&[u8]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            encode(&mut buf);
            f(&buf)
        }
        Err(_) => {
            let mut buf = Vec::new();
            encode(&mut buf);
            f(&buf)
        }
    })
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback("rdb_load", ptr::null_mut(), || {
        if encver < 1 || encver > c_int::from(ENCODING_VERSION) {
            ffi::log(
                ptr::null_mut(),
                Level::Warning,
                &format!(
                    "redis-rl: cannot load a '{}' value of encoding version {encver}: this \
                     module reads versions 1 to {ENCODING_VERSION}; upgrade the module",
                    TYPE_NAME.to_string_lossy()
                ),
            );
            return ptr::null_mut();
        }
        let Some(load) = raw::RedisModule_LoadStringBuffer else {
            return ptr::null_mut();
        };
        let mut len: usize = 0;
        let buf = load(rdb, &mut len);
        if raw::RedisModule_IsIOError.is_some_and(|f| f(rdb) != 0) || buf.is_null() {
            if !buf.is_null() {
                if let Some(free) = raw::RedisModule_Free {
                    free(buf.cast());
                }
            }
            return ptr::null_mut();
        }
        let decoded = codec::decode(std::slice::from_raw_parts(buf.cast::<u8>(), len));
        if let Some(free) = raw::RedisModule_Free {
            free(buf.cast());
        }
        match decoded {
            Ok(state) => value::into_raw(state),
            Err(e) => {
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

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback("rdb_save", (), || {
        let Some(save) = raw::RedisModule_SaveStringBuffer else {
            return;
        };
        with_scratch(
            |buf| value::encode_into(value, buf),
            |bytes| save(rdb, bytes.as_ptr().cast::<c_char>(), bytes.len()),
        );
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard::callback("aof_rewrite", (), || {
        let Some(emit) = raw::RedisModule_EmitAOF else {
            return;
        };
        // Redis appends the key's PEXPIREAT after these commands.
        with_scratch(
            |buf| value::encode_into(value, buf),
            |bytes| {
                emit(
                    aof,
                    ffi::cstr(c"RL.APPLY"),
                    ffi::cstr(c"sb"),
                    key,
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                )
            },
        );
    })
}

/// Bytes the value occupies: the state's allocations (the server adds its own overhead).
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard::callback("mem_usage", 0, || value::heap_bytes(value.cast_mut()))
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard::callback("digest", (), || {
        let (Some(add), Some(end)) = (
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestEndSequence,
        ) else {
            return;
        };
        with_scratch(
            |buf| value::encode_into(value, buf),
            |bytes| add(md, bytes.as_ptr().cast::<c_char>(), bytes.len()),
        );
        end(md);
    })
}

unsafe extern "C" fn free(value: *mut c_void) {
    guard::callback("free", (), || value::free(value))
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard::callback("copy", ptr::null_mut(), || {
        match value::to_state(value.cast_mut()) {
            Some(state) => value::into_raw(state),
            None => ptr::null_mut(),
        }
    })
}
