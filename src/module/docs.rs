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

const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const DOUBLE: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE;
const KEY: raw::RedisModuleCommandArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
const TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;
const ONEOF: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF;
const OPTIONAL: u32 = raw::REDISMODULE_CMD_ARG_OPTIONAL;
const MULTIPLE: u32 = raw::REDISMODULE_CMD_ARG_MULTIPLE;

const fn arg(
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

const fn opt(
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

const KEY_ARG: Arg = arg(c"key", KEY, c"the limiter key");
const QUANTITY: Arg = opt(
    c"quantity",
    INTEGER,
    c"QUANTITY",
    c"requests to admit at once (default 1; 0 only reports)",
);
const PEEK: Arg = opt(c"peek", TOKEN, c"PEEK", c"evaluate exactly, write nothing");

/// RL.GCRA's arguments.
pub const GCRA: &[Arg] = &[
    KEY_ARG,
    arg(c"burst", INTEGER, c"requests an idle key admits at once"),
    arg(c"rate", INTEGER, c"requests per period"),
    arg(
        c"period",
        DOUBLE,
        c"seconds, plain decimal with up to 9 decimals",
    ),
    QUANTITY,
    PEEK,
    opt(
        c"maxwait",
        INTEGER,
        c"MAXWAIT",
        c"reserve a slot that frees within this many ms",
    ),
];

const ALGORITHMS: &[Arg] = &[
    Arg {
        name: c"fixed",
        kind: TOKEN,
        token: Some(c"FIXED"),
        flags: 0,
        subargs: &[],
        summary: None,
    },
    Arg {
        name: c"sliding",
        kind: TOKEN,
        token: Some(c"SLIDING"),
        flags: 0,
        subargs: &[],
        summary: None,
    },
    Arg {
        name: c"log",
        kind: TOKEN,
        token: Some(c"LOG"),
        flags: 0,
        subargs: &[],
        summary: None,
    },
];

/// RL.WINDOW's arguments.
pub const WINDOW: &[Arg] = &[
    KEY_ARG,
    arg(c"limit", INTEGER, c"requests allowed per window"),
    arg(
        c"window",
        DOUBLE,
        c"seconds, plain decimal with up to 9 decimals",
    ),
    Arg {
        name: c"algorithm",
        kind: ONEOF,
        token: None,
        flags: OPTIONAL,
        subargs: ALGORITHMS,
        summary: Some(c"default SLIDING"),
    },
    QUANTITY,
    PEEK,
];

/// RL.ALL's arguments.
pub const ALL: &[Arg] = &[
    arg(c"numkeys", INTEGER, c"number of keys"),
    Arg {
        name: c"key",
        kind: KEY,
        token: None,
        flags: MULTIPLE,
        subargs: &[],
        summary: Some(c"the limiter keys"),
    },
    Arg {
        name: c"spec",
        kind: STRING,
        token: None,
        flags: MULTIPLE,
        subargs: &[],
        summary: Some(
            c"one per key: GCRA burst rate period | WINDOW limit window [FIXED|SLIDING|LOG]",
        ),
    },
    QUANTITY,
    PEEK,
];

/// RL.REFUND's arguments.
pub const REFUND: &[Arg] = &[
    KEY_ARG,
    arg(c"quantity", INTEGER, c"requests to give back (>= 1)"),
];

/// CL.THROTTLE's arguments.
pub const THROTTLE: &[Arg] = &[
    KEY_ARG,
    arg(c"max_burst", INTEGER, c"capacity is max_burst + 1"),
    arg(c"count_per_period", INTEGER, c"requests per period"),
    arg(c"period", INTEGER, c"whole seconds"),
    Arg {
        name: c"quantity",
        kind: INTEGER,
        token: None,
        flags: OPTIONAL,
        subargs: &[],
        summary: Some(c"default 1"),
    },
];

/// RL.APPLY's arguments.
pub const APPLY: &[Arg] = &[
    KEY_ARG,
    arg(
        c"effect",
        STRING,
        c"encoded effect (replication and AOF only)",
    ),
];

/// Converts `args` to the API's zero-terminated array. The vectors own every nested array;
/// keep them alive until `SetCommandInfo` returns (Redis copies what it needs).
pub fn build(
    args: &[Arg],
    key_spec_index: c_int,
    arena: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
    for a in args {
        // SAFETY: all-zero is a valid "absent" value for every field of this C struct.
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
    out.push(unsafe { MaybeUninit::zeroed().assume_init() });
    let p = out.as_mut_ptr();
    arena.push(out);
    p
}

/// Adds the `ratelimit` ACL category where the server can (7.4+, Valkey 8+). Returns whether
/// it exists afterwards.
pub fn add_acl_category(ctx: *mut raw::RedisModuleCtx) -> bool {
    let Some(add) = (unsafe { raw::RedisModule_AddACLCategory }) else {
        return false;
    };
    if unsafe { add(ctx, c"ratelimit".as_ptr()) } == raw::Status::Ok as c_int {
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
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return;
    };
    if unsafe { set(command, categories.as_ptr()) } != raw::Status::Ok as c_int {
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
