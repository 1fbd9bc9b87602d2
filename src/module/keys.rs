//! Opening a limiter key, loading its state (WRONGTYPE here), storing a write with an
//! absolute expiry, and telling the server about it (replication, WATCH, keyspace event).

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};

use redis_module::raw;

use super::call::{Access, Arg};
use super::data_type::redis_type;
use super::error::CommandError;
use super::value;
use crate::codec;
use crate::limit::shown;
use crate::state::{Effect, Event, State, StateRef, Write};

/// The bytes of one `RL.APPLY` blob: on the stack up to 128 bytes.
type Announcement = codec::StackBytes<128>;

/// LimiterKey is a key opened by the running command, closed on drop.
///
/// Invariant: `ctx` is the live context of the command that opened the key and `key` is null
/// or the key it opened, valid until `Drop` closes it; the key's value, if ours, is only
/// accessed through `&self`/`&mut self` methods, so a [`StateRef`] borrowed from it cannot
/// outlive a later write.
pub struct LimiterKey<'a> {
    ctx: *mut raw::RedisModuleCtx,
    name: Arg<'a>,
    key: *mut raw::RedisModuleKey,
    /// The value pointer [`LimiterKey::raw_value`] last read (None: not read since the key
    /// was opened or its value last replaced), so that a load and the store that follows
    /// ask the server once.
    seen: Cell<Option<*mut c_void>>,
}

impl<'a> LimiterKey<'a> {
    /// Opens `name` for the command running in `ctx`. Opening for writing touches nothing
    /// until something is stored: the module signals modifications itself.
    pub(super) fn open(ctx: *mut raw::RedisModuleCtx, name: Arg<'a>, access: Access) -> Self {
        let mode = match access {
            Access::Write => raw::REDISMODULE_READ | raw::REDISMODULE_WRITE,
            Access::Read => raw::REDISMODULE_READ,
        };
        // SAFETY: `ctx` is the live context of the running command (only `Call::open` calls
        // this) and `name` one of its arguments.
        let key = unsafe {
            match raw::RedisModule_OpenKey {
                Some(open) => open(ctx, name.raw(), mode as c_int),
                None => std::ptr::null_mut(),
            }
        };
        Self {
            ctx,
            name,
            key,
            seen: Cell::new(None),
        }
    }

    /// The key's name for messages: lossy UTF-8, at most 64 characters.
    pub fn display_name(&self) -> String {
        shown(self.name.bytes())
    }

    /// Returns the key's raw value pointer (null for a missing key).
    ///
    /// Errors: [`CommandError::WrongType`] when the key holds another Redis type.
    #[inline(always)]
    fn raw_value(&self) -> Result<*mut c_void, CommandError> {
        if let Some(raw) = self.seen.get() {
            return Ok(raw);
        }
        let raw = self.read_raw_value()?;
        self.seen.set(Some(raw));
        Ok(raw)
    }

