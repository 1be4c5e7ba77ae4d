//! Where clients go: CDN nodes (location, capacity, health) and client populations (demand,
//! nodes in order of nearness), and the capacity-aware failover rule.
//!
//! A population is served by its nearest node while that node is up. When it is down, its
//! clients *spread*: walking the population's nearness list, each live node takes what fits
//! under its fill target (`fill_to` × capacity, default 80%), so a failover lands on several
//! nodes with room rather than on one. What fits nowhere goes where players would go on their
//! own, the nearest live node, which may overload it: that is the case quality caps exist for.

use std::fmt;

/// Whether a node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeHealth {
    /// Serving.
    Up,
    /// Not serving anyone at any quality.
    Down,
}

/// One CDN node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// A short id (`singapore`).
    pub id: String,
    /// Where it is, for people (`Singapore`).
    pub location: String,
    /// Outbound capacity, Gbps.
    pub capacity_gbps: f64,
    /// Up or down.
    pub health: NodeHealth,
}

impl Node {
    /// A node that is up.
    pub fn new(id: impl Into<String>, location: impl Into<String>, capacity_gbps: f64) -> Node {
        Node {
            id: id.into(),
            location: location.into(),
            capacity_gbps,
            health: NodeHealth::Up,
        }
    }
}

/// A population of clients.
#[derive(Debug, Clone, PartialEq)]
pub struct Population {
    /// A short id (`india`).
    pub id: String,
    /// What its players pull uncapped, Gbps.
    pub demand_gbps: f64,
    /// Node ids, nearest first.
    pub nearness: Vec<String>,
}

impl Population {
    /// A population with its nearness order.
    pub fn new(id: impl Into<String>, demand_gbps: f64, nearness: &[&str]) -> Population {
        Population {
            id: id.into(),
            demand_gbps,
            nearness: nearness.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// Why a topology was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// Two nodes or two populations share an id.
    #[error("id {0:?} is used twice")]
    Duplicate(String),
    /// A population names a node that does not exist.
    #[error("population {population:?} lists unknown node {node:?} (nodes: {known})")]
    UnknownNode {
        /// The population.
        population: String,
        /// The node named.
        node: String,
        /// The nodes that exist.
        known: String,
    },
    /// A population with an empty nearness list.
    #[error("population {0:?} lists no node")]
    NoNode(String),
    /// A capacity or demand that is negative, zero (capacity) or not a number.
    #[error("{what} of {id:?} is {value}; it must be a finite number, positive for a capacity")]
    Value {
        /// `capacity` or `demand`.
        what: &'static str,
        /// The node or population.
        id: String,
        /// The value.
        value: String,
    },
    /// An id that names no node.
    #[error("no node {0:?}")]
    NoSuchNode(String),
}

/// How failover spreads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailoverConfig {
    /// Fill a node up to this share of its capacity before spilling to the next (default 0.8).
    pub fill_to: f64,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig { fill_to: 0.8 }
    }
}

/// Nodes and populations, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    nodes: Vec<Node>,
    populations: Vec<Population>,
    /// Indices of each population's nodes, nearest first.
    nearness: Vec<Vec<usize>>,
    failover: FailoverConfig,
}

/// Which share of each population each node serves.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// `shares[population][node]`, fractions of the population.
    pub shares: Vec<Vec<f64>>,
    /// Fraction of each population no node serves.
    pub unserved: Vec<f64>,
}

impl Assignment {
    /// Demand each node receives, Gbps.
    pub fn node_demand(&self, topology: &Topology) -> Vec<f64> {
        let mut out = vec![0.0; topology.nodes.len()];
        for (p, shares) in self.shares.iter().enumerate() {
            let demand = topology.populations[p].demand_gbps;
            for (n, s) in shares.iter().enumerate() {
                out[n] += s * demand;
            }
        }
        out
    }
}

