//! Client networks: an ASN, a country, a continent, or everywhere.
//!
//! Written as `AS7922`, `DE`, `EU`, `*`. Four continent codes collide with ISO 3166 country codes
//! (`AF` Afghanistan, `AS` American Samoa, `NA` Namibia, `SA` Saudi Arabia), so a two-letter code
//! is always read as a country unless it is one of the unambiguous continents `EU`, `OC` and `AN`;
//! every continent can also be written `continent:XX`, and the ambiguous ones print that way.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A continent, with Route 53's two-letter codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Continent {
    /// Africa (`AF`).
    Africa,
    /// Antarctica (`AN`).
    Antarctica,
    /// Asia (`AS`).
    Asia,
    /// Europe (`EU`).
    Europe,
    /// North America (`NA`).
    NorthAmerica,
    /// Oceania (`OC`).
    Oceania,
    /// South America (`SA`).
    SouthAmerica,
}

impl Continent {
    /// Every continent.
    pub const ALL: [Continent; 7] = [
        Continent::Africa,
        Continent::Antarctica,
        Continent::Asia,
        Continent::Europe,
        Continent::NorthAmerica,
        Continent::Oceania,
        Continent::SouthAmerica,
    ];

    /// The two-letter code Route 53 uses.
    pub fn code(self) -> &'static str {
        match self {
            Continent::Africa => "AF",
            Continent::Antarctica => "AN",
            Continent::Asia => "AS",
            Continent::Europe => "EU",
            Continent::NorthAmerica => "NA",
            Continent::Oceania => "OC",
            Continent::SouthAmerica => "SA",
        }
    }

    /// Reads a two-letter continent code (any case).
    pub fn from_code(code: &str) -> Option<Continent> {
        Continent::ALL
            .into_iter()
            .find(|c| c.code().eq_ignore_ascii_case(code))
    }

    /// True when the code is not also a country code.
    fn unambiguous(self) -> bool {
        matches!(
            self,
            Continent::Europe | Continent::Oceania | Continent::Antarctica
        )
    }
}

/// An ISO 3166-1 alpha-2 country code, stored uppercase.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Country([u8; 2]);

impl Country {
    /// Reads an ISO 3166-1 alpha-2 code (any case): `DE`, `gb`. Two letters that name no
    /// country (`UK`, `ZZ`) are refused; `XK` (Kosovo), which geolocation databases use, is
    /// accepted.
    pub fn new(code: &str) -> Result<Country, NetworkError> {
        let upper = match code.as_bytes() {
            [a, b] if a.is_ascii_alphabetic() && b.is_ascii_alphabetic() => {
                [a.to_ascii_uppercase(), b.to_ascii_uppercase()]
            }
            _ => return Err(NetworkError::new(code, "a country is two letters, like DE")),
        };
        if !crate::geo::is_assigned(&upper) {
            return Err(NetworkError::new(
                code,
                "not an ISO 3166-1 alpha-2 country code (the United Kingdom is GB)",
            ));
        }
        Ok(Country(upper))
    }

    /// The code's two bytes, uppercase ASCII letters (those of [`Country::as_str`]).
    ///
    /// ```
    /// use multicdn_core::Country;
    /// let c = Country::new("gb")?;
    /// assert_eq!(c.as_bytes(), *b"GB");
    /// assert_eq!(&c.as_bytes(), c.as_str().as_bytes());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn as_bytes(&self) -> [u8; 2] {
        self.0
    }

    /// The code, uppercase.
    pub fn as_str(&self) -> &str {
        // Both bytes are ASCII letters by construction.
        std::str::from_utf8(&self.0).unwrap_or("??")
    }

    /// The continent this country sits on, where known.
    pub fn continent(&self) -> Option<Continent> {
        crate::geo::continent_of(*self)
    }
}

impl fmt::Debug for Country {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Country({})", self.as_str())
    }
}

impl fmt::Display for Country {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a string is not a network key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network {value:?}: {why}")]
pub struct NetworkError {
    value: String,
    why: &'static str,
}

impl NetworkError {
    fn new(value: &str, why: &'static str) -> Self {
        NetworkError {
            value: value.to_owned(),
            why,
        }
    }
}

/// Where a client is, at one of four granularities: the cuts of the scoreboard and the
/// selectors of steering cohorts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NetworkKey {
    /// An autonomous system: `AS7922`.
    Asn(u32),
    /// A country: `DE`.
    Country(Country),
    /// A continent: `EU`, or `continent:AS`.
    Continent(Continent),
    /// Everywhere: `*`.
    Global,
}

impl NetworkKey {
    /// How fine the cut is: 0 for an ASN, 3 for global.
    pub fn granularity(&self) -> u8 {
        match self {
            NetworkKey::Asn(_) => 0,
            NetworkKey::Country(_) => 1,
            NetworkKey::Continent(_) => 2,
            NetworkKey::Global => 3,
        }
    }
}

