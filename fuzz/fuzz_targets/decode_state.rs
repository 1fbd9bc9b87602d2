//! The codec's decoders read bytes from RDB files, RESTORE payloads and the replication
//! stream: whatever the bytes, no panic, and whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rl::codec;

fuzz_target!(|data: &[u8]| {
    if let Ok(state) = codec::decode(data) {
        let again = codec::encode(&state);
        // Input of an older version re-encodes as the newest; the newest round-trips exactly.
        if data.first() == Some(&codec::ENCODING_VERSION) {
            assert_eq!(again, data);
        }
        assert_eq!(codec::decode(&again), Ok(state));
    }
    let _ = codec::decode_effect(data);
    let _ = codec::decode_applied(data);
});
