//! What a command is to the glue: its [`CommandSpec`] (name, flags, arity, key positions,
//! `COMMAND DOCS` metadata, ACL categories, `INFO rl` counters) and its handler
//! ([`Command::run`]); and the registration of one command with the server.
//!
//! Each command lives in one file under `commands/` that implements [`Command`]; the list
//! of commands in `commands/mod.rs` is the only other place that names it.

use std::ffi::{c_int, CStr, CString};
use std::mem::MaybeUninit;

use redis_module::raw;

use super::call::{trampoline, Call};
use super::docs::{self, Arg};
use super::error::CommandError;
use super::stats::Counters;

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// No key.
    None,
    /// Argument 1 is the only key.
    First,
    /// Argument 1 is `numkeys`, the keys follow (movable keys: answered by
    /// [`Command::key_positions`] for servers that route them through the getkeys API).
    AfterNumkeys,
}

/// CommandSpec is everything the server is told about a command.
pub struct CommandSpec {
    /// The command's name (`RL.GCRA`).
    pub name: &'static CStr,
    /// The name in log lines.
    pub display: &'static str,
    /// Command flags (`write fast`, …).
    pub flags: &'static CStr,
    /// Redis arity: positive = exact, negative = at least.
    pub arity: c_int,
    /// Where the keys are.
    pub keys: Keys,
    /// `COMMAND DOCS` summary.
    pub summary: &'static CStr,
    /// `COMMAND DOCS` complexity.
    pub complexity: &'static CStr,
    /// `COMMAND DOCS` arguments.
    pub args: &'static [Arg],
    /// ACL categories where the server supports setting them; the module's `ratelimit`
    /// category is added when the server could register it and `in_ratelimit_category`.
    pub acl: &'static CStr,
    /// Whether the command belongs to the `@ratelimit` ACL category.
    pub in_ratelimit_category: bool,
    /// The command's `INFO rl` counters (None: not counted) and their name there.
    pub counters: Option<&'static Counters>,
}

/// Counted is how a finished call shows in `INFO rl`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Counted {
    /// The request was admitted (RL.REFUND: something was given back).
    Allowed,
    /// The request was denied (RL.REFUND: nothing to give back).
    Denied,
    /// The call failed with an error reply.
    Error,
}

impl Counted {
    /// Allowed or denied.
    pub fn from_allowed(allowed: bool) -> Self {
        if allowed {
            Self::Allowed
        } else {
            Self::Denied
        }
    }
}

/// Command is one command of the module.
pub trait Command {
    /// What the server is told about the command.
    const SPEC: CommandSpec;

    /// Runs the command: validates every argument before touching a key, replies, and
    /// returns how the call counts. On `Err` the trampoline sends the error reply, so a
    /// handler replies only after every step that can fail.
    fn run(call: &Call<'_>) -> Result<Counted, CommandError>;

    /// Answers a key-position request (only for [`Keys::AfterNumkeys`] commands).
    fn key_positions(_call: &Call<'_>) {}
}

/// Registers command `C` with the server: creates it with its trampoline, then sets its
/// `COMMAND DOCS`/key-spec information and, where the server supports them, its ACL
/// categories.
pub fn register<C: Command>(
    ctx: *mut raw::RedisModuleCtx,
    ratelimit_category: bool,
) -> Result<(), String> {
    let spec = &C::SPEC;
    let name = spec.display;
    let key_pos = c_int::from(spec.keys == Keys::First);
    // SAFETY: `ctx` is the load context (registration runs only in `OnLoad`); the name and
    // flags are NUL-terminated statics; the handler is an `extern "C"` function with the
    // signature Redis expects.
    let status = unsafe {
        let create = raw::RedisModule_CreateCommand.ok_or("no CreateCommand API")?;
        create(
            ctx,
            spec.name.as_ptr(),
            Some(trampoline::<C>),
            spec.flags.as_ptr(),
            key_pos,
            key_pos,
            key_pos,
        )
    };
    if status != raw::Status::Ok as c_int {
        return Err(format!("cannot create command {name}"));
    }
    // SAFETY: as above; `GetCommand` returns the command just created, or null.
    let command = unsafe {
        let get = raw::RedisModule_GetCommand.ok_or("no GetCommand API")?;
        get(ctx, spec.name.as_ptr())
    };
    if command.is_null() {
        return Err(format!("cannot find command {name} after creating it"));
    }
    set_info(command, spec)?;
    if !spec.acl.is_empty() {
        let categories = if ratelimit_category && spec.in_ratelimit_category {
            CString::new(format!("{} ratelimit", spec.acl.to_string_lossy())).unwrap_or_default()
        } else {
            spec.acl.to_owned()
        };
        docs::set_acl_categories(ctx, command, &categories);
    }
    Ok(())
}

/// Sets a command's `COMMAND INFO`/`DOCS` data: summary, complexity, arity, key-specs and
/// arguments.
fn set_info(command: *mut raw::RedisModuleCommand, spec: &CommandSpec) -> Result<(), String> {
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    // SAFETY: all-zero is the API's "end of array" marker and a valid bit pattern for this
    // plain C struct (integers, unions of integers).
    let zeroed_spec =
        || unsafe { MaybeUninit::<raw::RedisModuleCommandKeySpec>::zeroed().assume_init() };
    let mut key_specs = [zeroed_spec(), zeroed_spec()];
    if spec.keys != Keys::None {
        let ks = &mut key_specs[0];
        ks.flags = u64::from(
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_ACCESS
                | raw::REDISMODULE_CMD_KEY_UPDATE,
        );
        ks.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        ks.bs.index.pos = 1;
        if spec.keys == Keys::First {
            ks.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            ks.fk.range.lastkey = 0;
            ks.fk.range.keystep = 1;
            ks.fk.range.limit = 0;
        } else {
            // Where the keys end depends on more than numkeys (a call whose numkeys swallows
            // spec words has no keys): VARIABLE_FLAGS makes the server ask the command's
            // getkeys callback (`Command::key_positions`) instead of trusting this spec alone.
            ks.flags |= u64::from(raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS);
            // numkeys at the begin index (offset 0), the first key right after it.
            ks.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            ks.fk.keynum.keynumidx = 0;
            ks.fk.keynum.firstkey = 1;
            ks.fk.keynum.keystep = 1;
        }
    }
    // SAFETY: all-zero is a valid "absent" value for every field of this C struct (null
    // pointers, zero integers).
    let mut info: raw::RedisModuleCommandInfo = unsafe { MaybeUninit::zeroed().assume_init() };
    info.version = &version;
    info.summary = spec.summary.as_ptr();
    info.complexity = spec.complexity.as_ptr();
    info.since = c"0.1.0".as_ptr();
    info.arity = spec.arity;
    info.key_specs = if spec.keys != Keys::None {
        key_specs.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    let mut arena = Vec::new();
    info.args = if spec.args.is_empty() {
        std::ptr::null_mut()
    } else {
        docs::build(spec.args, 0, &mut arena)
    };
    // SAFETY: `command` is a live command of this module; `info` and everything it points
    // to (`version`, `key_specs`, the `arena` of argument arrays, static strings) outlive
    // the call, and Redis copies what it keeps.
    let status = unsafe {
        let set_info = raw::RedisModule_SetCommandInfo.ok_or("no SetCommandInfo API")?;
        set_info(command, &info)
    };
    drop(arena);
    if status != raw::Status::Ok as c_int {
        return Err(format!("cannot set command info of {}", spec.display));
    }
    Ok(())
}
