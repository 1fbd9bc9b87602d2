//! Opening a limiter key, loading its state (WRONGTYPE here), storing state with an absolute
//! expiry, and telling the server about the write.

use std::ffi::{c_char, c_int, CStr};

use redis_module::raw;

use super::data_type::{self, redis_type, with_encoded};
use super::error::CommandError;
use super::ffi;
use crate::codec::State;

/// An open key, closed on drop.
pub struct LimiterKey {
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
}

impl LimiterKey {
    /// Opens `name`; with `write`, for writing (the module signals modifications itself, so
    /// opening for writing touches nothing until [`LimiterKey::store`]).
    pub fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        write: bool,
    ) -> Self {
        let mode = if write { raw::REDISMODULE_READ | raw::REDISMODULE_WRITE } else { raw::REDISMODULE_READ };
        let key = match unsafe { raw::RedisModule_OpenKey } {
            Some(open) => unsafe { open(ctx, name, mode as c_int) },
            None => std::ptr::null_mut(),
        };
        Self { ctx, name, key }
    }

    /// Returns the key's limiter state, `None` for a missing key.
    ///
    /// Errors: [`CommandError::WrongType`] when the key holds another Redis type.
    pub fn load(&self) -> Result<Option<&mut State>, CommandError> {
        if self.key.is_null() {
            return Ok(None);
        }
        let key_type = unsafe { raw::RedisModule_KeyType.map_or(0, |f| f(self.key)) };
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return Ok(None);
        }
        let module_type = unsafe { raw::RedisModule_ModuleTypeGetType.map_or(std::ptr::null_mut(), |f| f(self.key)) };
        if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int || module_type != redis_type() {
            return Err(CommandError::WrongType);
        }
        let value = unsafe { raw::RedisModule_ModuleTypeGetValue.map_or(std::ptr::null_mut(), |f| f(self.key)) };
        Ok(unsafe { value.cast::<State>().as_mut() })
    }

    /// Stores `state` (in place when the key already holds a limiter) and sets the key to
    /// expire at `expire_at_ms` (ms since the epoch).
    pub fn store(&mut self, state: State, expire_at_ms: i64) {
        match self.load() {
            Ok(Some(existing)) => *existing = state,
            _ => {
                if let Some(set) = unsafe { raw::RedisModule_ModuleTypeSetValue } {
                    unsafe { set(self.key, redis_type(), data_type::into_value(state)) };
                }
            }
        }
        self.set_expire_at(expire_at_ms);
    }

    /// Stores `state` without touching the expiry the key has (AOF rewrite sends it apart).
    pub fn store_keep_ttl(&mut self, state: State) {
        match self.load() {
            Ok(Some(existing)) => *existing = state,
            _ => {
                if let Some(set) = unsafe { raw::RedisModule_ModuleTypeSetValue } {
                    unsafe { set(self.key, redis_type(), data_type::into_value(state)) };
                }
            }
        }
    }

    /// Sets the absolute expiry, ms since the epoch.
    pub fn set_expire_at(&mut self, expire_at_ms: i64) {
        if let Some(set_abs) = unsafe { raw::RedisModule_SetAbsExpire } {
            unsafe { set_abs(self.key, expire_at_ms) };
        }
    }

    /// After a write: propagates the effect (`RL.APPLY key state PXAT expire_at_ms`) to replicas
    /// and the AOF, signals the modification (WATCH) and emits the keyspace event `event`.
    pub fn announce_write(&self, state: &State, expire_at_ms: i64, event: &CStr) {
        if let Some(replicate) = unsafe { raw::RedisModule_Replicate } {
            with_encoded(state, |bytes| unsafe {
                replicate(
                    self.ctx,
                    ffi::cstr(c"RL.APPLY"),
                    ffi::cstr(c"sbcl"),
                    self.name,
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                    ffi::cstr(c"PXAT"),
                    expire_at_ms as std::ffi::c_longlong,
                )
            });
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
                notify(self.ctx, raw::REDISMODULE_NOTIFY_MODULE, event.as_ptr(), self.name);
            }
        }
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
