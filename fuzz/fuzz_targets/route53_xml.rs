//! Route 53's XML answers and error bodies, read as the client reads them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        multicdn_providers::fuzzing::route53_answer(text);
    }
});
