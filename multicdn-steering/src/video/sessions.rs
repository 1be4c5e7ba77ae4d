//! What the content-steering handler remembers between requests, all of it bounded: each
//! session's throughput per pathway and the pathway it was last told to use (for the collapse
//! rule), each client address's token bucket (for per-client limits), and each cohort's count
//! of requests and reroutes in the current minute (the rule's guardrail).
//!
//! ## The collapse rule
//!
//! A session whose reported throughput on the pathway it was told to use first falls below
//! [`RerouteRule::collapse_ratio`] of the best it has reported on that pathway (a best of at
//! least [`RerouteRule::min_peak_bps`]) is offered the next pathway of its order first, for
//! [`RerouteRule::hold`]; the collapsed pathway goes second, so the player can come back to it.
//! The alternative must carry weight in the session's cohort (the plan's weights decide which
//! pathways a cohort may use at all) and must not be unavailable. New reroutes in a cohort are
//! capped at [`RerouteRule::max_share`] of its requests in a minute: when a whole CDN slows
//! down for everyone, moving the cohort is the engine's decision (RUM, hysteresis, movement
//! caps), not a per-session reflex.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use multicdn_core::{ProviderId, Timestamp};

use super::server::{Bucket, PathwayMeasurement, RateLimit};

/// The collapse rule's settings (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RerouteRule {
    /// A report below this fraction of the session's best on the same pathway is a collapse.
    pub collapse_ratio: f64,
    /// A best below this many bits per second is too little to judge a collapse by.
    pub min_peak_bps: u64,
    /// How long a rerouted session is offered the alternative first.
    pub hold: Duration,
    /// The most new reroutes in a cohort in a minute, as a share of its requests in a minute.
    pub max_share: f64,
}

impl Default for RerouteRule {
    fn default() -> RerouteRule {
        RerouteRule {
            collapse_ratio: 0.5,
            min_peak_bps: 1_000_000,
            hold: Duration::from_secs(300),
            max_share: 0.2,
        }
    }
}

impl RerouteRule {
    /// No rerouting: every session gets its plan order.
    pub fn off() -> RerouteRule {
        RerouteRule {
            max_share: 0.0,
            ..RerouteRule::default()
        }
    }
}

/// One session's memory.
#[derive(Debug, Default)]
struct Session {
    seen: Option<Timestamp>,
    /// The best throughput reported per pathway.
    peak: Vec<(String, u64)>,
    /// The pathway this session was last told to use first.
    head: Option<ProviderId>,
    /// A pathway it was moved off, until when.
    moved: Option<(ProviderId, Timestamp)>,
}

/// A cohort's counts in the current minute.
#[derive(Debug, Default, Clone, Copy)]
struct Minute {
    minute: u64,
    requests: u32,
    previous: u32,
    reroutes: u32,
}

/// Sessions, bounded: when full, those idle for longer than [`IDLE`] go; when none has, new
/// sessions are served by the plan alone (no memory, no rerouting) until room is made.
#[derive(Debug)]
pub(crate) struct Sessions {
    rule: RerouteRule,
    map: HashMap<String, Session>,
    cap: usize,
    cohorts: HashMap<String, Minute>,
}

/// A session not heard from for this long may be forgotten.
pub(crate) const IDLE: Duration = Duration::from_secs(900);

/// Most cohorts counted (plans have at most thousands).
const MAX_COHORTS: usize = 100_000;

impl Sessions {
    pub(crate) fn new(cap: usize, rule: RerouteRule) -> Sessions {
        Sessions {
            rule,
            map: HashMap::new(),
            cap,
            cohorts: HashMap::new(),
        }
    }

    /// Counts a request in `cohort`'s minute.
    fn count(&mut self, cohort: &str, now: Timestamp) -> &mut Minute {
        if !self.cohorts.contains_key(cohort) && self.cohorts.len() >= MAX_COHORTS {
            self.cohorts.clear();
        }
        let minute = now.as_millis() / 60_000;
        let m = self.cohorts.entry(cohort.to_owned()).or_default();
        if m.minute != minute {
            m.previous = if m.minute + 1 == minute {
                m.requests
            } else {
                0
            };
            m.minute = minute;
            m.requests = 0;
            m.reroutes = 0;
        }
        m.requests = m.requests.saturating_add(1);
        m
    }

