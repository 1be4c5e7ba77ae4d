//! A pure, time-stepped simulator of node failure, failover, load shedding and drain.
//!
//! Each step (default 10 s) does, in order:
//! 1. scheduled events: a node goes down or comes back up (a recovered node starts a
//!    [`Drain`] for every population it is now the nearest live node of);
//! 2. failover: sessions on dead nodes, and sessions nobody served, [`spread`](Topology::spread)
//!    over live nodes;
//! 3. drains move sessions back, linearly and within their rate bound (the share moved counts
//!    both sessions that restart, which go to the recovered node at once, and sessions that
//!    switch; together they never exceed the bound);
//! 4. each node's demand (what its players would pull uncapped) and load (under its quality cap);
//! 5. a node whose load has exceeded its capacity for `overload_tolerance` (default 30 s) dies,
//!    and stays down: its sessions fail over on the next step, which is how a cascade spreads;
//! 6. with shedding on, each live node's [`QualityGovernor`] sees the step's load and sets the
//!    cap players honour from the next step (a player applies a cap on its next chunk).
//!
//! Nothing reads a clock: the timeline is a function of the [`Scenario`].

use std::fmt;
use std::time::Duration;

use multicdn_core::Timestamp;

use super::drain::{Drain, DrainConfig};
use super::shedding::{BitrateLadder, CapChange, QualityGovernor, SheddingConfig};
use super::topology::{NodeHealth, Topology};

/// Up or down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The node stops serving.
    NodeDown,
    /// The node serves again.
    NodeUp,
}

/// A scheduled event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimEvent {
    /// Time since the start.
    pub at: Duration,
    /// The node.
    pub node: String,
    /// What happens.
    pub kind: EventKind,
}

impl SimEvent {
    /// `node` goes down at `at`.
    pub fn down(at: Duration, node: impl Into<String>) -> SimEvent {
        SimEvent {
            at,
            node: node.into(),
            kind: EventKind::NodeDown,
        }
    }

    /// `node` comes back at `at`.
    pub fn up(at: Duration, node: impl Into<String>) -> SimEvent {
        SimEvent {
            at,
            node: node.into(),
            kind: EventKind::NodeUp,
        }
    }
}

/// Everything a run depends on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Scenario {
    /// Nodes and populations (with their initial health).
    pub topology: Topology,
    /// Scheduled events.
    pub events: Vec<SimEvent>,
    /// How long to simulate.
    pub duration: Duration,
    /// The step.
    pub step: Duration,
    /// Quality caps as load shedding, or `None` for none.
    pub shedding: Option<SheddingConfig>,
    /// The bitrate ladder caps are chosen from.
    pub ladder: BitrateLadder,
    /// How sessions move back to a recovered node.
    pub drain: DrainConfig,
    /// How long a node survives load above its capacity.
    pub overload_tolerance: Duration,
}

impl Scenario {
    /// A scenario over `topology` with the defaults: 20 minutes in 10 s steps, shedding with
    /// the default thresholds on the seed ladder, the default drain, 30 s overload tolerance.
    pub fn new(topology: Topology) -> Scenario {
        Scenario {
            topology,
            events: Vec::new(),
            duration: Duration::from_secs(1200),
            step: Duration::from_secs(10),
            shedding: Some(SheddingConfig::default()),
            ladder: BitrateLadder::seed(),
            drain: DrainConfig::default(),
            overload_tolerance: Duration::from_secs(30),
        }
    }

    /// The seed: [`Topology::seed`], Mumbai dies at 1:00 and comes back at 10:00; 20 minutes.
    pub fn seed(shedding: bool) -> Scenario {
        let mut s = Scenario::new(Topology::seed())
            .event(SimEvent::down(Duration::from_secs(60), "mumbai"))
            .event(SimEvent::up(Duration::from_secs(600), "mumbai"));
        if !shedding {
            s.shedding = None;
        }
        s
    }

