//! CMSD: an upstream `CMSD-Dynamic` value with this node's entry appended. Whatever comes from
//! upstream, the value sent on is a valid Structured Field list ending with this node's entry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multicdn_steering::video::shedding::append_cmsd_dynamic;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `upstream\nnode`: the first line from upstream, the rest names the node.
    let (upstream, node) = text.split_once('\n').unwrap_or((text, "edge-sin-1"));
    let kbps = u32::try_from(data.len())
        .unwrap_or(u32::MAX)
        .wrapping_mul(977);
    let Ok(out) = append_cmsd_dynamic(Some(upstream), node, kbps) else {
        return;
    };
    let list = sfv::Parser::new(&out)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{out:?} is not a Structured Field list: {e}"));
    assert!(!list.is_empty(), "{out:?}");
});
