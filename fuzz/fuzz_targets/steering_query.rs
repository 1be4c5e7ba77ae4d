//! The content-steering server's query string: pathways and throughputs players report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multicdn_core::Timestamp;
use multicdn_steering::video::server::{Protocol, SteeringRequest, parse_measurements};

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    for protocol in [Protocol::Hls, Protocol::Dash] {
        let request = SteeringRequest::from_query_string(protocol, query, Vec::new());
        let _ = request.param(protocol.pathway_param());
        if let Ok(measured) = parse_measurements(&request, Timestamp::from_secs(1_764_504_000)) {
            for m in &measured {
                let _ = m.provider();
            }
        }
    }
});
