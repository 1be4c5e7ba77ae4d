//! Every problem in a policy file at once. A typed parse stops at its first error, so when it
//! fails the document is read again as a tree of nodes (scalars kept as written) and
//! deserialised from that tree repeatedly: each error is recorded under its own path and the
//! node at fault is set aside before the next attempt, until the rest reads.
//!
//! A missing key is named under its parent (`providers.fastly.edge_host`), an unknown key as
//! itself, a wrong value where it stands.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

/// One node as written.
#[derive(Debug, Clone)]
enum Node {
    Scalar { value: String, plain: bool },
    Map(Vec<(String, Child)>),
    Seq(Vec<Child>),
}

/// A node with the path it was written at.
#[derive(Debug, Clone)]
struct Child {
    path: String,
    node: Node,
}

enum Frame {
    Map {
        path: String,
        anchor: usize,
        entries: Vec<(String, Child)>,
        key: Option<String>,
    },
    Seq {
        path: String,
        anchor: usize,
        items: Vec<Child>,
    },
}

impl Frame {
    /// The path of the next value in this collection.
    fn next_path(&self) -> String {
        match self {
            Frame::Map { path, key, .. } => join(path, key.as_deref().unwrap_or("?")),
            Frame::Seq { path, items, .. } => format!("{path}[{}]", items.len()),
        }
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The document as a tree; `None` when it is not one YAML document the tree can hold (a
/// syntax error, a complex key, several documents).
fn build(src: &str) -> Option<Child> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut root = None;
    let mut documents = 0;
    for item in Parser::new_from_str(src) {
        let (event, _) = item.ok()?;
        let finished = match event {
            Event::DocumentStart(..) => {
                documents += 1;
                if documents > 1 {
                    return None;
                }
                continue;
            }
            Event::Scalar(value, style, anchor, _) => {
                if let Some(Frame::Map { key, .. }) = stack.last_mut()
                    && key.is_none()
                {
                    *key = Some(value.into_owned());
                    continue;
                }
                let node = Node::Scalar {
                    value: value.into_owned(),
                    plain: style == ScalarStyle::Plain,
                };
                if anchor != 0 {
                    anchors.insert(anchor, node.clone());
                }
                node
            }
            Event::Alias(id) => {
                if matches!(stack.last(), Some(Frame::Map { key: None, .. })) {
                    return None;
                }
                anchors.get(&id)?.clone()
            }
            Event::MappingStart(_, anchor, _) | Event::SequenceStart(_, anchor, _) => {
                if matches!(stack.last(), Some(Frame::Map { key: None, .. })) {
                    return None; // a complex key
                }
                let path = stack.last().map(Frame::next_path).unwrap_or_default();
                stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Map {
                        path,
                        anchor,
                        entries: Vec::new(),
                        key: None,
                    }
                } else {
                    Frame::Seq {
                        path,
                        anchor,
                        items: Vec::new(),
                    }
                });
                continue;
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let (node, anchor) = match stack.pop()? {
                    Frame::Map {
                        entries, anchor, ..
                    } => (Node::Map(entries), anchor),
                    Frame::Seq { items, anchor, .. } => (Node::Seq(items), anchor),
                };
                if anchor != 0 {
                    anchors.insert(anchor, node.clone());
                }
                node
            }
            _ => continue,
        };
        let path = stack.last().map(Frame::next_path).unwrap_or_default();
        let child = Child {
            path,
            node: finished,
        };
        match stack.last_mut() {
            Some(Frame::Map { entries, key, .. }) => {
                let k = key.take().unwrap_or_default();
                entries.push((k, child));
            }
            Some(Frame::Seq { items, .. }) => items.push(child),
            None => root = Some(child),
        }
    }
    root
}

/// Removes the node written at `path`; whether one was removed.
fn prune(node: &mut Node, path: &str) -> bool {
    match node {
        Node::Map(entries) => {
            let before = entries.len();
            entries.retain(|(_, c)| c.path != path);
            before != entries.len() || entries.iter_mut().any(|(_, c)| prune(&mut c.node, path))
        }
        Node::Seq(items) => {
            let before = items.len();
            items.retain(|c| c.path != path);
            before != items.len() || items.iter_mut().any(|c| prune(&mut c.node, path))
        }
        Node::Scalar { .. } => false,
    }
}

#[derive(Debug)]
enum Kind {
    Missing(&'static str),
    Unknown(String, String),
    Other(String),
}

/// A deserialisation error with the path of the node it happened at.
#[derive(Debug)]
struct TreeError {
    path: Option<String>,
    kind: Kind,
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Missing(field) => write!(f, "missing field `{field}`"),
            Kind::Unknown(_, message) | Kind::Other(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for TreeError {}

impl de::Error for TreeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        TreeError {
            path: None,
            kind: Kind::Other(msg.to_string()),
        }
    }

