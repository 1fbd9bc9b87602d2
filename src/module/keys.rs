//! Opening a limiter key, loading its state (WRONGTYPE here), storing state with an absolute
//! expiry, and telling the server about the write (replication, WATCH, keyspace event).

use std::ffi::{c_char, c_int, c_void, CStr};

use redis_module::raw;

use super::data_type::{redis_type, with_scratch};
use super::error::CommandError;
use super::ffi;
use super::value::{self, Value};
use crate::algo::gcra::GcraState;
use crate::codec::{self, State};

/// An open key, closed on drop.
pub struct LimiterKey {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
}

impl LimiterKey {
    /// Opens `name`; with `write`, for writing (the module signals modifications itself, so
    /// opening for writing touches nothing until something is stored).
    pub fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        write: bool,
    ) -> Self {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let key = match unsafe { raw::RedisModule_OpenKey } {
            Some(open) => unsafe { open(ctx, name, mode as c_int) },
            None => std::ptr::null_mut(),
        };
        Self { ctx, name, key }
    }

    /// The key's name for messages: lossy UTF-8, at most 64 characters.
    pub fn display_name(&self) -> String {
        super::commands::shown(unsafe { ffi::bytes(self.name) })
    }

    /// Returns the key's raw value pointer (null for a missing key).
    ///
    /// Errors: [`CommandError::WrongType`] when the key holds another Redis type.
    fn raw_value(&self) -> Result<*mut c_void, CommandError> {
        if self.key.is_null() {
            return Ok(std::ptr::null_mut());
        }
        let key_type = unsafe { raw::RedisModule_KeyType.map_or(0, |f| f(self.key)) };
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return Ok(std::ptr::null_mut());
        }
        let module_type = unsafe {
            raw::RedisModule_ModuleTypeGetType.map_or(std::ptr::null_mut(), |f| f(self.key))
        };
        if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int || module_type != redis_type() {
            return Err(CommandError::WrongType);
        }
        Ok(unsafe {
            raw::RedisModule_ModuleTypeGetValue.map_or(std::ptr::null_mut(), |f| f(self.key))
        })
    }

    /// Returns the key's limiter state, `None` for a missing key.
    ///
    /// Errors: [`CommandError::WrongType`] when the key holds another Redis type.
    pub fn load(&mut self) -> Result<Option<Value<'_>>, CommandError> {
        let raw = self.raw_value()?;
        // SAFETY: values of our type are made by `value::into_raw`/`gcra_into_raw`, and the
        // key stays open (so the value alive) while `self` is borrowed.
        Ok(unsafe { value::view(raw) })
    }

    /// Makes `raw` (a value made by the `value` module) the key's value, replacing whatever
    /// it held; the TTL is dropped, so set it again with [`LimiterKey::set_expire_at`].
    pub fn set_raw(&mut self, raw: *mut c_void) {
        match unsafe { raw::RedisModule_ModuleTypeSetValue } {
            Some(set) => {
                unsafe { set(self.key, redis_type(), raw) };
            }
            None => unsafe { value::free(raw) },
        }
    }

    /// Makes `state` the key's value, replacing whatever it held.
    pub fn set_value(&mut self, state: State) {
        self.set_raw(value::into_raw(state));
    }

    /// Stores a GCRA state, in place when the key's value can hold it.
    pub fn put_gcra(&mut self, g: &GcraState) {
        if let Ok(raw) = self.raw_value() {
            if !raw.is_null() && unsafe { value::update_gcra(raw, g) } {
                return;
            }
        }
        self.set_raw(value::gcra_into_raw(g));
    }

    /// Stores any state (in place for GCRA when possible, else as a new value).
    pub fn put(&mut self, state: State) {
        match state {
            State::Gcra(g) => self.put_gcra(&g),
            other => self.set_value(other),
        }
    }

    /// Sets the absolute expiry, ms since the epoch.
    pub fn set_expire_at(&mut self, expire_at_ms: i64) {
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            unsafe { set_abs(self.key, expire_at_ms) };
        }
    }

    /// Deletes the key.
    pub fn delete(&mut self) {
        if let Some(delete) = unsafe { raw::RedisModule_DeleteKey } {
            unsafe { delete(self.key) };
        }
    }

    /// After a write: propagates the effect that `encode` writes, with the expiry
    /// `expire_at_ms` (`RL.APPLY key <blob>`), to replicas and the AOF, signals the
    /// modification (WATCH) and emits the keyspace event `event`.
    pub fn announce(&self, encode: impl FnOnce(&mut Vec<u8>), expire_at_ms: i64, event: &CStr) {
        replicate_effect(self.ctx, self.name, encode, expire_at_ms);
        self.signal(event);
    }

    /// After a deletion: propagates `DEL key`, signals the modification and emits the event.
    pub fn announce_delete(&self, event: &CStr) {
        if let Some(replicate) = unsafe { raw::RedisModule_Replicate } {
            unsafe { replicate(self.ctx, ffi::cstr(c"DEL"), ffi::cstr(c"s"), self.name) };
        }
        self.signal(event);
    }

    /// Signals the modification (WATCH) and emits the keyspace event `event`.
    pub fn signal(&self, event: &CStr) {
        unsafe {
            if let Some(signal) = raw::RedisModule_SignalModifiedKey {
                signal(self.ctx, self.name);
            }
            if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
                notify(
                    self.ctx,
                    raw::REDISMODULE_NOTIFY_MODULE,
                    event.as_ptr(),
                    self.name,
                );
            }
        }
    }
}

/// Propagates `RL.APPLY name <blob>` to replicas and the AOF: the blob holds the absolute
/// expiry `expire_at_ms` and the effect that `encode` writes.
pub fn replicate_effect(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    encode: impl FnOnce(&mut Vec<u8>),
    expire_at_ms: i64,
) {
    if let Some(replicate) = unsafe { raw::RedisModule_Replicate } {
        // Two arguments only (the key and one blob holding expiry and effect): every extra
        // argument costs the server an allocation per write.
        let encode_all = |buf: &mut Vec<u8>| {
            codec::encode_expiry_prefix_into(expire_at_ms, buf);
            encode(buf);
        };
        with_scratch(encode_all, |bytes| unsafe {
            replicate(
                ctx,
                ffi::cstr(c"RL.APPLY"),
                ffi::cstr(c"sb"),
                name,
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            )
        });
    }
}

impl Drop for LimiterKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            if let Some(close) = unsafe { raw::RedisModule_CloseKey } {
                unsafe { close(self.key) };
            }
        }
    }
}
