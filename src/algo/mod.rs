//! The limiting algorithms, each a pure function of (parameters, stored state, now, request).

pub mod gcra;