    /// Adds an event.
    pub fn event(mut self, e: SimEvent) -> Scenario {
        self.events.push(e);
        self
    }

    /// Turns shedding on (with `config`) or off.
    pub fn shedding(mut self, config: Option<SheddingConfig>) -> Scenario {
        self.shedding = config;
        self
    }

    /// Sets the step.
    pub fn step(mut self, step: Duration) -> Scenario {
        self.step = step;
        self
    }

    /// Sets the duration.
    pub fn duration(mut self, d: Duration) -> Scenario {
        self.duration = d;
        self
    }

    /// Sets the drain.
    pub fn drain(mut self, d: DrainConfig) -> Scenario {
        self.drain = d;
        self
    }

    /// Sets the overload tolerance.
    pub fn overload_tolerance(mut self, d: Duration) -> Scenario {
        self.overload_tolerance = d;
        self
    }
}

/// Why a scenario cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The step is zero.
    #[error("the step must be longer than zero")]
    ZeroStep,
    /// More than a million steps.
    #[error("{0} steps is too many; use a longer step or a shorter duration (at most 1,000,000)")]
    TooManySteps(u128),
    /// An event names a node the topology lacks.
    #[error("event at {at:?} names unknown node {node:?}")]
    UnknownNode {
        /// When.
        at: Duration,
        /// The node named.
        node: String,
    },
}

/// One node during one step.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSample {
    /// Whether it served during the step.
    pub alive: bool,
    /// What its players would pull uncapped, Gbps.
    pub demand_gbps: f64,
    /// What they pulled under the cap, Gbps.
    pub load_gbps: f64,
    /// Load over capacity.
    pub utilisation: f64,
    /// The quality cap in force (`480p`), if any.
    pub cap: Option<String>,
}

/// One step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Time since the start.
    pub at: Duration,
    /// One sample per node, in topology order.
    pub nodes: Vec<NodeSample>,
    /// Demand nobody served, Gbps.
    pub unserved_gbps: f64,
    /// The largest share of any drain's sessions moved during this step.
    pub drained_share: f64,
    /// Demand moved by drains during this step, Gbps.
    pub drained_gbps: f64,
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Happening {
    /// A scheduled failure.
    NodeDown {
        /// The node.
        node: String,
    },
    /// A scheduled recovery.
    NodeUp {
        /// The node.
        node: String,
    },
    /// A node died of overload.
    Collapsed {
        /// The node.
        node: String,
        /// Its utilisation when it died.
        utilisation: f64,
    },
    /// A node changed its quality cap.
    Cap {
        /// The node.
        node: String,
        /// The change.
        change: CapChange,
    },
    /// Sessions started moving back.
    DrainStarted {
        /// The population.
        population: String,
        /// The recovered node.
        node: String,
    },
    /// Every session is back.
    DrainFinished {
        /// The population.
        population: String,
        /// The node.
        node: String,
    },
}

impl fmt::Display for Happening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Happening::NodeDown { node } => write!(f, "{node} goes down"),
            Happening::NodeUp { node } => write!(f, "{node} is back up"),
            Happening::Collapsed { node, utilisation } => write!(
                f,
                "{node} collapses under {:.0}% of its capacity",
                utilisation * 100.0
            ),
            Happening::Cap { node, change } => write!(f, "{node} quality cap {change}"),
            Happening::DrainStarted { population, node } => {
                write!(f, "{population} starts draining back to {node}")
            }
            Happening::DrainFinished { population, node } => {
                write!(f, "{population} is back on {node}")
            }
        }
    }
}

/// A happening and when.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEvent {
    /// Time since the start.
    pub at: Duration,
    /// What.
    pub what: Happening,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// Node ids, in topology order (the order of [`Step::nodes`]).
    pub node_ids: Vec<String>,
    /// Their capacities, Gbps.
    pub capacities: Vec<f64>,
    /// One record per step.
    pub steps: Vec<Step>,
    /// What happened, in order.
    pub events: Vec<TimelineEvent>,
    /// The step.
    pub step: Duration,
    /// The most of a drain's sessions allowed to move in one step.
    pub drain_bound_per_step: f64,
}