    fn make_room(&mut self, now: Timestamp) {
        self.map
            .retain(|_, s| s.seen.is_some_and(|seen| now.since(seen) < IDLE));
    }

    /// Applies the collapse rule to `session`'s request: reads its reports, and returns
    /// `order` as it should be served (the collapsed pathway second while the session is
    /// rerouted). `weighted` says which pathways carry weight in the cohort.
    pub(crate) fn serve(
        &mut self,
        session: &str,
        cohort: &str,
        reports: &[PathwayMeasurement],
        mut order: Vec<ProviderId>,
        weighted: impl Fn(&ProviderId) -> bool,
        now: Timestamp,
    ) -> Vec<ProviderId> {
        let rule = self.rule;
        let allowed = {
            let m = self.count(cohort, now);
            let base = f64::from(m.requests.max(m.previous));
            f64::from(m.reroutes) + 1.0 <= (rule.max_share * base).max(1.0) && rule.max_share > 0.0
        };
        if !self.map.contains_key(session) && self.map.len() >= self.cap {
            self.make_room(now);
            if self.map.len() >= self.cap {
                return order;
            }
        }
        let s = self.map.entry(session.to_owned()).or_default();
        s.seen = Some(now);
        let mut collapsed = None;
        for m in reports {
            let known = s.peak.len();
            let peak = s.peak.iter_mut().find(|(p, _)| *p == m.pathway);
            let was = peak.as_ref().map_or(0, |(_, b)| *b);
            if was >= rule.min_peak_bps
                && (m.throughput_bps as f64) < rule.collapse_ratio * was as f64
                && s.head.as_ref().is_some_and(|h| h.as_str() == m.pathway)
            {
                collapsed = s.head.clone();
            }
            match peak {
                Some((_, b)) => *b = (*b).max(m.throughput_bps),
                None if known < super::server::MAX_REPORTED_PATHWAYS => {
                    s.peak.push((m.pathway.clone(), m.throughput_bps));
                }
                None => {}
            }
        }
        if let Some(off) = collapsed {
            let alternative = order.iter().any(|p| *p != off && weighted(p));
            if alternative && allowed && s.moved.as_ref().is_none_or(|(p, _)| *p != off) {
                s.moved = Some((off.clone(), now + rule.hold));
                // The peak on the collapsed pathway starts again: a later return is judged on
                // what it does then.
                s.peak.retain(|(p, _)| p != off.as_str());
                if let Some(m) = self.cohorts.get_mut(cohort) {
                    m.reroutes = m.reroutes.saturating_add(1);
                }
            }
        }
        let Some(s) = self.map.get_mut(session) else {
            return order;
        };
        if let Some((off, until)) = &s.moved {
            if now >= *until {
                s.moved = None;
            } else if let Some(pos) = order.iter().position(|p| p == off)
                && let Some(alt) = order.iter().position(|p| p != off && weighted(p))
            {
                let id = order.remove(pos);
                let at = if alt > pos { alt } else { alt + 1 };
                order.insert(at.min(order.len()), id);
            }
        }
        s.head = order.first().cloned();
        order
    }
}

/// Per-client token buckets, bounded: when full, buckets idle for a minute go; clients beyond
/// that share one overflow bucket 64 times the size, so a flood from many addresses cannot grow
/// the table or lock out clients already known.
#[derive(Debug)]
pub(crate) struct Clients {
    limit: RateLimit,
    map: HashMap<IpAddr, (Bucket, Timestamp)>,
    overflow: Bucket,
    cap: usize,
}

impl Clients {
    pub(crate) fn new(limit: RateLimit, cap: usize) -> Clients {
        Clients {
            limit,
            map: HashMap::new(),
            overflow: Bucket::new(RateLimit {
                per_second: limit.per_second * 64.0,
                burst: limit.burst.saturating_mul(64),
            }),
            cap,
        }
    }

