//! Manifest tagging: any text from an origin, as an HLS playlist and as a DASH MPD. Tagging
//! never panics, and what it tags tags again to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multicdn_steering::video::tagging::{Pathway, TagOptions, tag_dash, tag_hls};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (Ok(manifest), Ok(a), Ok(b)) = (
        "https://origin.example.com/vod/master".parse(),
        "https://a.example.net/".parse(),
        "https://b.example.net/edge/".parse(),
    ) else {
        return;
    };
    let options = TagOptions {
        server_uri: "https://steer.example.com/v1/steer.json?content=vod&x=1".into(),
        default_pathway: "cdn-a".into(),
        pathways: vec![
            Pathway { id: "cdn-a".into(), base: a },
            Pathway { id: "cdn-b".into(), base: b },
        ],
    };
    if let Ok(tagged) = tag_hls(text, &manifest, &options) {
        let again = tag_hls(&tagged, &manifest, &options)
            .unwrap_or_else(|e| panic!("{tagged:?} does not tag again: {e}"));
        assert_eq!(again, tagged, "HLS tagging is not idempotent for {text:?}");
    }
    if let Ok(tagged) = tag_dash(text, &manifest, &options) {
        let again = tag_dash(&tagged, &manifest, &options)
            .unwrap_or_else(|e| panic!("{tagged:?} does not tag again: {e}"));
        assert_eq!(again, tagged, "DASH tagging is not idempotent for {text:?}");
    }
});
