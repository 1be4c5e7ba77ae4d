//! The policy's units: durations written `90s`, `10m`, `1h30m` (or a bare number of seconds),
//! and shares written `10%`, `12.5%` (or a bare number of percent).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::weights::TOTAL_BP;

/// A duration as the policy writes it: `90s`, `10m`, `250ms`, or a bare number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(pub Duration);

impl Dur {
    /// From seconds.
    pub const fn secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }

    /// From milliseconds.
    pub const fn millis(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl From<Dur> for Duration {
    fn from(d: Dur) -> Duration {
        d.0
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration like 90s, 10m, 250ms or 1h, or a number of seconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dur, E> {
                Ok(Dur::secs(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                u64::try_from(v)
                    .map(Dur::secs)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Dur, E> {
                if v.is_finite() && (0.0..1e12).contains(&v) {
                    Ok(Dur(Duration::from_secs_f64(v)))
                } else {
                    Err(E::custom(
                        "a duration must be a non-negative number of seconds",
                    ))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                humantime::parse_duration(v.trim()).map(Dur).map_err(|e| {
                    E::custom(format!(
                        "{v:?} is not a duration ({e}): write 90s, 10m, 250ms or 1h"
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// A share of traffic, stored in basis points (`10%` is 1,000). Written `10%`, `12.5%`, or a
/// bare number of percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Share(pub u32);

impl Share {
    /// From whole percent.
    pub const fn percent(p: u32) -> Share {
        Share(p * 100)
    }

    /// Basis points.
    pub const fn bp(self) -> u32 {
        self.0
    }

    /// As a fraction, 0.0 to 1.0 (or more, for shares above 100% that validation rejects).
    pub fn fraction(self) -> f64 {
        f64::from(self.0) / f64::from(TOTAL_BP)
    }

    fn from_percent_f64(p: f64) -> Result<Share, String> {
        if !p.is_finite() || p < 0.0 {
            return Err(format!("{p}% is not a share: write 0% to 100%"));
        }
        let bp = (p * 100.0).round();
        if ((bp / 100.0) - p).abs() > 1e-9 {
            return Err(format!("{p}% has more than two decimals"));
        }
        if bp > 1e9 {
            return Err(format!("{p}% is far above 100%"));
        }
        Ok(Share(bp as u32))
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(100) {
            write!(f, "{}%", self.0 / 100)
        } else {
            write!(f, "{}%", f64::from(self.0) / 100.0)
        }
    }
}

impl Serialize for Share {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Share;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a share like 10% or 12.5%, or a number of percent")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Share, E> {
                Share::from_percent_f64(v as f64).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Share, E> {
                Share::from_percent_f64(v as f64).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Share, E> {
                Share::from_percent_f64(v).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Share, E> {
                let t = v.trim();
                let num = t.strip_suffix('%').ok_or_else(|| {
                    E::custom(format!(
                        "{v:?} is not a share: write it as a percentage like 10%"
                    ))
                })?;
                let p: f64 = num.trim().parse().map_err(|_| {
                    E::custom(format!(
                        "{v:?} is not a share: write it as a percentage like 10%"
                    ))
                })?;
                Share::from_percent_f64(p).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// `#[serde(with = "duration_ms")]`: a `Duration` as whole milliseconds.
pub mod duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes milliseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    /// Reads milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        d: Dur,
        s: Share,
    }

    fn read(y: &str) -> Result<Doc, String> {
        serde_saphyr::from_str::<Doc>(y).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_durations_and_shares_as_written() {
        let doc = read("d: 90s\ns: 10%").unwrap();
        assert_eq!((doc.d, doc.s), (Dur::secs(90), Share(1000)));
        let doc = read("d: 10m\ns: 12.5%").unwrap();
        assert_eq!((doc.d, doc.s), (Dur::secs(600), Share(1250)));
        let doc = read("d: 30\ns: 85").unwrap();
        assert_eq!((doc.d, doc.s), (Dur::secs(30), Share(8500)));
        assert_eq!(Share(1250).to_string(), "12.5%");
        assert_eq!(Dur::secs(90).to_string(), "1m 30s");
    }

    #[test]
    fn refuses_malformed_units_with_a_hint() {
        let e = read("d: soon\ns: 10%").err().unwrap();
        assert!(e.contains("90s"), "{e}");
        let e = read("d: 1s\ns: ten").err().unwrap();
        assert!(e.contains("10%"), "{e}");
        assert!(read("d: -5\ns: 1%").is_err());
        assert!(read("d: 5s\ns: 10.123%").is_err());
    }
}