impl Timeline {
    /// The node's index.
    pub fn node(&self, id: &str) -> Option<usize> {
        self.node_ids.iter().position(|n| n == id)
    }

    /// Nodes that collapsed under load, in order.
    pub fn collapses(&self) -> Vec<(Duration, String)> {
        self.events
            .iter()
            .filter_map(|e| match &e.what {
                Happening::Collapsed { node, .. } => Some((e.at, node.clone())),
                _ => None,
            })
            .collect()
    }

    /// The last step.
    pub fn last(&self) -> Option<&Step> {
        self.steps.last()
    }

    /// The highest load a node carried, Gbps.
    pub fn peak_load(&self, node: usize) -> f64 {
        self.steps
            .iter()
            .filter_map(|s| s.nodes.get(node))
            .map(|n| n.load_gbps)
            .fold(0.0, f64::max)
    }
}

fn fmt_time(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:>2}:{:02}", s / 60, s % 60)
}

impl fmt::Display for Timeline {
    /// Events, then a table sampled every minute: each node's load, utilisation and cap.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events {
            writeln!(f, "  {}  {}", fmt_time(e.at), e.what)?;
        }
        writeln!(f)?;
        write!(f, "  {:>5}", "t")?;
        for id in &self.node_ids {
            write!(f, " | {id:>22}")?;
        }
        writeln!(f)?;
        let every = (60 / self.step.as_secs().max(1)).max(1) as usize;
        for s in self.steps.iter().step_by(every) {
            write!(f, "  {}", fmt_time(s.at))?;
            for n in &s.nodes {
                let cell = if n.alive {
                    format!(
                        "{:>5.0} Gbps {:>4.0}% {:>5}",
                        n.load_gbps,
                        n.utilisation * 100.0,
                        n.cap.as_deref().unwrap_or("")
                    )
                } else {
                    "down".to_owned()
                };
                write!(f, " | {cell:>22}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct ActiveDrain {
    population: usize,
    node: usize,
    drain: Drain,
    start_on: f64,
    elsewhere: f64,
}

fn at(d: Duration) -> Timestamp {
    Timestamp::EPOCH + d
}

/// Runs a scenario.
pub fn simulate(scenario: &Scenario) -> Result<Timeline, SimError> {
    if scenario.step.is_zero() {
        return Err(SimError::ZeroStep);
    }
    let steps = scenario.duration.as_nanos() / scenario.step.as_nanos();
    if steps > 1_000_000 {
        return Err(SimError::TooManySteps(steps));
    }
    let topo = &scenario.topology;
    let mut events = Vec::with_capacity(scenario.events.len());
    for e in &scenario.events {
        let n = topo
            .node_index(&e.node)
            .ok_or_else(|| SimError::UnknownNode {
                at: e.at,
                node: e.node.clone(),
            })?;
        events.push((e.at, n, e.kind));
    }
    events.sort_by_key(|e| e.0);
    let node_count = topo.nodes().len();
    let pops = topo.populations();
    let capacity: Vec<f64> = topo.nodes().iter().map(|n| n.capacity_gbps).collect();
    let mut alive: Vec<bool> = topo
        .nodes()
        .iter()
        .map(|n| n.health == NodeHealth::Up)
        .collect();
    let initial = topo.assign();
    let mut shares = initial.shares;
    let mut unserved = initial.unserved;
    let new_governor = |n: usize| {
        scenario.shedding.clone().map(|c| {
            QualityGovernor::new(
                format!("edge-{}", topo.nodes()[n].id),
                scenario.ladder.clone(),
                c,
            )
        })
    };
    let mut governors: Vec<Option<QualityGovernor>> = (0..node_count).map(new_governor).collect();
    let mut over_for = vec![Duration::ZERO; node_count];
    let mut drains: Vec<ActiveDrain> = Vec::new();
    let mut log: Vec<TimelineEvent> = Vec::new();
    let mut records = Vec::with_capacity(steps as usize + 1);
    let mut next_event = 0;
    let node_demand = |shares: &[Vec<f64>], alive: &[bool]| {
        let mut d = vec![0.0; node_count];
        for (p, row) in shares.iter().enumerate() {
            for (n, s) in row.iter().enumerate() {
                if alive[n] {
                    d[n] += s * pops[p].demand_gbps;
                }
            }
        }
        d
    };

    for k in 0..=steps {
        let t = scenario.step * k as u32;
        let now = at(t);
        // 1. Scheduled events.
        while next_event < events.len() && events[next_event].0 <= t {
            let (when, n, kind) = events[next_event];
            next_event += 1;
            let node = topo.nodes()[n].id.clone();
            match kind {
                EventKind::NodeDown => {
                    alive[n] = false;
                    drains.retain(|d| d.node != n);
                    log.push(TimelineEvent {
                        at: when,
                        what: Happening::NodeDown { node },
                    });
                }
                EventKind::NodeUp => {
                    alive[n] = true;
                    over_for[n] = Duration::ZERO;
                    governors[n] = new_governor(n);
                    log.push(TimelineEvent {
                        at: when,
                        what: Happening::NodeUp { node: node.clone() },
                    });
                    for (p, pop) in pops.iter().enumerate() {
                        let nearest = topo.nearness(p).iter().copied().find(|&m| alive[m]);
                        let elsewhere: f64 = shares[p]
                            .iter()
                            .enumerate()
                            .filter(|(m, _)| *m != n && alive[*m])
                            .map(|(_, s)| s)
                            .sum();
                        if nearest == Some(n) && elsewhere > 0.0 {
                            drains.retain(|d| d.population != p);
                            drains.push(ActiveDrain {
                                population: p,
                                node: n,
                                drain: Drain::new(now, scenario.drain),
                                start_on: shares[p][n],
                                elsewhere,
                            });
                            log.push(TimelineEvent {
                                at: when,
                                what: Happening::DrainStarted {
                                    population: pop.id.clone(),
                                    node: node.clone(),
                                },
                            });
                        }
                    }
                }
            }
        }
        // 2. Failover of sessions on dead nodes and of sessions nobody served.
        let mut demand = node_demand(&shares, &alive);
        for p in 0..pops.len() {
            let mut orphan = unserved[p];
            for n in 0..node_count {
                if !alive[n] && shares[p][n] > 0.0 {
                    orphan += shares[p][n];
                    shares[p][n] = 0.0;
                }
            }
            if orphan > 0.0 {
                let (placed, lost) = topo.spread(p, orphan, &alive, &mut demand);
                for (n, s) in placed {
                    shares[p][n] += s;
                }
                unserved[p] = lost;
            }
        }
        // 3. Drains.
        let mut drained_share = 0.0f64;
        let mut drained_gbps = 0.0;
        let mut finished = Vec::new();
        for (i, d) in drains.iter().enumerate() {
            let p = d.population;
            let target = d.start_on + d.elsewhere * d.drain.progress(now);
            let others: f64 = (0..node_count)
                .filter(|&m| m != d.node)
                .map(|m| shares[p][m])
                .sum();
            let delta = (target - shares[p][d.node]).min(others).max(0.0);
            if delta > 0.0 && others > 0.0 {
                for (m, share) in shares[p].iter_mut().enumerate() {
                    if m != d.node {
                        *share -= delta * *share / others;
                    }
                }
                shares[p][d.node] += delta;
                drained_share = drained_share.max(delta / d.elsewhere);
                drained_gbps += delta * pops[p].demand_gbps;
            }
            if d.drain.is_done(now) {
                finished.push(i);
            }
        }
        for i in finished.into_iter().rev() {
            let d = drains.remove(i);
            log.push(TimelineEvent {
                at: t,
                what: Happening::DrainFinished {
                    population: pops[d.population].id.clone(),
                    node: topo.nodes()[d.node].id.clone(),
                },
            });
        }
        // 4. Demand and load.
        let demand = node_demand(&shares, &alive);
        let mut samples = Vec::with_capacity(node_count);
        for n in 0..node_count {
            let factor = governors[n].as_ref().map_or(1.0, QualityGovernor::factor);
            let load = if alive[n] { demand[n] * factor } else { 0.0 };
            samples.push(NodeSample {
                alive: alive[n],
                demand_gbps: demand[n],
                load_gbps: load,
                utilisation: load / capacity[n],
                cap: governors[n]
                    .as_ref()
                    .and_then(|g| g.cap())
                    .filter(|_| alive[n])
                    .map(|r| r.name.clone()),
            });
        }
        // 5. Overload kills; 6. governors set the next step's cap.
        for n in 0..node_count {
            if !alive[n] {
                continue;
            }
            let s = &samples[n];
            if s.load_gbps > capacity[n] {
                over_for[n] += scenario.step;
                if over_for[n] >= scenario.overload_tolerance {
                    alive[n] = false;
                    drains.retain(|d| d.node != n);
                    log.push(TimelineEvent {
                        at: t,
                        what: Happening::Collapsed {
                            node: topo.nodes()[n].id.clone(),
                            utilisation: s.utilisation,
                        },
                    });
                    continue;
                }
            } else {
                over_for[n] = Duration::ZERO;
            }
            if let Some(g) = governors[n].as_mut()
                && let Some(change) = g.observe(s.load_gbps, capacity[n], now)
            {
                log.push(TimelineEvent {
                    at: t,
                    what: Happening::Cap {
                        node: topo.nodes()[n].id.clone(),
                        change,
                    },
                });
            }
        }
        let unserved_gbps = unserved
            .iter()
            .zip(pops)
            .map(|(u, p)| u * p.demand_gbps)
            .sum();
        records.push(Step {
            at: t,
            nodes: samples,
            unserved_gbps,
            drained_share,
            drained_gbps,
        });
    }
    Ok(Timeline {
        node_ids: topo.nodes().iter().map(|n| n.id.clone()).collect(),
        capacities: capacity,
        steps: records,
        events: log,
        step: scenario.step,
        drain_bound_per_step: scenario.drain.bound_for(scenario.step),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_topology_stays_quiet() {
        let tl =
            simulate(&Scenario::new(Topology::seed()).duration(Duration::from_secs(120))).unwrap();
        assert!(tl.events.is_empty(), "{:?}", tl.events);
        assert_eq!(tl.steps.len(), 13);
        let s = &tl.steps[0].nodes[1];
        assert_eq!((s.load_gbps, s.cap.clone()), (100.0, None));
    }

    #[test]
    fn refuses_a_zero_step_and_unknown_nodes() {
        let s = Scenario::seed(true).step(Duration::ZERO);
        assert_eq!(simulate(&s).unwrap_err(), SimError::ZeroStep);
        let s = Scenario::seed(true).event(SimEvent::down(Duration::ZERO, "paris"));
        assert!(matches!(simulate(&s), Err(SimError::UnknownNode { .. })));
    }

    #[test]
    fn the_tolerance_decides_when_an_overloaded_node_dies() {
        let s = Scenario::seed(false).overload_tolerance(Duration::from_secs(60));
        let tl = simulate(&s).unwrap();
        // Singapore overloaded from 1:00; dies once 60 s of overload have accumulated.
        assert_eq!(
            tl.collapses()[0],
            (Duration::from_secs(110), "singapore".to_owned())
        );
    }
}
