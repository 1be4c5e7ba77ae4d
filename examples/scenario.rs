//! The quickstart's scripted incident: the whole loop on one machine, on fast simulated time.
//!
//! Two emulated CDN edges and both vendors' purge APIs run on loopback ([`multicdn_test_support`]).
//! Five in-process probe runners check the edges through the real HTTP probe, quorum and
//! hysteresis; synthetic users on seven networks are steered by the in-memory steerer and send
//! RUM beacons; a [`Controller`] owns the loop: each tick it runs the monitor's round, folds
//! quorum verdicts and missed purges into its health ledger, decides the next plan from the
//! scoreboard, applies it on the steerer and journals why each change happened. Then the
//! script plays:
//!
//! | when | what |
//! |---|---|
//! | 00:20 | cloudflare degrades for AS1221 (Telstra, AU): that ASN moves to fastly in damped steps |
//! | 03:00 | fastly's edge starts serving an error page with a 200: quorum demotes it, in steps |
//! | 03:10 | fastly's edge is repaired: ten good rounds, then a slow return |
//! | 04:30 | a purge misses on cloudflare (its token was refused): cloudflare is demoted |
//! | 04:40 | the token is rotated and what it missed is purged again: cloudflare returns |
//! | 05:30 | cloudflare recovers for AS1221: it moves back only past the hysteresis gap |
//!
//! Time is a [`ManualClock`] advanced 30 s a tick, so eight hours take seconds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use multicdn::Controller;
use multicdn::cloudflare::CloudflarePurger;
use multicdn::fanout::{FanoutMember, PurgeFanout};
use multicdn::fastly::FastlyPurger;
use multicdn::memory::MemorySteerer;
use multicdn_core::policy::Policy;
use multicdn_core::{
    ApplyOptions, Clock, Country, Event, ManualClock, ProviderId, PurgeRequest, Secret, Steerer,
    Timestamp,
};
use multicdn_health::{HealthConfig, HttpProbe, Monitor, targets_from_policy};
use multicdn_providers::http::HttpSettings;
use multicdn_steering::beacon::{Beacon, ClientNetwork, NavigationBeacon, Received};
use multicdn_steering::journal::{Journal, JournalEntry, Rule};
use multicdn_steering::scoreboard::Metric;

use multicdn_test_support::{EdgeMode, EdgeServer, PurgeApi};

/// The policy the quickstart embeds: the same file `policy check` validates.
pub const EMBEDDED_POLICY: &str = include_str!("policy.yaml");

/// How long one tick of simulated time is (the health interval).
pub const TICK: Duration = Duration::from_secs(30);

/// Options for a run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Simulated hours to play.
    pub hours: u32,
    /// Synthetic users per network per tick.
    pub users_per_tick: u32,
    /// Seed for the synthetic users.
    pub seed: u64,
    /// Print every journal entry, remeasurements included.
    pub verbose: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            hours: 8,
            users_per_tick: 40,
            seed: 7,
            verbose: false,
        }
    }
}

/// A synthetic network: where its users are and how fast each CDN is for them.
#[derive(Debug, Clone)]
struct SyntheticNetwork {
    asn: u32,
    country: &'static str,
    name: &'static str,
    /// Typical TTFB in ms for fastly, cloudflare.
    fastly_ms: f64,
    cloudflare_ms: f64,
}

const NETWORKS: &[SyntheticNetwork] = &[
    SyntheticNetwork {
        asn: 7922,
        country: "US",
        name: "Comcast",
        fastly_ms: 45.0,
        cloudflare_ms: 50.0,
    },
    SyntheticNetwork {
        asn: 701,
        country: "US",
        name: "Verizon",
        fastly_ms: 48.0,
        cloudflare_ms: 47.0,
    },
    SyntheticNetwork {
        asn: 3320,
        country: "DE",
        name: "Deutsche Telekom",
        fastly_ms: 40.0,
        cloudflare_ms: 42.0,
    },
    SyntheticNetwork {
        asn: 2856,
        country: "GB",
        name: "BT",
        fastly_ms: 35.0,
        cloudflare_ms: 39.0,
    },
    SyntheticNetwork {
        asn: 1221,
        country: "AU",
        name: "Telstra",
        fastly_ms: 105.0,
        cloudflare_ms: 70.0,
    },
    SyntheticNetwork {
        asn: 2516,
        country: "JP",
        name: "KDDI",
        fastly_ms: 70.0,
        cloudflare_ms: 66.0,
    },
    SyntheticNetwork {
        asn: 28573,
        country: "BR",
        name: "Claro",
        fastly_ms: 90.0,
        cloudflare_ms: 86.0,
    },
];