    /// [`LimiterKey::raw_value`], asking the server.
    #[inline(always)]
    fn read_raw_value(&self) -> Result<*mut c_void, CommandError> {
        if self.key.is_null() {
            return Ok(std::ptr::null_mut());
        }
        // SAFETY: `key` is open (struct invariant).
        unsafe {
            let key_type = raw::RedisModule_KeyType.map_or(0, |f| f(self.key));
            if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                return Ok(std::ptr::null_mut());
            }
            let module_type =
                raw::RedisModule_ModuleTypeGetType.map_or(std::ptr::null_mut(), |f| f(self.key));
            if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int || module_type != redis_type() {
                return Err(CommandError::WrongType);
            }
            Ok(raw::RedisModule_ModuleTypeGetValue.map_or(std::ptr::null_mut(), |f| f(self.key)))
        }
    }

    /// Returns the key's limiter state, `None` for a missing key.
    ///
    /// Errors: [`CommandError::WrongType`] when the key holds another Redis type.
    #[inline(always)]
    pub fn load(&self) -> Result<Option<StateRef<'_>>, CommandError> {
        let raw = self.raw_value()?;
        // SAFETY: a value of our type was made by `value`; the key stays open and unwritten
        // while the returned view borrows `self`.
        Ok(unsafe { value::view(raw) })
    }

    /// Makes `raw` (a value made by `value`) the key's value, replacing whatever it held; the
    /// TTL is dropped, so set it again with [`LimiterKey::set_expire_at`].
    fn set_raw(&mut self, raw: *mut c_void) {
        self.seen.set(None);
        // SAFETY: `key` is open for writing (only writes call this) and `raw` is a fresh
        // value of our type, whose ownership passes to Redis (or is freed here).
        unsafe {
            match raw::RedisModule_ModuleTypeSetValue {
                Some(set) => {
                    set(self.key, redis_type(), raw);
                }
                None => value::free(raw),
            }
        }
    }

    /// Stores `write`: in place when the key's value can hold it, else as a new value.
    #[inline(always)]
    pub fn store(&mut self, write: &Write) {
        if let Ok(raw) = self.raw_value() {
            // SAFETY: a non-null value of our type was made by `value`; nothing borrows it
            // (`&mut self`).
            if !raw.is_null() && unsafe { value::write_in_place(raw, write) } {
                return;
            }
        }
        let raw = value::new_value(write);
        if !raw.is_null() {
            self.set_raw(raw);
        }
    }

    /// Makes `state` the key's value, replacing whatever it held.
    pub fn replace(&mut self, state: State) {
        self.set_raw(value::from_state(state));
    }

    /// Whether the key holds a LOG with no request, or a LEASE with no lease, left (to be
    /// deleted).
    pub fn is_emptied(&self) -> bool {
        match self.raw_value() {
            // SAFETY: as for `load`.
            Ok(raw) => unsafe { value::is_emptied(raw) },
            Err(_) => false,
        }
    }

    /// Sets the absolute expiry, ms since the epoch.
    pub fn set_expire_at(&mut self, expire_at_ms: i64) {
        // SAFETY: `key` is open for writing.
        unsafe {
            if let Some(set_abs) = raw::RedisModule_SetAbsExpire {
                set_abs(self.key, expire_at_ms);
            }
        }
    }

    /// Deletes the key.
    pub fn delete(&mut self) {
        self.seen.set(None);
        // SAFETY: `key` is open for writing.
        unsafe {
            if let Some(delete) = raw::RedisModule_DeleteKey {
                delete(self.key);
            }
        }
    }

    /// After a write: propagates `write` with the expiry `expire_at_ms` and the event
    /// (`RL.APPLY key <blob>`) to replicas and the AOF, signals the modification (WATCH) and
    /// emits the keyspace event `event`.
    #[inline(always)]
    pub fn announce(&self, write: &Write, expire_at_ms: i64, event: Event) {
        match codec::compact_announcement(event, write, expire_at_ms) {
            Some(compact) => self.replicate(compact.as_slice()),
            None => {
                let mut blob = Announcement::new();
                codec::encode_announcement_into(event, write, expire_at_ms, &mut blob);
                self.replicate(blob.as_slice());
            }
        }
        self.signal(event);
    }

    /// After a deletion: propagates it (`RL.APPLY key <blob>`, so replicas emit the same
    /// event), signals the modification and emits the event.
    pub fn announce_delete(&self, event: Event) {
        let mut blob = Announcement::new();
        codec::encode_event_prefix_into(event, &mut blob);
        codec::encode_effect_into(&Effect::Delete, &mut blob);
        self.replicate(blob.as_slice());
        self.signal(event);
    }

    /// Propagates `RL.APPLY key <blob>` to replicas and the AOF.
    #[inline(always)]
    fn replicate(&self, bytes: &[u8]) {
        // Two arguments only (the key and one blob holding event, expiry and effect): every
        // extra argument costs the server an allocation per write.
        // SAFETY: `ctx` is the live context of the running command; the format "sb" takes
        // the key string and a (pointer, length) pair that outlives the call.
        unsafe {
            if let Some(replicate) = raw::RedisModule_Replicate {
                replicate(
                    self.ctx,
                    c"RL.APPLY".as_ptr(),
                    c"sb".as_ptr(),
                    self.name.raw(),
                    bytes.as_ptr().cast::<c_char>(),
                    bytes.len(),
                );
            }
        }
    }

    /// Signals the modification (WATCH) and emits the keyspace event `event`.
    #[inline(always)]
    pub fn signal(&self, event: Event) {
        // SAFETY: `ctx` is the live context of the running command; `event` is
        // NUL-terminated and the key name is one of its arguments.
        unsafe {
            if let Some(signal) = raw::RedisModule_SignalModifiedKey {
                signal(self.ctx, self.name.raw());
            }
            if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
                notify(
                    self.ctx,
                    raw::REDISMODULE_NOTIFY_MODULE,
                    event.name().as_ptr(),
                    self.name.raw(),
                );
            }
        }
    }
}

impl Drop for LimiterKey<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: `key` was opened by `open` and is closed exactly once, here.
            unsafe {
                if let Some(close) = raw::RedisModule_CloseKey {
                    close(self.key);
                }
            }
        }
    }
}
