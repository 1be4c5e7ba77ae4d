//! Time as a parameter. Decision code takes `now`; loops take a [`Clock`].
//!
//! This is the one module allowed to read the system's clocks (the workspace's `clippy.toml`
//! bans `Instant::now` and `SystemTime::now` everywhere else), so tests can run on a
//! [`ManualClock`] and never sleep for real.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time: milliseconds since the Unix epoch (UTC). Serialises as RFC 3339.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// From milliseconds since the epoch.
    pub const fn from_millis(ms: u64) -> Timestamp {
        Timestamp(ms)
    }

    /// From whole seconds since the epoch.
    pub const fn from_secs(s: u64) -> Timestamp {
        Timestamp(s * 1000)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Reads RFC 3339 (`2026-11-30T15:00:00Z`).
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, humantime::TimestampError> {
        let t = humantime::parse_rfc3339_weak(s)?;
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Ok(Timestamp(ms))
    }

    /// Time elapsed from `earlier` to `self` (zero when `earlier` is later).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating (also `timestamp + duration`).
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(d.as_millis() as u64))
    }

    /// `self - d`, saturating at the epoch (also `timestamp - duration`).
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(d.as_millis() as u64))
    }

    fn system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        self.plus(d)
    }
}

impl std::ops::Sub<Duration> for Timestamp {
    type Output = Timestamp;
    fn sub(self, d: Duration) -> Timestamp {
        self.minus(d)
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC, to the millisecond when there are any.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(
                f,
                "{}",
                humantime::format_rfc3339_seconds(self.system_time())
            )
        } else {
            write!(
                f,
                "{}",
                humantime::format_rfc3339_millis(self.system_time())
            )
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "{e}: write an RFC 3339 time like 2026-12-01T09:00:00Z"
            ))
        })
    }
}

/// Where time comes from.
pub trait Clock: fmt::Debug + Send + Sync {
    /// Wall-clock time, for stamping observations and journal entries.
    fn now(&self) -> Timestamp;
}

impl<T: Clock + ?Sized> Clock for Arc<T> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

impl<T: Clock + ?Sized> Clock for &T {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place the wall clock is read
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// A clock that moves only when told to. Clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock {
            ms: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.ms.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to `t` (which may be earlier: clocks do step back).
    pub fn set(&self, t: Timestamp) {
        self.ms.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.ms.load(Ordering::SeqCst))
    }
}

/// A monotonic stopwatch for measuring how long a call took (latency, time to acknowledge).
///
/// Kept here so that the ban on `Instant::now` has one reviewed exception.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// Starts measuring.
    #[allow(clippy::disallowed_methods)] // the one place the monotonic clock is read
    pub fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    /// Time since [`Stopwatch::start`].
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_secs(100));
        let shared = clock.clone();
        assert_eq!(clock.now(), Timestamp::from_secs(100));
        shared.advance(Duration::from_secs(90));
        assert_eq!(clock.now(), Timestamp::from_secs(190));
    }

    #[test]
    fn timestamps_print_and_parse_rfc3339() {
        let t = Timestamp::parse_rfc3339("2026-12-01T09:00:00Z").unwrap();
        assert_eq!(t.to_string(), "2026-12-01T09:00:00Z");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
        assert!(Timestamp::parse_rfc3339("Tuesday").is_err());
        assert_eq!(
            (t + Duration::from_millis(5)).to_string(),
            "2026-12-01T09:00:00.005Z"
        );
    }
}
