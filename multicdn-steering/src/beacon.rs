//! The beacons real users send, and the network the receiving side attaches to them.
//!
//! Two kinds, as the client scripts of seed 000 send them:
//!
//! - the **navigation beacon**, sent on every page load: `{"path":"/p/1","ttfb":182,
//!   "provider":"fastly","pop":"LHR","cache":"HIT"}`, the provider, PoP and cache status read
//!   from `Server-Timing`;
//! - the **probe beacon**, sent by the sampled probe that times every provider:
//!   `{"times":{"fastly":120.5,"cloudflare":98.1},"best":"cloudflare"}`. The seed's script sends
//!   `times` as an array in its own provider order (a failed fetch is `Infinity`, which
//!   `JSON.stringify` writes as `null`); both forms are read, the array with the order the
//!   receiver is configured with.
//!
//! The browser does not know its network: the receiver attaches a [`ClientNetwork`] (ASN and
//! country) from the client's address through a
//! [`NetworkResolver`](crate::resolve::NetworkResolver).

use std::collections::BTreeMap;

use multicdn_core::served_by::CacheStatus;
use multicdn_core::{Continent, Country, NetworkKey, Timestamp};
use serde::{Deserialize, Serialize};

/// A page load's timing, with who served it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NavigationBeacon {
    /// The page's path.
    #[serde(default)]
    pub path: String,
    /// Time to first byte, in milliseconds.
    pub ttfb: f64,
    /// The provider that served it (`fastly`), or `unknown`.
    pub provider: String,
    /// The PoP (`LHR`), or empty.
    #[serde(default)]
    pub pop: String,
    /// The cache status as the edge wrote it (`HIT`), or empty.
    #[serde(default)]
    pub cache: String,
}

impl NavigationBeacon {
    /// A beacon from its parts.
    pub fn new(path: &str, ttfb: f64, provider: &str, pop: &str, cache: &str) -> NavigationBeacon {
        NavigationBeacon {
            path: path.to_owned(),
            ttfb,
            provider: provider.to_owned(),
            pop: pop.to_owned(),
            cache: cache.to_owned(),
        }
    }

    /// The cache status, normalised; `None` when the edge said nothing.
    pub fn cache_status(&self) -> Option<CacheStatus> {
        (!self.cache.is_empty()).then(|| CacheStatus::parse(&self.cache))
    }
}

/// The probe's times, as either form the client may send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProbeTimes {
    /// `{"fastly": 120.5, "cloudflare": null}`: `null` is a failed fetch.
    ByProvider(BTreeMap<String, Option<f64>>),
    /// `[120.5, null]`, in the order the receiver is configured with.
    InOrder(Vec<Option<f64>>),
}

/// One run of the client-side probe: each provider's time, and the fastest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeBeacon {
    /// Milliseconds per provider; `None` for a failed fetch.
    pub times: ProbeTimes,
    /// The provider the client picked.
    #[serde(default)]
    pub best: String,
}

impl ProbeBeacon {
    /// A beacon from per-provider times.
    pub fn new(times: impl IntoIterator<Item = (String, Option<f64>)>, best: &str) -> ProbeBeacon {
        ProbeBeacon {
            times: ProbeTimes::ByProvider(times.into_iter().collect()),
            best: best.to_owned(),
        }
    }

    /// The times paired with provider names; `order` names the providers of the array form.
    pub fn pairs<'a>(&'a self, order: &'a [String]) -> Vec<(&'a str, Option<f64>)> {
        match &self.times {
            ProbeTimes::ByProvider(map) => map.iter().map(|(k, v)| (k.as_str(), *v)).collect(),
            ProbeTimes::InOrder(list) => order
                .iter()
                .zip(list)
                .map(|(k, v)| (k.as_str(), *v))
                .collect(),
        }
    }
}

/// Either beacon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Beacon {
    /// A page load.
    Navigation(NavigationBeacon),
    /// A probe run.
    Probe(ProbeBeacon),
}

/// The client's network as the receiver resolved it from the client's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ClientNetwork {
    /// The autonomous system, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asn: Option<u32>,
    /// The country, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<Country>,
}

impl ClientNetwork {
    /// A network from an ASN and a country.
    pub fn new(asn: Option<u32>, country: Option<Country>) -> ClientNetwork {
        ClientNetwork { asn, country }
    }

    /// True when nothing is known.
    pub fn is_unknown(&self) -> bool {
        self.asn.is_none() && self.country.is_none()
    }

    /// The continent, from the country.
    pub fn continent(&self) -> Option<Continent> {
        self.country.and_then(multicdn_core::geo::continent_of)
    }

    /// The cuts this network falls in, finest first, ending with `*`:
    /// `[AS7922, US, continent:NA, *]`.
    pub fn cuts(&self) -> Vec<NetworkKey> {
        let mut out = Vec::with_capacity(4);
        if let Some(a) = self.asn {
            out.push(NetworkKey::Asn(a));
        }
        if let Some(c) = self.country {
            out.push(NetworkKey::Country(c));
        }
        if let Some(c) = self.continent() {
            out.push(NetworkKey::Continent(c));
        }
        out.push(NetworkKey::Global);
        out
    }
}

/// A beacon as received: when, from which network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Received {
    /// When the receiver got it.
    pub at: Timestamp,
    /// The client's network.
    pub network: ClientNetwork,
    /// The beacon.
    pub beacon: Beacon,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_seed_beacons() {
        let nav: Beacon = serde_json::from_str(
            r#"{"path":"/products/1","ttfb":182,"provider":"fastly","pop":"LHR","cache":"HIT"}"#,
        )
        .unwrap();
        let Beacon::Navigation(nav) = nav else {
            panic!("{nav:?}")
        };
        assert_eq!(nav.ttfb, 182.0);
        assert_eq!(nav.cache_status(), Some(CacheStatus::Hit));
        let probe: Beacon =
            serde_json::from_str(r#"{"times":[120.5,null],"best":"fastly"}"#).unwrap();
        let Beacon::Probe(probe) = probe else {
            panic!("{probe:?}")
        };
        let order = ["fastly".to_owned(), "cloudflare".to_owned()];
        assert_eq!(
            probe.pairs(&order),
            vec![("fastly", Some(120.5)), ("cloudflare", None)]
        );
    }

    #[test]
    fn lists_cuts_finest_first() {
        let n = ClientNetwork::new(Some(7922), Some(Country::new("US").unwrap()));
        let cuts: Vec<String> = n.cuts().iter().map(ToString::to_string).collect();
        assert_eq!(
            cuts,
            ["AS7922", "US", "NA", "*"].map(|s| {
                if s == "NA" {
                    "continent:NA".to_owned()
                } else {
                    s.to_owned()
                }
            })
        );
        assert_eq!(ClientNetwork::default().cuts(), vec![NetworkKey::Global]);
    }
}