impl fmt::Display for NetworkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkKey::Asn(n) => write!(f, "AS{n}"),
            NetworkKey::Country(c) => f.write_str(c.as_str()),
            NetworkKey::Continent(c) if c.unambiguous() => f.write_str(c.code()),
            NetworkKey::Continent(c) => write!(f, "continent:{}", c.code()),
            NetworkKey::Global => f.write_str("*"),
        }
    }
}

impl FromStr for NetworkKey {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Self, NetworkError> {
        let s = s.trim();
        if s == "*" {
            return Ok(NetworkKey::Global);
        }
        if let Some(code) = s.strip_prefix("continent:") {
            return Continent::from_code(code)
                .map(NetworkKey::Continent)
                .ok_or_else(|| NetworkError::new(s, "continents are AF, AN, AS, EU, NA, OC, SA"));
        }
        if let Some(digits) = s.strip_prefix("AS").or_else(|| s.strip_prefix("as"))
            && !digits.is_empty()
        {
            return digits.parse::<u32>().map(NetworkKey::Asn).map_err(|_| {
                NetworkError::new(s, "an ASN is AS followed by a number up to 4294967295")
            });
        }
        if s.len() == 2 {
            if let Some(c) = Continent::from_code(s).filter(|c| c.unambiguous()) {
                return Ok(NetworkKey::Continent(c));
            }
            return Country::new(s).map(NetworkKey::Country);
        }
        Err(NetworkError::new(
            s,
            "write an ASN (AS7922), a country (DE), a continent (EU, continent:AS) or *",
        ))
    }
}

