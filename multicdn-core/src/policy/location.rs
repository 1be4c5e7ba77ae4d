//! Where each field of a YAML document sits, so that an error found after parsing (a weight
//! sum, an unknown provider) can still name the line and column it comes from.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser};

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

/// Field paths (`steering.regions[2].weights`) mapped to where they are written.
#[derive(Debug, Default)]
pub(crate) struct LocationIndex {
    by_path: HashMap<String, Position>,
    in_order: Vec<(Position, String)>,
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, next: usize },
}

impl LocationIndex {
    /// Indexes `src`. A document that does not parse gives a partial index; the parse error is
    /// reported by the deserializer, with its own position.
    pub(crate) fn build(src: &str) -> LocationIndex {
        let mut index = LocationIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(src) {
            let Ok((event, span)) = item else { break };
            let pos = Position {
                line: span.start.line(),
                column: span.start.col() + 1,
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map { key, .. }) = stack.last_mut()
                        && key.is_none()
                    {
                        // A key: record the field where its key is written.
                        let child = child_path(&stack, Some(&value));
                        index.record(child, pos);
                        if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                            *key = Some(value.into_owned());
                        }
                        continue;
                    }
                    let path = value_path(&mut stack);
                    if let Some(path) = path {
                        index.record(path, pos);
                    }
                    finish_value(&mut stack);
                }
                Event::Alias(_) => {
                    if let Some(path) = value_path(&mut stack) {
                        index.record(path, pos);
                    }
                    finish_value(&mut stack);
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let is_map = matches!(event, Event::MappingStart(..));
                    let path = match stack.last() {
                        None => Some(String::new()),
                        Some(Frame::Map { key: None, .. }) => None, // a complex key
                        _ => value_path(&mut stack),
                    };
                    let path = path.unwrap_or_else(|| "?".to_owned());
                    if !path.is_empty() && path != "?" {
                        index.record(path.clone(), pos);
                    }
                    stack.push(if is_map {
                        Frame::Map { path, key: None }
                    } else {
                        Frame::Seq { path, next: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    finish_value(&mut stack);
                }
                _ => {}
            }
        }
        index.in_order.sort();
        index
    }

    fn record(&mut self, path: String, pos: Position) {
        self.by_path.entry(path.clone()).or_insert(pos);
        self.in_order.push((pos, path));
    }

    /// Where `path` is written; for a path that is not in the document (a missing field), where
    /// its nearest written ancestor is.
    pub(crate) fn position_of(&self, path: &str) -> Option<Position> {
        let mut p = path;
        loop {
            if let Some(pos) = self.by_path.get(p) {
                return Some(*pos);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }

    /// The field written at or just before `pos`: the path a parse error at `pos` concerns.
    pub(crate) fn path_at(&self, pos: Position) -> Option<&str> {
        let i = self.in_order.partition_point(|(p, _)| *p <= pos);
        i.checked_sub(1).map(|i| self.in_order[i].1.as_str())
    }
}

fn child_path(stack: &[Frame], key: Option<&str>) -> String {
    match stack.last() {
        Some(Frame::Map { path, .. }) => join(path, key.unwrap_or("?")),
        Some(Frame::Seq { path, next }) => format!("{path}[{next}]"),
        None => String::new(),
    }
}

/// The path of the value about to be read, advancing a sequence's index.
fn value_path(stack: &mut [Frame]) -> Option<String> {
    match stack.last_mut() {
        Some(Frame::Map { path, key: Some(k) }) => Some(join(path, k)),
        Some(Frame::Seq { path, next }) => {
            let p = format!("{path}[{next}]");
            *next += 1;
            Some(p)
        }
        _ => None,
    }
}

/// A map's value is complete: the next scalar is a key again.
fn finish_value(stack: &mut [Frame]) {
    if let Some(Frame::Map { key, .. }) = stack.last_mut() {
        *key = None;
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() || parent == "?" {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
steering:
  regions:
    - match: [GB, IE]
      weights: { fastly: 90, cloudflare: 10 }
    - match: ['*']
      weights:
        fastly: 50
health:
  quorum: 3
";

    #[test]
    fn finds_fields_by_path() {
        let idx = LocationIndex::build(DOC);
        assert_eq!(
            idx.position_of("health.quorum"),
            Some(Position { line: 9, column: 3 })
        );
        assert_eq!(
            idx.position_of("steering.regions[0].weights"),
            Some(Position { line: 4, column: 7 })
        );
        assert_eq!(
            idx.position_of("steering.regions[1].weights.fastly"),
            Some(Position { line: 7, column: 9 })
        );
        assert_eq!(
            idx.position_of("steering.regions[0].match[1]")
                .map(|p| p.line),
            Some(3)
        );
        // A missing field falls back to its nearest ancestor.
        assert_eq!(
            idx.position_of("health.interval"),
            Some(Position { line: 8, column: 1 })
        );
    }

    #[test]
    fn maps_a_position_back_to_a_path() {
        let idx = LocationIndex::build(DOC);
        assert_eq!(
            idx.path_at(Position {
                line: 9,
                column: 11
            }),
            Some("health.quorum")
        );
    }
}
