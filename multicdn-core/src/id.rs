//! Identifiers: providers, probe runners (regions) and steering cohorts.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use compact_str::CompactString;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: {why}")]
pub struct IdError {
    kind: &'static str,
    value: String,
    why: &'static str,
}

fn check(kind: &'static str, value: &str) -> Result<(), IdError> {
    let fail = |why| {
        Err(IdError {
            kind,
            value: value.to_owned(),
            why,
        })
    };
    if value.is_empty() {
        return fail("it is empty");
    }
    if value.len() > 63 {
        return fail("it is longer than 63 characters");
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return fail("use lowercase letters, digits, '-' and '_' only");
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$meta:meta])* $name:ident, $kind:literal, $repr:ty) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name($repr);

        impl $name {
            /// Checks `value` (lowercase letters, digits, `-`, `_`; 1 to 63 characters).
            pub fn new(value: &str) -> Result<Self, IdError> {
                check($kind, value)?;
                Ok(Self(<$repr>::from(value)))
            }

            /// For values built from known-valid parts inside this crate.
            #[allow(dead_code)]
            pub(crate) fn trusted(value: &str) -> Self {
                debug_assert!(check($kind, value).is_ok(), "{value}");
                Self(<$repr>::from(value))
            }

            /// The identifier as written.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

identifier!(
    /// A CDN provider as the policy names it: `fastly`, `cloudflare`, `akamai-cn`.
    ///
    /// Cheap to clone (a shared string), so plans and scoreboards can hold many; ids cloned
    /// from one another share their text, so comparing them is often a pointer comparison.
    ProviderId,
    "provider id",
    Arc<str>
);

identifier!(
    /// A probe runner's location: `eu-west`, `ap-southeast`. Quorum counts runners.
    RegionId,
    "region id",
    Arc<str>
);

identifier!(
    /// A steering cohort: a named group of networks that share one set of weights
    /// (`europe`, `default`, `as7922`).
    ///
    /// Held in place up to 24 bytes (every ASN cohort, `continent-eu`), so a plan of a hundred
    /// thousand cohorts copies its ids without touching the heap; longer ids (up to 63 bytes)
    /// are allocated.
    CohortId,
    "cohort id",
    CompactString
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_lowercase_ids_and_rejects_the_rest() {
        assert_eq!(ProviderId::new("fastly").unwrap().as_str(), "fastly");
        assert!(ProviderId::new("akamai-cn_2").is_ok());
        assert!(ProviderId::new("").is_err());
        assert!(ProviderId::new("Fastly").is_err());
        assert!(ProviderId::new("fast ly").is_err());
        let err = RegionId::new("EU West").unwrap_err().to_string();
        assert!(err.contains("region id"), "{err}");
    }

    #[test]
    fn cohort_ids_of_any_valid_length_look_up_by_their_text() {
        use std::collections::HashMap;
        let short = CohortId::new("as7922").unwrap();
        let long = CohortId::new(&"a".repeat(63)).unwrap();
        let mut map = HashMap::new();
        map.insert(short.clone(), 1);
        map.insert(long.clone(), 2);
        assert_eq!(map.get("as7922"), Some(&1));
        assert_eq!(map.get("a".repeat(63).as_str()), Some(&2));
        assert_eq!(long.clone(), long);
        // Ordered as their text is (plans and state files list cohorts in this order).
        assert_eq!(short.cmp(&long), "as7922".cmp("a".repeat(63).as_str()));
        assert!(CohortId::new(&"a".repeat(64)).is_err());
    }

    #[test]
    fn round_trips_through_serde() {
        let id: ProviderId = serde_json::from_str("\"cloudflare\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"cloudflare\"");
        assert!(serde_json::from_str::<ProviderId>("\"Cloud Flare\"").is_err());
    }
}