    /// Takes a token for `client`, or says how long until one is available.
    pub(crate) fn take(&mut self, client: IpAddr, now: Timestamp) -> Result<(), Duration> {
        if !self.map.contains_key(&client) && self.map.len() >= self.cap {
            self.map
                .retain(|_, (_, seen)| now.since(*seen) < Duration::from_secs(60));
            if self.map.len() >= self.cap {
                return self.overflow.take(now);
            }
        }
        let (bucket, seen) = self
            .map
            .entry(client)
            .or_insert_with(|| (Bucket::new(self.limit), now));
        *seen = now;
        bucket.take(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn report(pathway: &str, bps: u64, at: u64) -> PathwayMeasurement {
        PathwayMeasurement {
            pathway: pathway.into(),
            throughput_bps: bps,
            network: None,
            at: Timestamp::from_secs(at),
        }
    }

    #[test]
    fn a_collapse_on_the_head_pathway_reroutes_for_the_hold_then_the_plan_returns() {
        let rule = RerouteRule::default();
        let mut s = Sessions::new(10, rule);
        let plan = || vec![p("a"), p("b")];
        let all = |_: &ProviderId| true;
        let t = Timestamp::from_secs;
        assert_eq!(s.serve("s1", "c", &[], plan(), all, t(0)), plan());
        assert_eq!(
            s.serve("s1", "c", &[report("a", 8_000_000, 10)], plan(), all, t(10)),
            plan()
        );
        // 3 Mbit/s after 8: below half, rerouted.
        let moved = s.serve("s1", "c", &[report("a", 3_000_000, 20)], plan(), all, t(20));
        assert_eq!(moved, vec![p("b"), p("a")]);
        // Still rerouted within the hold, whatever it reports on b.
        let held = s.serve(
            "s1",
            "c",
            &[report("b", 6_000_000, 200)],
            plan(),
            all,
            t(200),
        );
        assert_eq!(held, vec![p("b"), p("a")]);
        // After the hold, the plan's order again.
        assert_eq!(s.serve("s1", "c", &[], plan(), all, t(321)), plan());
    }

    #[test]
    fn no_reroute_to_a_pathway_without_weight_nor_beyond_the_cohort_cap() {
        let rule = RerouteRule::default();
        let mut s = Sessions::new(100, rule);
        let plan = || vec![p("a"), p("b")];
        let t = Timestamp::from_secs;
        let only_a = |q: &ProviderId| q.as_str() == "a";
        s.serve("x", "c", &[report("a", 8_000_000, 0)], plan(), only_a, t(0));
        let r = s.serve("x", "c", &[report("a", 1_000_000, 1)], plan(), only_a, t(1));
        assert_eq!(r, plan(), "b carries no weight in the cohort");

        // Ten sessions collapse in the same minute of a cohort with ten requests before them:
        // 20% of the minute's requests may be rerouted.
        let mut s = Sessions::new(100, rule);
        let all = |_: &ProviderId| true;
        for i in 0..10 {
            s.serve(
                &format!("s{i}"),
                "c",
                &[report("a", 8_000_000, 0)],
                plan(),
                all,
                t(0),
            );
        }
        let moved = (0..10)
            .filter(|i| {
                s.serve(
                    &format!("s{i}"),
                    "c",
                    &[report("a", 100_000, 1)],
                    plan(),
                    all,
                    t(1),
                )[0]
                .as_str()
                    == "b"
            })
            .count();
        assert_eq!(moved, 4, "20% of the minute's 20 requests");
    }

    #[test]
    fn the_tables_stay_bounded() {
        let rule = RerouteRule::default();
        let mut s = Sessions::new(100, rule);
        for i in 0..1_000 {
            s.serve(
                &format!("s{i}"),
                "c",
                &[],
                vec![p("a")],
                |_| true,
                Timestamp::from_secs(i),
            );
        }
        assert!(s.map.len() <= 100);
        let mut c = Clients::new(
            RateLimit {
                per_second: 1.0,
                burst: 2,
            },
            50,
        );
        let known = IpAddr::from([192, 0, 2, 1]);
        assert!(c.take(known, Timestamp::EPOCH).is_ok());
        assert!(c.take(known, Timestamp::EPOCH).is_ok());
        assert!(
            c.take(known, Timestamp::EPOCH).is_err(),
            "its own burst is spent"
        );
        let mut flood_ok = 0;
        for i in 0..10_000u32 {
            let ip = IpAddr::from(((i + 1) << 8).to_be_bytes());
            flood_ok += usize::from(c.take(ip, Timestamp::EPOCH).is_ok());
        }
        assert!(c.map.len() <= 50);
        // 49 new clients got buckets of their own, the other 9,951 shared the overflow's 128.
        assert_eq!(flood_ok, 49 + 128);
        // The known client still has its own bucket, refilled by its own rate.
        assert!(c.take(known, Timestamp::from_secs(1)).is_ok());
    }
}
