//! The steering manifest: the JSON document a content-steering server answers with.
//!
//! HLS and DASH players read the same keys: `VERSION` (always 1), `TTL` (seconds until the
//! player asks again), `RELOAD-URI` (where to ask next, carrying the session's state),
//! `PATHWAY-PRIORITY` (pathway ids, best first) and, optionally, `PATHWAY-CLONES` (new pathways
//! derived from existing ones by replacing the host and query parameters).
//!
//! ```
//! use multicdn_steering::video::manifest::SteeringManifest;
//!
//! let m = SteeringManifest::new(300, vec!["cdn-b".into(), "cdn-a".into()])
//!     .with_reload_uri("https://steer.example.com/hls.json?session=abc");
//! let json = m.to_json()?;
//! assert!(json.starts_with(r#"{"VERSION":1,"TTL":300,"RELOAD-URI":"#));
//! assert_eq!(SteeringManifest::from_json(&json)?, m);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The only manifest version the HLS and DASH steering specifications define.
pub const MANIFEST_VERSION: u32 = 1;

/// A steering manifest, serialised with the exact uppercase keys players expect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteeringManifest {
    /// Always [`MANIFEST_VERSION`].
    #[serde(rename = "VERSION")]
    pub version: u32,
    /// Seconds until the player reloads the manifest.
    #[serde(rename = "TTL")]
    pub ttl: u64,
    /// Where the player asks next; carries the session's state in its query.
    #[serde(
        rename = "RELOAD-URI",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reload_uri: Option<String>,
    /// Pathway ids, most preferred first.
    #[serde(rename = "PATHWAY-PRIORITY")]
    pub pathway_priority: Vec<String>,
    /// Pathways the player derives from existing ones.
    #[serde(
        rename = "PATHWAY-CLONES",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pathway_clones: Vec<PathwayClone>,
}

/// A pathway derived from another by replacing the host and adding query parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathwayClone {
    /// The pathway cloned.
    #[serde(rename = "BASE-ID")]
    pub base_id: String,
    /// The new pathway's id.
    #[serde(rename = "ID")]
    pub id: String,
    /// How its URIs differ from the base pathway's.
    #[serde(rename = "URI-REPLACEMENT")]
    pub uri_replacement: UriReplacement,
}

/// The parts of a URI a clone replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UriReplacement {
    /// The new host (`c.example.com`).
    #[serde(rename = "HOST", default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Query parameters added to (or replaced in) every URI.
    #[serde(rename = "PARAMS", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

/// Why a manifest is not one a player would accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// `VERSION` is not 1.
    #[error("steering manifest VERSION is {0}; players only understand VERSION 1")]
    Version(u32),
    /// `PATHWAY-PRIORITY` is empty.
    #[error("PATHWAY-PRIORITY is empty; list at least one pathway id")]
    NoPathway,
    /// A pathway id has characters the specifications forbid.
    #[error("pathway id {0:?} is not valid: use 1 to 64 of A-Z a-z 0-9 . - _")]
    PathwayId(String),
    /// A pathway appears twice in `PATHWAY-PRIORITY` or two clones share an id.
    #[error("pathway id {0:?} appears twice")]
    Duplicate(String),
    /// A clone reuses the id of the pathway it clones.
    #[error("clone {0:?} has the same id as its base pathway")]
    CloneOfItself(String),
    /// The JSON could not be read or written.
    #[error("steering manifest JSON: {0}")]
    Json(String),
}

/// True for a legal pathway id: 1 to 64 characters from `A-Z a-z 0-9 . - _`.
pub fn is_valid_pathway_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

impl SteeringManifest {
    /// A manifest with the given TTL (seconds) and pathway order, without reload URI or clones.
    pub fn new(ttl: u64, pathway_priority: Vec<String>) -> SteeringManifest {
        SteeringManifest {
            version: MANIFEST_VERSION,
            ttl,
            reload_uri: None,
            pathway_priority,
            pathway_clones: Vec::new(),
        }
    }

    /// Sets `RELOAD-URI`.
    pub fn with_reload_uri(mut self, uri: impl Into<String>) -> SteeringManifest {
        self.reload_uri = Some(uri.into());
        self
    }

