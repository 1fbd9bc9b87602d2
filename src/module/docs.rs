//! Command documentation for `COMMAND DOCS` (arguments) and ACL categories, registered with
//! whatever the server's API offers: arguments through `SetCommandInfo` (Redis 7.0+),
//! `@write`/`@fast` and the module's own `@ratelimit` category where
//! `SetCommandACLCategories` (7.2+) and `AddACLCategory` (7.4+, Valkey 8+) exist.

use std::ffi::{c_int, CStr};
use std::mem::MaybeUninit;
use std::ptr;

use redis_module::raw;

use super::ffi::{self, Level};

/// One argument of a command, as `COMMAND DOCS` shows it.
pub struct Arg {
    /// Argument name.
    pub name: &'static CStr,
    /// `REDISMODULE_ARG_TYPE_*`.
    pub kind: raw::RedisModuleCommandArgType,
    /// Keyword that introduces it (`QUANTITY`), if any.
    pub token: Option<&'static CStr>,
    /// `REDISMODULE_CMD_ARG_*` flags.
    pub flags: u32,
    /// Alternatives / parts, for ONEOF and BLOCK.
    pub subargs: &'static [Arg],
    /// Short description.
    pub summary: Option<&'static CStr>,
}

/// A string argument.
pub const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
/// An integer argument.
pub const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
/// A number with decimals.
pub const DOUBLE: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE;
/// A key.
pub const KEY: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
/// A keyword without a value.
pub const TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;
/// One of the sub-arguments.
pub const ONEOF: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF;
/// The argument may be left out.
pub const OPTIONAL: u32 = raw::REDISMODULE_CMD_ARG_OPTIONAL;
/// The argument may repeat.
pub const MULTIPLE: u32 = raw::REDISMODULE_CMD_ARG_MULTIPLE;

/// A required argument.
pub const fn arg(
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    summary: &'static CStr,
) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: 0,
        subargs: &[],
        summary: Some(summary),
    }
}

/// An optional argument introduced by `token`.
pub const fn opt(
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    token: &'static CStr,
    summary: &'static CStr,
) -> Arg {
    Arg {
        name,
        kind,
        token: Some(token),
        flags: OPTIONAL,
        subargs: &[],
        summary: Some(summary),
    }
}

/// A keyword alternative (inside a ONEOF).
pub const fn token(name: &'static CStr, token: &'static CStr) -> Arg {
    Arg {
        name,
        kind: TOKEN,
        token: Some(token),
        flags: 0,
        subargs: &[],
        summary: None,
    }
}

/// The limiter key.
pub const KEY_ARG: Arg = arg(c"key", KEY, c"the limiter key");
/// `QUANTITY n`.
pub const QUANTITY: Arg = opt(
    c"quantity",
    INTEGER,
    c"QUANTITY",
    c"requests to admit at once (default 1; 0 only reports)",
);
/// `PEEK`.
pub const PEEK: Arg = opt(c"peek", TOKEN, c"PEEK", c"evaluate exactly, write nothing");
/// `FORCE`.
pub const FORCE: Arg = opt(
    c"force",
    TOKEN,
    c"FORCE",
    c"record usage that already happened, past the limit if need be",
);
/// A `period` in seconds.
pub const SECONDS_PERIOD: Arg = arg(
    c"period",
    DOUBLE,
    c"seconds, plain decimal with up to 9 decimals",
);
/// A `lease` in seconds.
pub const SECONDS_LEASE: Arg = arg(
    c"lease",
    DOUBLE,
    c"seconds a lease lasts unless renewed, plain decimal with up to 9 decimals",
);
/// A `window` in seconds.
pub const SECONDS_WINDOW: Arg = arg(
    c"window",
    DOUBLE,
    c"seconds, plain decimal with up to 9 decimals",
);

/// Converts `args` to the API's zero-terminated array. The vectors own every nested array;
/// keep them alive until `SetCommandInfo` returns (Redis copies what it needs).
pub fn build(
    args: &[Arg],
    key_spec_index: c_int,
    arena: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
    for a in args {
        // SAFETY: all-zero is a valid "absent" value for every field of this C struct (null
        // pointers, zero integers).
        let mut r: raw::RedisModuleCommandArg = unsafe { MaybeUninit::zeroed().assume_init() };
        r.name = a.name.as_ptr();
        r.type_ = a.kind;
        r.key_spec_index = if a.kind == KEY { key_spec_index } else { -1 };
        r.token = a.token.map_or(ptr::null(), CStr::as_ptr);
        r.summary = a.summary.map_or(ptr::null(), CStr::as_ptr);
        r.flags = a.flags as c_int;
        if !a.subargs.is_empty() {
            r.subargs = build(a.subargs, key_spec_index, arena);
        }
        out.push(r);
    }
    // SAFETY: as above; the all-zero entry is the API's end-of-array marker.
    out.push(unsafe { MaybeUninit::zeroed().assume_init() });
    let p = out.as_mut_ptr();
    arena.push(out);
    p
}

/// Adds the `ratelimit` ACL category where the server can (7.4+, Valkey 8+). Returns whether
/// it exists afterwards.
pub fn add_acl_category(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: `ctx` is the load context; the name is a NUL-terminated static. The API is
    // absent before Redis 7.4 (the pointer is then None).
    let status = unsafe {
        let Some(add) = raw::RedisModule_AddACLCategory else {
            return false;
        };
        add(ctx, c"ratelimit".as_ptr())
    };
    if status == raw::Status::Ok as c_int {
        true
    } else {
        ffi::log(
            ctx,
            Level::Warning,
            "redis-rl: could not add the ACL category 'ratelimit'",
        );
        false
    }
}

/// Sets a command's ACL categories where the server can (7.2+); a failure is only logged.
pub fn set_acl_categories(
    ctx: *mut raw::RedisModuleCtx,
    command: *mut raw::RedisModuleCommand,
    categories: &CStr,
) {
    // SAFETY: `command` is a live command of this module and `categories` NUL-terminated.
    // The API is absent before Redis 7.2 (the pointer is then None).
    let status = unsafe {
        let Some(set) = raw::RedisModule_SetCommandACLCategories else {
            return;
        };
        set(command, categories.as_ptr())
    };
    if status != raw::Status::Ok as c_int {
        ffi::log(
            ctx,
            Level::Warning,
            &format!(
                "redis-rl: could not set ACL categories '{}'",
                categories.to_string_lossy()
            ),
        );
    }
}
