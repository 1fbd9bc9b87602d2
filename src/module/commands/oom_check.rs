//! `RL.OOMCHECK`: the internal probe through which the limiting commands ask the server's own
//! out-of-memory verdict. It does nothing and replies `OK`; it is flagged `deny-oom`, so when
//! a limiting command calls it with `RedisModule_Call`'s `M` flag, the server refuses it
//! exactly when it refuses `deny-oom` commands at this moment (its verdict at the start of
//! the running command, after its eviction pass). See [`Call::is_out_of_memory`].

use crate::module::call::Call;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::error::CommandError;

/// RL.OOMCHECK.
pub struct OomCheck;

impl Command for OomCheck {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.OOMCHECK",
        display: "RL.OOMCHECK",
        flags: c"deny-oom fast no-monitor no-slowlog",
        arity: 1,
        keys: Keys::None,
        summary: c"Internal: replies OK unless the server refuses deny-oom commands now",
        complexity: c"O(1)",
        args: &[],
        acl: c"",
        in_ratelimit_category: false,
        counters: None,
    };

    fn run(call: &Call<'_>) -> Result<Counted, CommandError> {
        call.reply_simple(c"OK");
        Ok(Counted::Allowed)
    }
}
