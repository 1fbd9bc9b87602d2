//! The limiting algorithms, each a pure function of (parameters, stored state, now, request).

pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
