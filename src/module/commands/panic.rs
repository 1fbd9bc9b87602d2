//! `RL.PANIC`: debug builds only. Panics on purpose so the tests can prove that a panic in a
//! command becomes an error reply and the server survives.

use crate::module::call::Call;
use crate::module::command::{Command, CommandSpec, Counted, Keys};
use crate::module::error::CommandError;

/// RL.PANIC.
pub struct Panic;

impl Command for Panic {
    const SPEC: CommandSpec = CommandSpec {
        name: c"RL.PANIC",
        display: "RL.PANIC",
        flags: c"readonly",
        arity: 1,
        keys: Keys::None,
        summary: c"Debug builds only: panics on purpose",
        complexity: c"O(1)",
        args: &[],
        acl: c"",
        in_ratelimit_category: false,
        counters: None,
    };

    /// Panics. Compiled only with `debug_assertions` (never in the release build), and, like
    /// every handler, called inside the trampoline's `catch_unwind`: the panic becomes an
    /// `ERR` reply and a log line, never an abort of the server.
    fn run(_call: &Call<'_>) -> Result<Counted, CommandError> {
        panic!("RL.PANIC: deliberate panic (debug builds only)");
    }
}
