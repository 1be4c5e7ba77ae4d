//! Diffing a rendering against what a provider has deployed: the plan shown before anything
//! is sent, and the drift report read back afterwards. Pure: both sides are values.

use std::fmt;

use multicdn_core::ProviderId;

/// What a change does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChangeOp {
    /// Rendered, not deployed.
    Add,
    /// Deployed and rendered, different.
    Update,
    /// Deployed, not rendered.
    Remove,
}

impl ChangeOp {
    fn sign(self) -> char {
        match self {
            ChangeOp::Add => '+',
            ChangeOp::Update => '~',
            ChangeOp::Remove => '-',
        }
    }
}

/// Something a plan can describe: a snippet, a rule.
pub trait PlanItem {
    /// A one-line summary (`type recv, priority 10`).
    fn summary(&self) -> String;
    /// What differs from `deployed`, one line each (`priority: 100 -> 10`).
    fn differences(&self, deployed: &Self) -> Vec<String>;
}

/// One difference between the rendering and the deployed state.
#[derive(Debug, Clone, PartialEq)]
pub struct Change<T> {
    /// The item's name (snippet name, rule ref).
    pub key: String,
    /// Added, updated or removed.
    pub op: ChangeOp,
    /// What is deployed now.
    pub deployed: Option<T>,
    /// What the policy renders.
    pub rendered: Option<T>,
}

impl<T: PlanItem> fmt::Display for Change<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op.sign(), self.key)?;
        match (&self.deployed, &self.rendered) {
            (Some(d), Some(r)) => {
                for line in r.differences(d) {
                    write!(f, "\n    {line}")?;
                }
                Ok(())
            }
            (None, Some(r)) => write!(f, " ({})", r.summary()),
            (Some(d), None) => write!(f, " ({})", d.summary()),
            (None, None) => Ok(()),
        }
    }
}

/// The changes that turn `deployed` into `rendered`, both keyed by name: additions and
/// updates in rendered order, then removals in deployed order. Unchanged items are left out.
pub fn diff<T: PartialEq + Clone>(
    deployed: &[(String, T)],
    rendered: &[(String, T)],
) -> Vec<Change<T>> {
    let mut changes = Vec::new();
    for (key, r) in rendered {
        match deployed.iter().find(|(k, _)| k == key) {
            None => changes.push(Change {
                key: key.clone(),
                op: ChangeOp::Add,
                deployed: None,
                rendered: Some(r.clone()),
            }),
            Some((_, d)) if d != r => changes.push(Change {
                key: key.clone(),
                op: ChangeOp::Update,
                deployed: Some(d.clone()),
                rendered: Some(r.clone()),
            }),
            Some(_) => {}
        }
    }
    for (key, d) in deployed {
        if !rendered.iter().any(|(k, _)| k == key) {
            changes.push(Change {
                key: key.clone(),
                op: ChangeOp::Remove,
                deployed: Some(d.clone()),
                rendered: None,
            });
        }
    }
    changes
}

/// What is deployed and differs from the rendering: every item, expected against deployed.
#[derive(Debug, Clone, PartialEq)]
pub struct Drift<T> {
    /// The provider read back.
    pub provider: ProviderId,
    /// Where it was read (`active version 12`, `zone entry points`).
    pub source: String,
    /// Every differing item: `Add` = expected but missing, `Remove` = deployed but not
    /// rendered, `Update` = both, different.
    pub differences: Vec<Change<T>>,
    /// Deployed items the renderer does not own and did not compare (Fastly snippets not
    /// named `multicdn-...`).
    pub unmanaged: Vec<String>,
}

impl<T> Drift<T> {
    /// True when what is deployed is exactly the rendering.
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty()
    }
}

impl<T: PlanItem> fmt::Display for Drift<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.differences.is_empty() {
            write!(f, "{} ({}): no drift", self.provider, self.source)?;
            if !self.unmanaged.is_empty() {
                write!(
                    f,
                    " (not managed by the policy: {})",
                    self.unmanaged.join(", ")
                )?;
            }
            return Ok(());
        }
        write!(
            f,
            "{} ({}): {} item(s) differ from the rendering",
            self.provider,
            self.source,
            self.differences.len()
        )?;
        for c in &self.differences {
            let what = match c.op {
                ChangeOp::Add => "expected, not deployed",
                ChangeOp::Remove => "deployed, not expected",
                ChangeOp::Update => "deployed differs from expected",
            };
            write!(f, "\n  {c}  [{what}]")?;
        }
        if !self.unmanaged.is_empty() {
            write!(
                f,
                "\n  not managed by the policy: {}",
                self.unmanaged.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Why a deploy did not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DeployError {
    /// `apply` was called without the explicit confirmation; nothing was sent.
    #[error("{provider}: not applied: applying needs explicit confirmation (nothing was sent)")]
    NotConfirmed {
        /// The provider.
        provider: ProviderId,
    },
    /// The deployed state changed after the plan was made; nothing was written.
    #[error("{provider}: the plan is out of date ({what}); plan again (nothing was written)")]
    PlanOutdated {
        /// The provider.
        provider: ProviderId,
        /// What moved.
        what: String,
    },
    /// Fastly rejected the new version; the active version is untouched.
    #[error("{provider}: version {version} failed validation and was not activated (the active version is untouched): {message}{}", errors.iter().map(|e| format!("\n  {e}")).collect::<String>())]
    ValidationFailed {
        /// The provider.
        provider: ProviderId,
        /// The draft version that failed.
        version: u32,
        /// Fastly's message.
        message: String,
        /// Fastly's individual errors.
        errors: Vec<String>,
    },
    /// A vendor call failed after some writes had been made: what was done, then the error.
    #[error("{source}; written before the failure: {done}")]
    Partial {
        /// What had been written (`draft version 4 cloned from 3; active version 3 untouched`).
        done: String,
        /// The failed call.
        source: multicdn_core::Error,
    },
    /// A vendor call failed.
    #[error(transparent)]
    Vendor(#[from] multicdn_core::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Item(u32);

    impl PlanItem for Item {
        fn summary(&self) -> String {
            format!("value {}", self.0)
        }
        fn differences(&self, deployed: &Self) -> Vec<String> {
            vec![format!("value: {} -> {}", deployed.0, self.0)]
        }
    }

    fn kv(items: &[(&str, u32)]) -> Vec<(String, Item)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Item(*v)))
            .collect()
    }

    #[test]
    fn diff_lists_additions_updates_then_removals_and_skips_the_unchanged() {
        let changes = diff(
            &kv(&[("a", 1), ("b", 2), ("gone", 9)]),
            &kv(&[("b", 3), ("a", 1), ("new", 4)]),
        );
        let ops: Vec<_> = changes.iter().map(|c| (c.key.as_str(), c.op)).collect();
        assert_eq!(
            ops,
            vec![
                ("b", ChangeOp::Update),
                ("new", ChangeOp::Add),
                ("gone", ChangeOp::Remove)
            ]
        );
        assert_eq!(changes[0].to_string(), "~ b\n    value: 2 -> 3");
        assert_eq!(changes[1].to_string(), "+ new (value 4)");
    }

    #[test]
    fn identical_sides_have_no_drift() {
        let d = Drift {
            provider: ProviderId::new("fastly").unwrap(),
            source: "active version 3".into(),
            differences: diff(&kv(&[("a", 1)]), &kv(&[("a", 1)])),
            unmanaged: Vec::new(),
        };
        assert!(d.is_clean());
        assert_eq!(d.to_string(), "fastly (active version 3): no drift");
    }
}