impl Serialize for NetworkKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetworkKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The networks a steering cohort covers: usually one (`AS7922`), sometimes a list (a region's
/// countries).
///
/// Read it as a slice (`networks.contains(..)`, `*networks == [key]`, `for n in &networks`).
/// Cloning is cheap whatever the length: one network is held in place and copied, a list is
/// shared behind a reference count. A decision round copies every cohort it does not change,
/// so this matters at a hundred thousand cohorts.
#[derive(Clone)]
pub struct Networks(NetworksRepr);

#[derive(Clone)]
enum NetworksRepr {
    /// Exactly one network (the common case).
    One(NetworkKey),
    /// Any other number, shared.
    Many(Arc<[NetworkKey]>),
}

impl Networks {
    /// No networks.
    pub fn empty() -> Networks {
        Networks(NetworksRepr::Many(Arc::from([])))
    }

    /// One network.
    pub const fn one(key: NetworkKey) -> Networks {
        Networks(NetworksRepr::One(key))
    }

    /// The networks as a slice.
    pub fn as_slice(&self) -> &[NetworkKey] {
        match &self.0 {
            NetworksRepr::One(key) => std::slice::from_ref(key),
            NetworksRepr::Many(keys) => keys,
        }
    }
}

impl Default for Networks {
    fn default() -> Networks {
        Networks::empty()
    }
}

impl std::ops::Deref for Networks {
    type Target = [NetworkKey];

    fn deref(&self) -> &[NetworkKey] {
        self.as_slice()
    }
}

impl AsRef<[NetworkKey]> for Networks {
    fn as_ref(&self) -> &[NetworkKey] {
        self.as_slice()
    }
}

impl std::borrow::Borrow<[NetworkKey]> for Networks {
    fn borrow(&self) -> &[NetworkKey] {
        self.as_slice()
    }
}

impl<'a> IntoIterator for &'a Networks {
    type Item = &'a NetworkKey;
    type IntoIter = std::slice::Iter<'a, NetworkKey>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl From<NetworkKey> for Networks {
    fn from(key: NetworkKey) -> Networks {
        Networks::one(key)
    }
}

impl From<&[NetworkKey]> for Networks {
    fn from(keys: &[NetworkKey]) -> Networks {
        match keys {
            [one] => Networks::one(*one),
            _ => Networks(NetworksRepr::Many(Arc::from(keys))),
        }
    }
}

impl<const N: usize> From<[NetworkKey; N]> for Networks {
    fn from(keys: [NetworkKey; N]) -> Networks {
        Networks::from(&keys[..])
    }
}

impl From<Vec<NetworkKey>> for Networks {
    fn from(keys: Vec<NetworkKey>) -> Networks {
        Networks::from(keys.as_slice())
    }
}

impl FromIterator<NetworkKey> for Networks {
    fn from_iter<I: IntoIterator<Item = NetworkKey>>(iter: I) -> Networks {
        Networks::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl fmt::Debug for Networks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for Networks {
    fn eq(&self, other: &Networks) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Networks {}

impl PartialEq<[NetworkKey]> for Networks {
    fn eq(&self, other: &[NetworkKey]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<Vec<NetworkKey>> for Networks {
    fn eq(&self, other: &Vec<NetworkKey>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<const N: usize> PartialEq<[NetworkKey; N]> for Networks {
    fn eq(&self, other: &[NetworkKey; N]) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialOrd for Networks {
    fn partial_cmp(&self, other: &Networks) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Networks {
    fn cmp(&self, other: &Networks) -> std::cmp::Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl std::hash::Hash for Networks {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl Serialize for Networks {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.as_slice())
    }
}

impl<'de> Deserialize<'de> for Networks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<NetworkKey>::deserialize(d).map(Networks::from)
    }
}

impl Serialize for Country {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Country {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Country::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_four_granularities() {
        assert_eq!(
            "AS7922".parse::<NetworkKey>().unwrap(),
            NetworkKey::Asn(7922)
        );
        assert_eq!(
            "de".parse::<NetworkKey>().unwrap(),
            NetworkKey::Country(Country::new("DE").unwrap())
        );
        assert_eq!(
            "EU".parse::<NetworkKey>().unwrap(),
            NetworkKey::Continent(Continent::Europe)
        );
        assert_eq!("*".parse::<NetworkKey>().unwrap(), NetworkKey::Global);
    }

    #[test]
    fn ambiguous_codes_read_as_countries_unless_prefixed() {
        // AS is American Samoa as a country; Asia needs the prefix.
        assert!(matches!(
            "AS".parse::<NetworkKey>().unwrap(),
            NetworkKey::Country(_)
        ));
        let asia: NetworkKey = "continent:AS".parse().unwrap();
        assert_eq!(asia, NetworkKey::Continent(Continent::Asia));
        assert_eq!(asia.to_string(), "continent:AS");
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        for bad in [
            "",
            "ASX",
            "AS99999999999",
            "D",
            "DEU",
            "continent:XX",
            "1A",
            "é1",
        ] {
            assert!(bad.parse::<NetworkKey>().is_err(), "{bad}");
        }
    }

    #[test]
    fn countries_are_iso_3166_codes_not_any_two_letters() {
        for bad in ["UK", "ZZ", "QQ", "AA", "EL"] {
            let err = Country::new(bad).unwrap_err().to_string();
            assert!(err.contains("ISO 3166-1"), "{bad}: {err}");
            assert!(bad.parse::<NetworkKey>().is_err(), "{bad}");
            assert!(serde_json::from_str::<Country>(&format!("\"{bad}\"")).is_err());
        }
        for good in ["GB", "gb", "DE", "US", "XK", "AQ", "SS"] {
            assert!(Country::new(good).is_ok(), "{good}");
        }
    }

    fn any_key() -> impl Strategy<Value = NetworkKey> {
        prop_oneof![
            any::<u32>().prop_map(NetworkKey::Asn),
            "[A-Z]{2}".prop_filter_map("an assigned code", |s| Country::new(&s)
                .ok()
                .map(NetworkKey::Country)),
            (0usize..7).prop_map(|i| NetworkKey::Continent(Continent::ALL[i])),
            Just(NetworkKey::Global),
        ]
    }

    #[test]
    fn networks_read_as_a_slice_and_compare_by_content() {
        let one = Networks::from(vec![NetworkKey::Asn(7922)]);
        let also_one: Networks = [NetworkKey::Asn(7922)].into();
        assert_eq!(one, also_one);
        assert_eq!(one, [NetworkKey::Asn(7922)]);
        assert!(one.contains(&NetworkKey::Asn(7922)));
        let many: Networks = ["DE", "FR", "GB"]
            .iter()
            .map(|s| s.parse::<NetworkKey>().unwrap())
            .collect();
        assert_eq!(many.len(), 3);
        assert_ne!(one, many);
        assert!(Networks::empty().is_empty());
        let json = serde_json::to_string(&many).unwrap();
        assert_eq!(json, r#"["DE","FR","GB"]"#);
        let back: Networks = serde_json::from_str(&json).unwrap();
        assert_eq!(back, many);
        let single: Networks = serde_json::from_str(r#"["AS7922"]"#).unwrap();
        assert_eq!(single, one);
        assert_eq!(format!("{one:?}"), "[Asn(7922)]");
    }

    proptest! {
        #[test]
        fn display_then_parse_is_identity(key in any_key()) {
            // Two-letter country codes that spell EU/OC/AN read back as continents by design.
            let printed = key.to_string();
            let back: NetworkKey = printed.parse().unwrap();
            if let NetworkKey::Country(c) = key
                && matches!(c.as_str(), "EU" | "OC" | "AN")
            {
                return Ok(());
            }
            prop_assert_eq!(back, key);
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,12}") {
            let _ = s.parse::<NetworkKey>();
        }
    }
}
