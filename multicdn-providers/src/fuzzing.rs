//! Entry points for the fuzz targets in `fuzz/`: each runs one vendor answer decoder on
//! arbitrary bytes exactly as the clients do, so the decoders' private types stay private.
//! Not part of the supported API.

use std::collections::BTreeMap;

use multicdn_core::ProviderId;

/// Every Route 53 answer shape the client reads, and the error body reader.
#[cfg(feature = "route53")]
pub fn route53_answer(body: &str) {
    use crate::route53::xml;
    if let Ok(page) = xml::parse::<xml::ListRecordSetsResponse>(body, "list") {
        for set in page.resource_record_sets.items {
            let _ = set.into_set();
        }
    }
    let _ = xml::parse::<xml::ChangeInfoResponse>(body, "change");
    let _ = xml::parse::<xml::HealthCheckResponse>(body, "health check");
    let _ = xml::parse::<xml::ListHealthChecksResponse>(body, "health checks");
    let _ = xml::parse::<xml::HealthCheckStatusResponse>(body, "status");
    let _ = xml::parse::<xml::CreateHostedZoneResponse>(body, "zone");
    let _ = xml::parse_error(body);
}

/// An NS1 record as `GET /v1/zones/...` returns it, read back into steering state.
#[cfg(feature = "ns1")]
pub fn ns1_answer(body: &[u8]) {
    if let Ok(record) = serde_json::from_slice::<crate::ns1::Ns1Record>(body) {
        let edges: BTreeMap<ProviderId, String> = ["fastly", "cloudflare"]
            .into_iter()
            .filter_map(|p| ProviderId::new(p).ok())
            .map(|p| {
                let host = format!("{p}.edge.example.net");
                (p, host)
            })
            .collect();
        let _ = crate::ns1::record::read_state(&record, &edges);
    }
}

/// Fastly's purge answers and error bodies.
#[cfg(feature = "fastly")]
pub fn fastly_answer(body: &[u8]) {
    use crate::fastly::wire;
    let _ = wire::error_message(body);
    let _ = wire::read_status(body, true);
    let _ = wire::read_status(body, false);
    let keys = ["a".to_owned(), "b".to_owned()];
    let _ = wire::read_batch(body, &keys);
}

/// Cloudflare's envelope: a success's purge id, a failure's classification.
#[cfg(feature = "cloudflare")]
pub fn cloudflare_answer(body: &[u8]) {
    use crate::cloudflare::wire;
    if let Ok(envelope) = wire::read_envelope(body) {
        let _ = wire::purge_id(&envelope);
        let _ = wire::failure(&envelope.errors);
    }
}
