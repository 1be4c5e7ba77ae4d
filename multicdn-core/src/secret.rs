//! Credentials that never reach a log line.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A secret value (API token, access key). `Debug` and `Display` print `[redacted]`; the value
/// is read only through [`Secret::expose`], at the one place that sends it.
///
/// It deliberately does not implement `Serialize`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// Reads a secret from an environment variable; `None` when unset or empty.
    pub fn from_env(var: &str) -> Option<Secret> {
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .map(Secret)
    }

    /// The value, for the request that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_its_value() {
        let s = Secret::new("tok-123456");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&s)), "Some([redacted])");
        assert_eq!(s.expose(), "tok-123456");
    }
}