    /// Sets `PATHWAY-CLONES`.
    pub fn with_clones(mut self, clones: Vec<PathwayClone>) -> SteeringManifest {
        self.pathway_clones = clones;
        self
    }

    /// Checks what players check: version 1, at least one pathway, legal and unique ids.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.version != MANIFEST_VERSION {
            return Err(ManifestError::Version(self.version));
        }
        if self.pathway_priority.is_empty() {
            return Err(ManifestError::NoPathway);
        }
        let mut seen = BTreeSet::new();
        for id in &self.pathway_priority {
            if !is_valid_pathway_id(id) {
                return Err(ManifestError::PathwayId(id.clone()));
            }
            if !seen.insert(id.as_str()) {
                return Err(ManifestError::Duplicate(id.clone()));
            }
        }
        let mut clones = BTreeSet::new();
        for c in &self.pathway_clones {
            for id in [&c.base_id, &c.id] {
                if !is_valid_pathway_id(id) {
                    return Err(ManifestError::PathwayId(id.clone()));
                }
            }
            if c.base_id == c.id {
                return Err(ManifestError::CloneOfItself(c.id.clone()));
            }
            if !clones.insert(c.id.as_str()) {
                return Err(ManifestError::Duplicate(c.id.clone()));
            }
        }
        Ok(())
    }

    /// The JSON players read (compact, keys in specification order).
    pub fn to_json(&self) -> Result<String, ManifestError> {
        serde_json::to_string(self).map_err(|e| ManifestError::Json(e.to_string()))
    }

    /// Reads a manifest and validates it.
    pub fn from_json(json: &str) -> Result<SteeringManifest, ManifestError> {
        let m: SteeringManifest =
            serde_json::from_str(json).map_err(|e| ManifestError::Json(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_the_contract_example_with_uppercase_keys() {
        let m = SteeringManifest::new(300, vec!["cdn-b".into(), "cdn-a".into()])
            .with_reload_uri("https://steer.example.com/hls.json?session=s1")
            .with_clones(vec![PathwayClone {
                base_id: "cdn-a".into(),
                id: "cdn-c".into(),
                uri_replacement: UriReplacement {
                    host: Some("c.example.com".into()),
                    params: BTreeMap::from([("token".into(), "x".into())]),
                },
            }]);
        let v: serde_json::Value = serde_json::from_str(&m.to_json().unwrap()).unwrap();
        assert_eq!(v["VERSION"], 1);
        assert_eq!(v["TTL"], 300);
        assert_eq!(v["PATHWAY-PRIORITY"][0], "cdn-b");
        assert_eq!(v["PATHWAY-CLONES"][0]["BASE-ID"], "cdn-a");
        assert_eq!(
            v["PATHWAY-CLONES"][0]["URI-REPLACEMENT"]["HOST"],
            "c.example.com"
        );
        assert_eq!(
            v["PATHWAY-CLONES"][0]["URI-REPLACEMENT"]["PARAMS"]["token"],
            "x"
        );
    }

    #[test]
    fn omits_clones_and_reload_uri_when_absent() {
        let json = SteeringManifest::new(30, vec!["a".into()])
            .to_json()
            .unwrap();
        assert_eq!(json, r#"{"VERSION":1,"TTL":30,"PATHWAY-PRIORITY":["a"]}"#);
    }

    #[test]
    fn refuses_what_players_would_refuse() {
        let bad = |m: SteeringManifest| m.validate().unwrap_err();
        let mut m = SteeringManifest::new(1, vec!["a".into()]);
        m.version = 2;
        assert_eq!(bad(m), ManifestError::Version(2));
        assert_eq!(
            bad(SteeringManifest::new(1, vec![])),
            ManifestError::NoPathway
        );
        assert!(matches!(
            bad(SteeringManifest::new(1, vec!["a b".into()])),
            ManifestError::PathwayId(_)
        ));
        assert!(matches!(
            bad(SteeringManifest::new(1, vec!["a".into(), "a".into()])),
            ManifestError::Duplicate(_)
        ));
        assert!(SteeringManifest::from_json("{\"VERSION\":\"one\"}").is_err());
    }
}
