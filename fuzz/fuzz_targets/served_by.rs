//! `Server-Timing` and the vendors' identity headers. Input: header lines `name: value`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multicdn_core::served_by::{parse_server_timing, served_by};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_server_timing(text);
    let headers: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let _ = served_by(headers.as_slice());
    if let Ok(map) = to_header_map(&headers) {
        let _ = served_by(&map);
    }
});

fn to_header_map(headers: &[(&str, &str)]) -> Result<http::HeaderMap, ()> {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| ())?;
        let value = http::HeaderValue::from_str(v).map_err(|_| ())?;
        map.append(name, value);
    }
    Ok(map)
}
