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
        let read = parse_measurements(&request, Timestamp::from_secs(1_764_504_000));
        assert!(read.measurements.len() <= 16, "more measurements than the cap");
        for m in &read.measurements {
            let _ = m.provider();
        }
        for e in &read.rejected {
            let _ = e.to_string();
        }
    }
});
