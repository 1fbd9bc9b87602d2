//! The argument parsers see every byte a client sends: no panic, and what they accept obeys
//! the grammar (digits, one optional '.' followed by 1 to 9 digits, in range).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rl::params::GcraParams;
use redis_rl::time::{parse_count, parse_seconds, Span, MAX_PERIOD, NANOS_PER_SEC};

fuzz_target!(|data: &[u8]| {
    if let Some(n) = parse_count(data) {
        assert!(!data.is_empty() && data.iter().all(u8::is_ascii_digit));
        assert_eq!(
            n.to_string().trim_start_matches('0'),
            String::from_utf8_lossy(data).trim_start_matches('0')
        );
    }
    if let Some(span) = parse_seconds(data) {
        assert!(!span.is_zero() && span <= MAX_PERIOD);
        let ns = span.as_ns();
        let text = std::str::from_utf8(data).unwrap();
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        assert!(frac.len() <= 9 && !int.is_empty());
        assert_eq!(ns / NANOS_PER_SEC, int.parse::<u64>().unwrap());
    }
    // Arbitrary parameter combinations never panic either.
    if data.len() >= 24 {
        let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
        let _ = GcraParams::new(word(0), word(8), Span::from_ns(word(16)));
    }
});
