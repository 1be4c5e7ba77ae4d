//! NS1, Fastly and Cloudflare JSON answers, read as the clients read them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multicdn_providers::fuzzing;

fuzz_target!(|data: &[u8]| {
    fuzzing::ns1_answer(data);
    fuzzing::fastly_answer(data);
    fuzzing::cloudflare_answer(data);
});
