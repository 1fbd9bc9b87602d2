//! Opening a limiter key, loading its state (WRONGTYPE here), storing state with an absolute
//! expiry, and telling the server about the write (replication, WATCH, keyspace event).

use std::ffi::{c_char, c_int, CStr};

use redis_module::raw;

use super::data_type::{self, redis_type, with_scratch};
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
    /// opening for writing touches nothing until something is stored).
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

    /// The key's name.
    pub fn name(&self) -> *mut raw::RedisModuleString {
        self.name
    }

    /// Returns the key's limiter state, `None` for a missing key.
    ///
    /// Errors: [`CommandError::WrongType`] when the key holds another Redis type.
    pub fn load(&mut self) -> Result<Option<&mut State>, CommandError> {
        if self.key.is_null() {
            return Ok(None);
        }
        let key_type = unsafe { raw::RedisModule_KeyType.map_or(0, |f| f(self.key)) };
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return Ok(None);
        }
        let module_type = unsafe {
            raw::RedisModule_ModuleTypeGetType.map_or(std::ptr::null_mut(), |f| f(self.key))
        };
        if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int || module_type != redis_type() {
            return Err(CommandError::WrongType);
        }
        let value = unsafe {
            raw::RedisModule_ModuleTypeGetValue.map_or(std::ptr::null_mut(), |f| f(self.key))
        };
        // SAFETY: values of our type are always `Box<State>` made by `data_type::into_value`,
        // and the key stays open (so the value alive) while `self` is borrowed.
        Ok(unsafe { value.cast::<State>().as_mut() })
    }

    /// Makes `state` the key's value, replacing whatever it held (the TTL is dropped: set it
    /// again with [`LimiterKey::set_expire_at`]).
    pub fn set_value(&mut self, state: State) {
        if let Some(set) = unsafe { raw::RedisModule_ModuleTypeSetValue } {
            unsafe { set(self.key, redis_type(), data_type::into_value(state)) };
        }
    }

    /// Stores `state`: in place when the key holds a limiter, else as a new value.
    pub fn put(&mut self, state: State) {
        match self.load() {
            Ok(Some(existing)) => *existing = state,
            _ => self.set_value(state),
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

    /// After a write: propagates the effect that `encode` writes (`RL.APPLY key <effect>
    /// PXAT expire_at_ms`) to replicas and the AOF, signals the modification (WATCH) and emits
    /// the keyspace event `event`.
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
                notify(self.ctx, raw::REDISMODULE_NOTIFY_MODULE, event.as_ptr(), self.name);
            }
        }
    }
}

/// Propagates `RL.APPLY name <effect> PXAT <expire_at_ms>` to replicas and the AOF, the
/// effect being what `encode` writes.
pub fn replicate_effect(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    encode: impl FnOnce(&mut Vec<u8>),
    expire_at_ms: i64,
) {
    if let Some(replicate) = unsafe { raw::RedisModule_Replicate } {
        with_scratch(encode, |bytes| unsafe {
            replicate(
                ctx,
                ffi::cstr(c"RL.APPLY"),
                ffi::cstr(c"sbcl"),
                name,
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
                ffi::cstr(c"PXAT"),
                expire_at_ms as std::ffi::c_longlong,
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
