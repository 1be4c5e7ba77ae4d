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
        Timestamp(s.saturating_mul(1000))
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Reads RFC 3339 (`2026-11-30T15:00:00Z`), and the expanded years past 9999 that
    /// [`Display`](fmt::Display) writes (`+10000-01-01T00:00:00Z`). A time before the epoch
    /// reads as the epoch; one past the last representable millisecond is out of range.
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, humantime::TimestampError> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix('+') {
            return parse_expanded(rest);
        }
        let t = humantime::parse_rfc3339_weak(s)?;
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Ok(Timestamp(ms))
    }

    /// Time elapsed from `earlier` to `self` (zero when `earlier` is later).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating (also `timestamp + duration`).
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(millis(d)))
    }

    /// `self - d`, saturating at the epoch (also `timestamp - duration`).
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(millis(d)))
    }
}

/// Whole milliseconds of `d`, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

const MS_PER_DAY: u64 = 86_400_000;
/// Days in 400 Gregorian years: the calendar repeats exactly after them.
const DAYS_PER_ERA: u64 = 146_097;

/// `(year, month, day)` of a day number counted from 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Days since 0000-03-01; every u64 millisecond count gives a day number far below overflow.
    let z = days + 719_468;
    let era = z / DAYS_PER_ERA;
    let doe = z - era * DAYS_PER_ERA;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// `+YYYYY-MM-DDTHH:MM:SS[.fff]Z`: the year moved into 2000-2399 (same place in the 400-year
/// cycle) for humantime, then the whole cycles added back.
fn parse_expanded(rest: &str) -> Result<Timestamp, humantime::TimestampError> {
    use humantime::TimestampError as E;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits < 5 {
        return Err(E::InvalidFormat);
    }
    let year: u64 = rest[..digits].parse().map_err(|_| E::OutOfRange)?;
    if year <= 9999 {
        return Err(E::InvalidFormat);
    }
    let cycles = (year - 2000) / 400;
    let shifted = format!("{}{}", year - cycles * 400, &rest[digits..]);
    let base = humantime::parse_rfc3339_weak(&shifted)?
        .duration_since(UNIX_EPOCH)
        .map_err(|_| E::OutOfRange)?;
    cycles
        .checked_mul(DAYS_PER_ERA * MS_PER_DAY)
        .and_then(|ms| ms.checked_add(u64::try_from(base.as_millis()).ok()?))
        .map(Timestamp)
        .ok_or(E::OutOfRange)
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
    /// RFC 3339 in UTC, to the millisecond when there are any. Years past 9999, which RFC 3339
    /// cannot write, take ISO 8601's expanded form (`+10000-01-01T00:00:00Z`); every
    /// timestamp prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month, day) = civil_from_days(self.0 / MS_PER_DAY);
        let in_day = self.0 % MS_PER_DAY;
        let (h, m, s, ms) = (
            in_day / 3_600_000,
            in_day / 60_000 % 60,
            in_day / 1000 % 60,
            in_day % 1000,
        );
        if year > 9999 {
            f.write_str("+")?;
        }
        write!(f, "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}")?;
        if ms != 0 {
            write!(f, ".{ms:03}")?;
        }
        f.write_str("Z")
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

    #[test]
    fn every_timestamp_prints_and_reads_back_even_past_year_9999() {
        // A beacon dated u64::MAX milliseconds used to panic the ingestor's error message.
        for ms in [
            0,
            1,
            951_782_400_000,     // 2000-02-29, a leap day
            4_107_542_400_000,   // 2100-03-01, after a skipped leap day
            253_402_300_799_999, // 9999-12-31T23:59:59.999Z
            253_402_300_800_000, // +10000-01-01T00:00:00Z
            u64::MAX / 2,
            u64::MAX,
        ] {
            let t = Timestamp::from_millis(ms);
            let text = t.to_string();
            assert_eq!(Timestamp::parse_rfc3339(&text).ok(), Some(t), "{text}");
            assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{text}\""));
        }
        assert_eq!(
            Timestamp::from_millis(253_402_300_800_000).to_string(),
            "+10000-01-01T00:00:00Z"
        );
        assert_eq!(
            Timestamp::from_millis(951_782_400_000).to_string(),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            Timestamp::from_millis(u64::MAX).to_string(),
            "+584556019-04-03T14:25:51.615Z"
        );
        assert!(Timestamp::parse_rfc3339("+584556019-04-03T14:25:51.616Z").is_err());
        assert!(Timestamp::parse_rfc3339("+99999999999999999999-01-01T00:00:00Z").is_err());
        assert!(Timestamp::parse_rfc3339("+1234-01-01T00:00:00Z").is_err());
        assert_eq!(
            Timestamp::from_secs(u64::MAX),
            Timestamp::from_millis(u64::MAX)
        );
        assert_eq!(
            Timestamp::EPOCH.plus(Duration::MAX),
            Timestamp::from_millis(u64::MAX)
        );
    }

    proptest::proptest! {
        #[test]
        fn display_matches_humantime_and_round_trips(ms in 0u64..253_402_300_800_000) {
            let t = Timestamp::from_millis(ms);
            let system = UNIX_EPOCH + Duration::from_millis(ms);
            let expected = if ms % 1000 == 0 {
                humantime::format_rfc3339_seconds(system).to_string()
            } else {
                humantime::format_rfc3339_millis(system).to_string()
            };
            proptest::prop_assert_eq!(t.to_string(), expected);
        }

        #[test]
        fn any_millisecond_round_trips(ms in proptest::num::u64::ANY) {
            let t = Timestamp::from_millis(ms);
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_string()).ok(), Some(t));
        }
    }
}
