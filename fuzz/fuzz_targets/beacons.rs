//! The NDJSON beacon path: the fast scanner must read every line exactly as `serde_json` does,
//! and no stream may panic the ingestor or the scoreboard (a snapshot and its dashboard too).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use multicdn_core::{ProviderId, Timestamp};
use multicdn_steering::ingest::{Ingestor, fast_path_agrees};
use multicdn_steering::resolve::NoResolver;
use multicdn_steering::scoreboard::{Scoreboard, ScoreboardConfig};

fuzz_target!(|data: &[u8]| {
    for line in data.split(|b| *b == b'\n') {
        if let Err(e) = fast_path_agrees(line) {
            panic!("{e}");
        }
    }
    let providers = ["fastly", "cloudflare"].map(|p| ProviderId::new(p).ok());
    let providers: Vec<ProviderId> = providers.into_iter().flatten().collect();
    let Ok(mut board) = Scoreboard::new(ScoreboardConfig::default().min_samples(1), &providers)
    else {
        return;
    };
    let mut ingest = Ingestor::new(NoResolver).probe_order(["fastly", "cloudflare"]);
    ingest.ingest_bytes(data, &mut board);
    let report = ingest.report();
    assert!(report.beacons + report.bad_total() <= report.lines);
    for (_, _, detail) in &report.examples {
        assert!(
            detail.len() <= 512,
            "an example detail of {} bytes",
            detail.len()
        );
    }
    let snap = board.snapshot(
        Timestamp::from_secs(1_764_504_000),
        Duration::from_secs(3600),
    );
    let _ = format!("{snap:?}");
});
