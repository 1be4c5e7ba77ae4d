//! Diffing a rendering against what a provider has deployed: the plan shown before anything
//! is sent, and the drift report read back afterwards. Pure: both sides are values.

use std::collections::BTreeMap;
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

/// A fingerprint of what multicdn wrote (FNV-1a, 64 bits, as 16 hex digits): stored beside a
/// snippet or rule it writes, so a later read can tell whether someone changed it since. Not a
/// security measure: it detects edits, it does not authenticate them.
pub fn fingerprint(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// One call a plan would make, as it will be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCall {
    /// `PUT`, `POST`, `DELETE`, `GET`.
    pub method: &'static str,
    /// The path on the vendor's API.
    pub path: String,
    /// What the body carries, in a few words (empty for none).
    pub body: String,
}

impl fmt::Display for PlannedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.body.is_empty() {
            write!(f, "  [{}]", self.body)?;
        }
        Ok(())
    }
}

/// A deployed item the plan would overwrite or delete that multicdn did not write as it is
/// now: edited on the console, or added there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleEdit {
    /// The item (snippet name, `phase/ref`).
    pub key: String,
    /// What was found (`edited since multicdn wrote it`, `not written by multicdn`).
    pub what: String,
}

impl fmt::Display for ConsoleEdit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.what)
    }
}

/// How an apply goes ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeployOptions {
    /// Nothing is sent unless this is set.
    pub confirm: bool,
    /// Overwrite console edits (deployed items multicdn did not write as they are).
    pub force: bool,
}

impl DeployOptions {
    /// Sets the explicit confirmation.
    #[must_use]
    pub fn confirm(mut self, confirm: bool) -> DeployOptions {
        self.confirm = confirm;
        self
    }

    /// Overwrites console edits when `force` is set.
    #[must_use]
    pub fn force(mut self, force: bool) -> DeployOptions {
        self.force = force;
        self
    }

    /// Why an apply with these options must not send anything: no confirmation, or a plan
    /// with console edits and no `force`. `None` when it may go ahead.
    pub fn refusal(&self, provider: &ProviderId, edits: &[ConsoleEdit]) -> Option<DeployError> {
        if !self.confirm {
            return Some(DeployError::NotConfirmed {
                provider: provider.clone(),
            });
        }
        if !self.force && !edits.is_empty() {
            return Some(DeployError::ConsoleEdits {
                provider: provider.clone(),
                edits: edits.to_vec(),
            });
        }
        None
    }
}

/// The changes that would overwrite or delete a deployed item multicdn did not write as it
/// is (`unverified`: key -> what was found); additions overwrite nothing.
pub fn console_edits<T>(
    changes: &[Change<T>],
    unverified: &BTreeMap<String, String>,
) -> Vec<ConsoleEdit> {
    changes
        .iter()
        .filter(|c| c.op != ChangeOp::Add)
        .filter_map(|c| {
            unverified.get(&c.key).map(|what| ConsoleEdit {
                key: c.key.clone(),
                what: what.clone(),
            })
        })
        .collect()
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
    /// The plan would overwrite items edited or added outside multicdn, and `force` was not
    /// given; nothing was sent.
    #[error("{provider}: not applied: the plan would overwrite {} item(s) changed outside multicdn (nothing was sent); review them and apply with force to overwrite:{}", edits.len(), edits.iter().map(|e| format!("\n  {e}")).collect::<String>())]
    ConsoleEdits {
        /// The provider.
        provider: ProviderId,
        /// Each item and what was found.
        edits: Vec<ConsoleEdit>,
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
    fn fingerprints_change_with_any_part_and_with_where_parts_split() {
        let a = fingerprint(&["recv", "10", "return(pass);"]);
        assert_eq!(a.len(), 16);
        assert_eq!(a, fingerprint(&["recv", "10", "return(pass);"]));
        assert_ne!(a, fingerprint(&["recv", "11", "return(pass);"]));
        assert_ne!(
            fingerprint(&["ab", "c"]),
            fingerprint(&["a", "bc"]),
            "part boundaries count"
        );
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