/// The degraded TTFB of cloudflare for AS1221 during the regional incident.
const DEGRADED_MS: f64 = 240.0;

/// A small deterministic generator (splitmix64) for the synthetic users.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A TTFB around `typical`: mostly within ±30%, with a tail of slow requests.
    fn ttfb(&mut self, typical: f64) -> f64 {
        let spread = 0.7 + 0.6 * self.unit();
        let tail = if self.unit() < 0.05 {
            1.5 + 2.0 * self.unit()
        } else {
            1.0
        };
        typical * spread * tail
    }
}

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineLine {
    /// When.
    pub at: Timestamp,
    /// What, for people.
    pub text: String,
}

/// What a run did: the timeline, the journal, the dashboard and the checks.
#[derive(Debug)]
pub struct Report {
    /// The timeline, in order.
    pub timeline: Vec<TimelineLine>,
    /// Every journal entry.
    pub journal: Journal,
    /// The dashboard, rendered.
    pub dashboard: String,
    /// The checks: a description and whether it held.
    pub checks: Vec<(String, bool)>,
    /// When the run started (simulated).
    pub start: Timestamp,
}

impl Report {
    /// True when every check held.
    pub fn all_held(&self) -> bool {
        self.checks.iter().all(|(_, ok)| *ok)
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The embedded policy is invalid (a bug in this program).
    #[error("embedded policy: {0}")]
    Policy(#[from] multicdn_core::PolicyError),
    /// A loopback server could not start.
    #[error("starting a loopback server: {0}")]
    Io(#[from] std::io::Error),
    /// Building a component failed.
    #[error("{0}")]
    Setup(String),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> ScenarioError + '_ {
    move |e| ScenarioError::Setup(format!("{what}: {e}"))
}

/// Formats `t` as an offset from `start`: `03:00:30`.
pub fn offset(start: Timestamp, t: Timestamp) -> String {
    let s = t.since(start).as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Plays the scripted incident and returns what happened.
pub async fn run(options: &Options) -> Result<Report, ScenarioError> {
    let policy = Policy::from_yaml(EMBEDDED_POLICY, "examples/policy.yaml (embedded)")?;
    let fastly = ProviderId::new("fastly").map_err(setup("provider id"))?;
    let cloudflare = ProviderId::new("cloudflare").map_err(setup("provider id"))?;
    let start = Timestamp::parse_rfc3339("2026-12-01T09:00:00Z").map_err(setup("start time"))?;
    let clock = ManualClock::new(start);

    // The edges and the purge APIs, on loopback.
    let fastly_edge = EdgeServer::start("fastly", "LHR", &policy.health.expect).await?;
    let cloudflare_edge = EdgeServer::start("cloudflare", "SYD", &policy.health.expect).await?;
    let purge_api = PurgeApi::start().await?;

    // Health: one in-process runner per region of the policy, probing both edges for real.
    let overrides = BTreeMap::from([
        (fastly.clone(), fastly_edge.base_url()),
        (cloudflare.clone(), cloudflare_edge.base_url()),
    ]);
    let targets = targets_from_policy(&policy, &overrides).map_err(setup("probe targets"))?;
    let mut builder = Monitor::builder(HealthConfig::from_policy(&policy.health))
        .clock(clock.clone())
        .concurrency(16)
        .targets(targets);
    for region in &policy.health.regions {
        let probe = HttpProbe::builder(region.clone())
            .clock(clock.clone())
            .build()
            .map_err(setup("probe"))?;
        builder = builder.runner(probe);
    }
    let monitor = builder.build().map_err(setup("monitor"))?;

    // Purge: both vendors' adapters against the emulated APIs, fanned out as one.
    let quick = HttpSettings::default()
        .with_request_timeout(Duration::from_secs(2))
        .with_backoff(Duration::from_millis(5), Duration::from_millis(50));
    let spec = |p: &ProviderId| {
        policy
            .providers
            .get(p)
            .cloned()
            .ok_or_else(|| ScenarioError::Setup(format!("policy lacks provider {p}")))
    };
    let fastly_purger = FastlyPurger::from_spec(
        fastly.clone(),
        &spec(&fastly)?,
        Secret::new("quickstart-fastly-token"),
        Some(&purge_api.fastly_base()),
        quick.clone(),
    )
    .map_err(setup("fastly purger"))?;
    let cloudflare_purger = CloudflarePurger::from_spec(
        cloudflare.clone(),
        &spec(&cloudflare)?,
        Secret::new("quickstart-cloudflare-token"),
        Some(&purge_api.cloudflare_base()),
        quick,
    )
    .map_err(setup("cloudflare purger"))?;
    let fanout = PurgeFanout::new(vec![
        FanoutMember::new(Arc::new(fastly_purger)),
        FanoutMember::new(Arc::new(cloudflare_purger)),
    ])
    .with_clock(Arc::new(clock.clone()));

    // Steering: the in-memory steerer starts on the policy's static weights, and from then on
    // takes every plan from the controller, which owns the rounds: the monitor's verdicts and
    // the fan-out's missed purges reach its health ledger, beacons its scoreboard.
    let steerer = MemorySteerer::with_seed(options.seed);
    steerer
        .apply(&policy.static_plan(), &ApplyOptions::default().force(true))
        .await
        .map_err(setup("applying the static plan"))?;
    let controller = Controller::builder(policy.clone())
        .actuator("memory", steerer.clone())
        .monitor(monitor)
        .purge_fanout(fanout)
        .clock(clock.clone())
        .build()
        .map_err(setup("controller"))?;
    let providers = policy.provider_ids();
    let mut timeline: Vec<TimelineLine> = Vec::new();
    let mut rng = Rng(options.seed);
    let mut unhappy_logged = 0usize;
    let mut unhappy_total = 0usize;

    let ticks = options.hours * 3600 / TICK.as_secs() as u32;
    let at = |h: u64, m: u64| start + Duration::from_secs(h * 3600 + m * 60);
    let degrade_at = at(0, 20);
    let error_page_at = at(3, 0);
    let repaired_at = at(3, 10);
    let purge_at = at(4, 30);
    let rotate_at = at(4, 40);
    let improve_at = at(5, 30);
    let tags = vec!["product-123".to_owned(), "price-list".to_owned()];

    for _ in 0..ticks {
        let now = clock.now();
        let mut say = |text: String| timeline.push(TimelineLine { at: now, text });

        // The script.
        if now == degrade_at {
            say(format!(
                "SCRIPT  cloudflare degrades for AS1221 ({}, AU): TTFB {:.0} ms -> {DEGRADED_MS:.0} ms",
                NETWORKS[4].name, NETWORKS[4].cloudflare_ms
            ));
        }
        if now == error_page_at {
            fastly_edge.set_mode(EdgeMode::ErrorPage);
            say("SCRIPT  fastly's edge starts answering 200 with an error page".into());
        }
        if now == repaired_at {
            fastly_edge.set_mode(EdgeMode::Healthy);
            say("SCRIPT  fastly's edge is repaired".into());
        }
        if now == purge_at {
            purge_api.refuse_tokens("cloudflare", true);
            say(format!(
                "SCRIPT  purge tags [{}] on every CDN; cloudflare's token has expired",
                tags.join(", ")
            ));
        }
        if now == rotate_at {
            purge_api.refuse_tokens("cloudflare", false);
            say("SCRIPT  cloudflare's token is rotated; what it missed is purged again".into());
        }
        if now == improve_at {
            say("SCRIPT  cloudflare recovers for AS1221".into());
        }

        // Purges: the import's purge, then, once the token is rotated, exactly what was missed.
        if now == purge_at || now == rotate_at {
            let sent = if now == purge_at {
                controller.purge(&PurgeRequest::tags(tags.clone())).await
            } else {
                controller.retry_missed().await
            };
            match sent {
                Some(Ok(report)) => say(format!(
                    "PURGE   acknowledged by {}; slowest acknowledgement {:?}",
                    report
                        .receipts
                        .iter()
                        .map(|r| r.provider.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    report.worst_acknowledged_in
                )),
                Some(Err(e)) => say(format!("PURGE   ERROR {e}")),
                None => {}
            }
        }

        // Real users: each asks the steerer, fetches from the answer, and sends a beacon.
        let mut beacons = Vec::new();
        for net in NETWORKS {
            let country = Country::new(net.country).map_err(setup("country"))?;
            let client = ClientNetwork::new(Some(net.asn), Some(country));
            let cuts = client.cuts();
            for _ in 0..options.users_per_tick {
                let Ok(provider) = steerer.resolve(&cuts) else {
                    continue;
                };
                let degraded = net.asn == 1221 && now >= degrade_at && now < improve_at;
                let typical = if provider == fastly {
                    net.fastly_ms
                } else if degraded {
                    DEGRADED_MS
                } else {
                    net.cloudflare_ms
                };
                let ttfb = rng.ttfb(typical);
                let beacon = NavigationBeacon::new(
                    "/products/oak-dining-table",
                    ttfb,
                    provider.as_str(),
                    "",
                    "HIT",
                );
                let offset_ms = (rng.unit() * TICK.as_millis() as f64) as u64;
                beacons.push(Received {
                    at: now.minus(Duration::from_millis(offset_ms)),
                    network: client,
                    beacon: Beacon::Navigation(beacon),
                });
            }
        }

        controller.record_all(&beacons);

        // One round: the monitor's probes (real HTTP from five runners), the events since the
        // last round into the ledger, decide, apply, journal.
        let round = controller.round(now).await;
        for event in &round.events {
            match event {
                Event::ProbeUnhappy {
                    provider,
                    runner,
                    reason,
                    ..
                } => {
                    unhappy_total += 1;
                    if unhappy_logged < 2 {
                        unhappy_logged += 1;
                        say(format!(
                            "LOG     probe unhappy: {provider} from {runner}: {reason} (logged, not paged)"
                        ));
                    }
                }
                Event::QuorumDown {
                    provider,
                    failing,
                    voting,
                    ..
                } => say(format!(
                    "EVENT   {provider}: quorum says down ({} of {voting} runners) [page]",
                    failing.len()
                )),
                Event::Recovered { provider, .. } => {
                    say(format!(
                        "EVENT   {provider}: recovered after {} good rounds",
                        policy.health.up_after
                    ));
                    unhappy_logged = 0;
                }
                Event::PurgeMissed {
                    provider, items, ..
                } => say(format!(
                    "EVENT   {provider}: purge missed ({} items): demoted until purged [page]",
                    items.len()
                )),
                Event::PurgeRecovered { provider, .. } => say(format!(
                    "EVENT   {provider}: purged of everything it missed; demotion lifted"
                )),
                _ => {}
            }
        }
        for failed in round.record.failed() {
            say(format!(
                "APPLY   {} did not take the plan: {:?}",
                failed.actuator, failed.outcome
            ));
        }
        for entry in &round.record.decided {
            if entry.is_move() || options.verbose {
                say(describe(entry));
            }
        }
        clock.advance(TICK);
    }

    if unhappy_total > unhappy_logged {
        timeline.push(TimelineLine {
            at: clock.now(),
            text: format!(
                "LOG     {unhappy_total} unhappy probes in all; only quorum verdicts paged"
            ),
        });
    }
    let now = clock.now();
    let snapshot = controller.snapshot(now);
    let journal = controller.journal().await;
    let dashboard = crate::summary::dashboard(&snapshot, Metric::Ttfb, &providers);
    let checks = checks(&journal, &timeline, &fastly, &cloudflare, &policy, start);
    Ok(Report {
        timeline,
        journal,
        dashboard,
        checks,
        start,
    })
}

/// One journal entry as a timeline line.
pub fn describe(e: &JournalEntry) -> String {
    let rule = format!("{:?}", e.rule).to_lowercase();
    let mut line = format!(
        "STEER   {:<14} {:<10} {}  ->  {}",
        e.cohort.as_str(),
        rule,
        e.before,
        e.after
    );
    let ev = &e.evidence;
    if ev.has_scores() {
        let scores: Vec<String> = ev
            .scores()
            .map(|(p, s)| format!("{p} p75 {s:.0} ms ({} samples)", ev.samples(p)))
            .collect();
        let _ = write!(line, "  [{}", scores.join(", "));
        if let Some(gap) = ev.gap_ms {
            let _ = write!(line, "; gap {gap:.0} ms");
        }
        if ev.switching_back {
            let _ = write!(line, "; switching back");
        }
        line.push(']');
    }
    if let Some(g) = ev.capped_by {
        let _ = write!(line, " (capped by {g:?})");
    }
    if !ev.note.is_empty() {
        let _ = write!(line, " - {}", ev.note);
    }
    line
}

fn checks(
    journal: &Journal,
    timeline: &[TimelineLine],
    fastly: &ProviderId,
    cloudflare: &ProviderId,
    policy: &Policy,
    start: Timestamp,
) -> Vec<(String, bool)> {
    let entries = journal.entries();
    let step = policy.steering.rum.step.bp();
    let as1221: Vec<&JournalEntry> = entries
        .iter()
        .filter(|e| e.cohort.as_str() == "as1221" && e.rule == Rule::Rum && e.is_move())
        .collect();
    // Before the first edge incident (03:00), the only thing moving AS1221 is its RUM gap.
    let first_incident = start + Duration::from_secs(3 * 3600);
    let towards_fastly = as1221
        .iter()
        .filter(|e| e.at < first_incident && e.after.get(fastly) > e.before.get(fastly))
        .count();
    let damped = towards_fastly >= 2
        && as1221.iter().all(|e| e.moved_bp() <= step)
        && as1221
            .first()
            .is_some_and(|e| e.after.get(fastly) > e.before.get(fastly));
    let others_still = entries
        .iter()
        .filter(|e| e.rule == Rule::Rum && e.is_move())
        .all(|e| e.cohort.as_str() == "as1221");
    let fastly_failover: Vec<&JournalEntry> = entries
        .iter()
        .filter(|e| e.rule == Rule::Failover && e.before.get(fastly) > e.after.get(fastly))
        .collect();
    let first = fastly_failover.first().map(|e| e.at);
    let stepped = match first {
        Some(t0) => {
            let at_first_partial = fastly_failover
                .iter()
                .filter(|e| e.at == t0)
                .all(|e| e.after.get(fastly) > 0);
            let later = fastly_failover.iter().any(|e| {
                e.at.since(t0) >= policy.steering.failover.interval.get()
                    && e.after.get(fastly) == 0
            });
            at_first_partial && later
        }
        None => false,
    };
    let recovered = timeline
        .iter()
        .any(|l| l.text.contains("fastly: recovered"))
        && entries
            .iter()
            .any(|e| e.rule == Rule::Recovery && e.after.get(fastly) > e.before.get(fastly));
    let purge_demoted = timeline
        .iter()
        .any(|l| l.text.contains("cloudflare: purge missed"))
        && entries.iter().any(|e| {
            e.rule == Rule::Failover && e.before.get(cloudflare) > e.after.get(cloudflare)
        });
    let returned = timeline.iter().any(|l| {
        l.text
            .contains("cloudflare: purged of everything it missed")
    }) && entries
        .iter()
        .any(|e| e.rule == Rule::Recovery && e.after.get(cloudflare) > e.before.get(cloudflare));
    let back = entries.iter().any(|e| {
        e.cohort.as_str() == "as1221"
            && e.rule == Rule::Rum
            && e.evidence.switching_back
            && e.after.get(cloudflare) > e.before.get(cloudflare)
    });
    let explained = entries
        .iter()
        .filter(|e| e.is_move())
        .all(|e| e.rule != Rule::Rum || (e.evidence.gap_ms.is_some() && e.evidence.has_scores()));
    vec![
        (
            format!(
                "AS1221 moved to fastly in damped steps ({towards_fastly} moves, each at most {})",
                multicdn_core::policy::Share(step)
            ),
            damped,
        ),
        (
            "no other network moved on RUM (equal providers within noise stay put)".into(),
            others_still,
        ),
        (
            format!(
                "fastly was demoted in steps ({} failover entries), never all at once",
                fastly_failover.len()
            ),
            stepped,
        ),
        (
            "fastly recovered after the hysteresis rounds and returned slowly".into(),
            recovered,
        ),
        ("the missed purge demoted cloudflare".into(), purge_demoted),
        ("cloudflare returned once purged".into(), returned),
        (
            "AS1221 moved back to cloudflare only past the hysteresis gap".into(),
            back,
        ),
        (
            "every RUM move carries its evidence (scores, samples, gap)".into(),
            explained,
        ),
    ]
}