impl Topology {
    /// Checks and builds a topology.
    pub fn new(nodes: Vec<Node>, populations: Vec<Population>) -> Result<Topology, TopologyError> {
        let value = |what, id: &str, v: f64| TopologyError::Value {
            what,
            id: id.to_owned(),
            value: v.to_string(),
        };
        for (i, n) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|o| o.id == n.id) {
                return Err(TopologyError::Duplicate(n.id.clone()));
            }
            if !n.capacity_gbps.is_finite() || n.capacity_gbps <= 0.0 {
                return Err(value("capacity", &n.id, n.capacity_gbps));
            }
        }
        let mut nearness = Vec::with_capacity(populations.len());
        for (i, p) in populations.iter().enumerate() {
            if populations[..i].iter().any(|o| o.id == p.id) {
                return Err(TopologyError::Duplicate(p.id.clone()));
            }
            if !p.demand_gbps.is_finite() || p.demand_gbps < 0.0 {
                return Err(value("demand", &p.id, p.demand_gbps));
            }
            if p.nearness.is_empty() {
                return Err(TopologyError::NoNode(p.id.clone()));
            }
            let mut idx = Vec::with_capacity(p.nearness.len());
            for id in &p.nearness {
                let Some(n) = nodes.iter().position(|n| &n.id == id) else {
                    return Err(TopologyError::UnknownNode {
                        population: p.id.clone(),
                        node: id.clone(),
                        known: nodes
                            .iter()
                            .map(|n| n.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                };
                if !idx.contains(&n) {
                    idx.push(n);
                }
            }
            nearness.push(idx);
        }
        Ok(Topology {
            nodes,
            populations,
            nearness,
            failover: FailoverConfig::default(),
        })
    }

    /// The seed scenario (capacities chosen so the seed's story holds, loads at 4K):
    ///
    /// | node | capacity | own population | own demand |
    /// |---|---|---|---|
    /// | mumbai | 400 Gbps | india (50M × 6 Mbps) | 300 Gbps (75%) |
    /// | singapore | 125 Gbps | sea | 100 Gbps (80%) |
    /// | tokyo | 200 Gbps | japan | 170 Gbps (85%) |
    /// | sydney | 100 Gbps | oceania | 85 Gbps (85%) |
    ///
    /// Nearness: india → mumbai, singapore, tokyo, sydney; sea → singapore, tokyo, sydney,
    /// mumbai; japan → tokyo, singapore, sydney, mumbai; oceania → sydney, singapore, tokyo,
    /// mumbai. Every survivor already sits at or above the 80% fill target, so when Mumbai dies
    /// all 300 Gbps of India lands on Singapore: 400 Gbps on 125.
    pub fn seed() -> Topology {
        let nodes = vec![
            Node::new("mumbai", "Mumbai", 400.0),
            Node::new("singapore", "Singapore", 125.0),
            Node::new("tokyo", "Tokyo", 200.0),
            Node::new("sydney", "Sydney", 100.0),
        ];
        let populations = vec![
            Population::new("india", 300.0, &["mumbai", "singapore", "tokyo", "sydney"]),
            Population::new("sea", 100.0, &["singapore", "tokyo", "sydney", "mumbai"]),
            Population::new("japan", 170.0, &["tokyo", "singapore", "sydney", "mumbai"]),
            Population::new("oceania", 85.0, &["sydney", "singapore", "tokyo", "mumbai"]),
        ];
        match Topology::new(nodes, populations) {
            Ok(t) => t,
            // The table above is valid by construction; an empty topology is the safe fallback.
            Err(_) => Topology {
                nodes: Vec::new(),
                populations: Vec::new(),
                nearness: Vec::new(),
                failover: FailoverConfig::default(),
            },
        }
    }

    /// Sets the failover rule.
    pub fn with_failover(mut self, failover: FailoverConfig) -> Topology {
        self.failover = failover;
        self
    }

    /// The failover rule.
    pub fn failover(&self) -> FailoverConfig {
        self.failover
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The populations.
    pub fn populations(&self) -> &[Population] {
        &self.populations
    }

    /// The node with `id`.
    pub fn node_index(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Population `p`'s node indices, nearest first.
    pub fn nearness(&self, p: usize) -> &[usize] {
        self.nearness.get(p).map_or(&[], Vec::as_slice)
    }

    /// Marks a node up or down.
    pub fn set_health(&mut self, id: &str, health: NodeHealth) -> Result<(), TopologyError> {
        let n = self
            .node_index(id)
            .ok_or_else(|| TopologyError::NoSuchNode(id.to_owned()))?;
        self.nodes[n].health = health;
        Ok(())
    }

    /// Places `share` of population `p` given what nodes already carry (`node_demand`, Gbps,
    /// updated in place) and which are up. Returns the fractions placed on each node and the
    /// fraction nobody can serve.
    pub fn spread(
        &self,
        p: usize,
        share: f64,
        alive: &[bool],
        node_demand: &mut [f64],
    ) -> (Vec<(usize, f64)>, f64) {
        let Some(pop) = self.populations.get(p) else {
            return (Vec::new(), share);
        };
        let mut left = share * pop.demand_gbps;
        let mut placed: Vec<(usize, f64)> = Vec::new();
        let live: Vec<usize> = self
            .nearness(p)
            .iter()
            .copied()
            .filter(|&n| alive.get(n).copied().unwrap_or(false))
            .collect();
        let Some(&nearest) = live.first() else {
            return (Vec::new(), share);
        };
        if pop.demand_gbps <= 0.0 {
            return (vec![(nearest, share)], 0.0);
        }
        for &n in &live {
            if left <= 0.0 {
                break;
            }
            let room =
                (self.failover.fill_to * self.nodes[n].capacity_gbps - node_demand[n]).max(0.0);
            let take = room.min(left);
            if take > 0.0 {
                node_demand[n] += take;
                left -= take;
                placed.push((n, take / pop.demand_gbps));
            }
        }
        if left > 0.0 {
            node_demand[nearest] += left;
            match placed.iter_mut().find(|(n, _)| *n == nearest) {
                Some((_, s)) => *s += left / pop.demand_gbps,
                None => placed.push((nearest, left / pop.demand_gbps)),
            }
        }
        (placed, 0.0)
    }

    /// Who serves whom given the nodes' health: populations whose nearest node is up stay
    /// there; the others spread (in population order) as described in the module docs.
    pub fn assign(&self) -> Assignment {
        let alive: Vec<bool> = self
            .nodes
            .iter()
            .map(|n| n.health == NodeHealth::Up)
            .collect();
        let mut shares = vec![vec![0.0; self.nodes.len()]; self.populations.len()];
        let mut unserved = vec![0.0; self.populations.len()];
        let mut demand = vec![0.0; self.nodes.len()];
        let mut orphans = Vec::new();
        for (p, pop) in self.populations.iter().enumerate() {
            match self.nearness(p).first() {
                Some(&home) if alive[home] => {
                    shares[p][home] = 1.0;
                    demand[home] += pop.demand_gbps;
                }
                _ => orphans.push(p),
            }
        }
        for p in orphans {
            let (placed, lost) = self.spread(p, 1.0, &alive, &mut demand);
            for (n, s) in placed {
                shares[p][n] += s;
            }
            unserved[p] = lost;
        }
        Assignment { shares, unserved }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.nodes {
            writeln!(
                f,
                "node {} ({}): {} Gbps, {:?}",
                n.id, n.location, n.capacity_gbps, n.health
            )?;
        }
        for (p, pop) in self.populations.iter().enumerate() {
            let near: Vec<&str> = self
                .nearness(p)
                .iter()
                .map(|&n| self.nodes[n].id.as_str())
                .collect();
            writeln!(
                f,
                "population {}: {} Gbps, nearest {}",
                pop.id,
                pop.demand_gbps,
                near.join(" > ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_the_seed_all_of_india_lands_on_singapore() {
        let mut t = Topology::seed();
        t.set_health("mumbai", NodeHealth::Down).unwrap();
        let d = t.assign().node_demand(&t);
        assert_eq!(d, vec![0.0, 400.0, 170.0, 85.0]);
    }

    #[test]
    fn a_failover_spreads_over_nodes_with_room() {
        let nodes = vec![
            Node::new("a", "A", 100.0),
            Node::new("b", "B", 100.0),
            Node::new("c", "C", 100.0),
            Node::new("d", "D", 100.0),
        ];
        let pops = vec![
            Population::new("pa", 90.0, &["a", "b", "c", "d"]),
            Population::new("pb", 50.0, &["b"]),
            Population::new("pc", 20.0, &["c"]),
        ];
        let mut t = Topology::new(nodes, pops).unwrap();
        t.set_health("a", NodeHealth::Down).unwrap();
        let a = t.assign();
        // b has 30 of room under 80, c 60: pa's 90 splits 30 / 60, d untouched.
        assert_eq!(t.assign().node_demand(&t), vec![0.0, 80.0, 80.0, 0.0]);
        assert!((a.shares[0][1] - 30.0 / 90.0).abs() < 1e-9);
        assert!((a.shares[0].iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn what_fits_nowhere_goes_to_the_nearest_live_node() {
        let mut t = Topology::seed();
        for n in ["mumbai", "singapore"] {
            t.set_health(n, NodeHealth::Down).unwrap();
        }
        let d = t.assign().node_demand(&t);
        assert_eq!(d, vec![0.0, 0.0, 570.0, 85.0]);
    }

    #[test]
    fn nobody_serves_a_population_whose_nodes_are_all_down() {
        let mut t = Topology::seed();
        for n in ["mumbai", "singapore", "tokyo", "sydney"] {
            t.set_health(n, NodeHealth::Down).unwrap();
        }
        assert_eq!(t.assign().unserved, vec![1.0; 4]);
    }

    #[test]
    fn refuses_inconsistent_topologies() {
        let n = || vec![Node::new("a", "A", 1.0)];
        assert!(matches!(
            Topology::new(n(), vec![Population::new("p", 1.0, &["z"])]),
            Err(TopologyError::UnknownNode { .. })
        ));
        assert!(Topology::new(vec![Node::new("a", "A", 0.0)], vec![]).is_err());
        assert!(Topology::new(n(), vec![Population::new("p", f64::NAN, &["a"])]).is_err());
        assert!(Topology::new(n(), vec![Population::new("p", 1.0, &[])]).is_err());
        let mut dup = n();
        dup.push(Node::new("a", "A", 1.0));
        assert!(Topology::new(dup, vec![]).is_err());
    }
}