    fn missing_field(field: &'static str) -> Self {
        TreeError {
            path: None,
            kind: Kind::Missing(field),
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let message = <de::value::Error as de::Error>::unknown_field(field, expected).to_string();
        TreeError {
            path: None,
            kind: Kind::Unknown(field.to_owned(), message),
        }
    }
}

/// Deserialises one node, stamping its path on errors that have none yet.
struct De<'a>(&'a Child);

impl De<'_> {
    fn stamp<T>(&self, r: Result<T, TreeError>) -> Result<T, TreeError> {
        r.map_err(|mut e| {
            if e.path.is_none() {
                e.path = Some(self.0.path.clone());
            }
            e
        })
    }

    fn scalar(&self) -> Option<(&str, bool)> {
        match &self.0.node {
            Node::Scalar { value, plain } => Some((value, *plain)),
            _ => None,
        }
    }

    fn unexpected(&self) -> de::Unexpected<'_> {
        match &self.0.node {
            Node::Scalar { value, .. } => de::Unexpected::Str(value),
            Node::Map(_) => de::Unexpected::Map,
            Node::Seq(_) => de::Unexpected::Seq,
        }
    }
}

fn is_null(v: &str) -> bool {
    matches!(v, "" | "~" | "null" | "Null" | "NULL")
}

fn as_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

enum Number {
    U(u64),
    I(i64),
    F(f64),
}

fn as_number(v: &str) -> Option<Number> {
    let digits = v.strip_prefix('+').unwrap_or(v);
    if let Some(hex) = digits.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).ok().map(Number::U);
    }
    if let Some(oct) = digits.strip_prefix("0o") {
        return u64::from_str_radix(oct, 8).ok().map(Number::U);
    }
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return digits.parse().ok().map(Number::U);
    }
    if let Some(neg) = v.strip_prefix('-')
        && !neg.is_empty()
        && neg.bytes().all(|b| b.is_ascii_digit())
    {
        return v.parse().ok().map(Number::I);
    }
    match digits.to_ascii_lowercase().as_str() {
        ".inf" => return Some(Number::F(f64::INFINITY)),
        "-.inf" => return Some(Number::F(f64::NEG_INFINITY)),
        ".nan" => return Some(Number::F(f64::NAN)),
        _ => {}
    }
    let numeric = v
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
    if numeric && v.bytes().any(|b| b.is_ascii_digit()) {
        return v.parse().ok().map(Number::F);
    }
    None
}

impl<'de, 'a> de::Deserializer<'de> for De<'a> {
    type Error = TreeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        let r = match &self.0.node {
            Node::Scalar {
                value,
                plain: false,
            } => visitor.visit_str(value),
            Node::Scalar { value, plain: true } => {
                if is_null(value) {
                    visitor.visit_unit()
                } else if let Some(b) = as_bool(value) {
                    visitor.visit_bool(b)
                } else {
                    match as_number(value) {
                        Some(Number::U(n)) => visitor.visit_u64(n),
                        Some(Number::I(n)) => visitor.visit_i64(n),
                        Some(Number::F(n)) => visitor.visit_f64(n),
                        None => visitor.visit_str(value),
                    }
                }
            }
            Node::Map(entries) => visitor.visit_map(Entries {
                entries: entries.iter(),
                value: None,
            }),
            Node::Seq(items) => visitor.visit_seq(Items(items.iter())),
        };
        self.stamp(r)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        let r = match self.scalar() {
            Some((v, true)) if as_bool(v).is_some() => {
                visitor.visit_bool(as_bool(v).unwrap_or_default())
            }
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        };
        self.stamp(r)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.number(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        let r = match self.scalar() {
            Some((v, plain)) if !(plain && is_null(v)) => visitor.visit_str(v),
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        };
        self.stamp(r)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.deserialize_str(visitor)
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        match self.scalar() {
            Some((v, true)) if is_null(v) => self.stamp(visitor.visit_none()),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        let r = match self.scalar() {
            Some((v, true)) if is_null(v) => visitor.visit_unit(),
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        };
        self.stamp(r)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TreeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TreeError> {
        let r = match self.scalar() {
            Some((v, _)) => visitor.visit_enum(IntoDeserializer::<TreeError>::into_deserializer(v)),
            None => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        };
        self.stamp(r)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        char bytes byte_buf unit_struct seq tuple tuple_struct map struct
        i128 u128
    }
}

impl De<'_> {
    fn number<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        let r = match self.scalar() {
            Some((v, true)) => match as_number(v) {
                Some(Number::U(n)) => visitor.visit_u64(n),
                Some(Number::I(n)) => visitor.visit_i64(n),
                Some(Number::F(n)) => visitor.visit_f64(n),
                None => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
            },
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        };
        self.stamp(r)
    }
}

struct Entries<'a> {
    entries: std::slice::Iter<'a, (String, Child)>,
    value: Option<&'a Child>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = TreeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TreeError> {
        let Some((key, child)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(child);
        let key_node = Child {
            path: child.path.clone(),
            node: Node::Scalar {
                value: key.clone(),
                plain: false,
            },
        };
        seed.deserialize(De(&key_node)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, TreeError> {
        match self.value.take() {
            Some(child) => seed.deserialize(De(child)),
            None => Err(de::Error::custom("a value without its key")),
        }
    }
}

struct Items<'a>(std::slice::Iter<'a, Child>);

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = TreeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, TreeError> {
        match self.0.next() {
            Some(child) => seed.deserialize(De(child)).map(Some),
            None => Ok(None),
        }
    }
}

/// What the repeated reading found.
pub(super) struct Found<T> {
    /// Each problem's path and message, in the order found.
    pub(super) problems: Vec<(String, String)>,
    /// The document with the faulty nodes set aside, when the rest reads; with the paths set
    /// aside, whose checks would only repeat a problem already reported.
    pub(super) rest: Option<(T, Vec<String>)>,
}

/// Reads `src` as `T` again and again, recording each error and setting its node aside.
/// `None` when the text is not a tree this reader holds (the typed parser's error stands).
pub(super) fn every_problem<T: for<'de> Deserialize<'de>>(
    src: &str,
    required_top: &[&str],
) -> Option<Found<T>> {
    let mut root = build(src)?;
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut set_aside: Vec<String> = Vec::new();
    for _ in 0..256 {
        let e = match T::deserialize(De(&root)) {
            Ok(value) => {
                return Some(Found {
                    problems,
                    rest: Some((value, set_aside)),
                });
            }
            Err(e) => e,
        };
        let path = e.path.clone().unwrap_or_default();
        let message = e.to_string();
        let (report, remove) = match e.kind {
            Kind::Missing(_) if path.is_empty() => {
                // Every required section, at once: the document itself stays.
                if let Node::Map(entries) = &root.node {
                    for key in required_top {
                        if !entries.iter().any(|(k, _)| k == key)
                            && !set_aside.iter().any(|p| p == key)
                        {
                            problems.push(((*key).to_owned(), format!("missing field `{key}`")));
                        }
                    }
                } else {
                    problems.push((path, message));
                }
                return Some(Found {
                    problems,
                    rest: None,
                });
            }
            Kind::Missing(field) => {
                let missing = join(&path, field);
                // A key set aside for its own error is not missing twice.
                let already = set_aside.contains(&missing);
                (
                    (!already).then(|| (missing, format!("missing field `{field}`"))),
                    path,
                )
            }
            Kind::Unknown(field, _) => {
                // Stamped at the key itself, or at the map holding it.
                let at = if path == field || path.ends_with(&format!(".{field}")) {
                    path
                } else {
                    join(&path, &field)
                };
                (Some((at.clone(), message)), at)
            }
            Kind::Other(_) => (Some((path.clone(), message)), path),
        };
        if let Some(p) = report {
            problems.push(p);
        }
        if remove.is_empty() || !prune(&mut root.node, &remove) {
            return Some(Found {
                problems,
                rest: None,
            });
        }
        set_aside.push(remove);
    }
    Some(Found {
        problems,
        rest: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        count: u32,
        items: Vec<Item>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        host: String,
        #[serde(default)]
        port: Option<u16>,
    }

    #[test]
    fn finds_every_problem_each_under_its_own_path() {
        let src = "name: 123\ncount: lots\nitems:\n  - host: a\n    port: 99999\n  - port: 80\n  - host: c\n    colour: red\n";
        let found = every_problem::<Doc>(src, &["name", "count", "items"]).unwrap();
        let paths: Vec<&str> = found.problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            ["count", "items[0].port", "items[1].host", "items[2].colour"],
            "{:?}",
            found.problems
        );
        assert!(
            found.problems[1].1.contains("99999"),
            "{:?}",
            found.problems
        );
    }

    #[test]
    fn a_missing_section_is_named_with_every_other() {
        let found = every_problem::<Doc>("count: 1\n", &["name", "count", "items"]).unwrap();
        let paths: Vec<&str> = found.problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["name", "items"]);
    }
}
