//! What a route's path pattern matches, said without a regular expression where that is exact.
//!
//! Cloudflare's `matches` operator needs a Business or Enterprise plan, but the patterns policy
//! files use are mostly prefixes (`^/checkout`), suffixes (`\.(js|css)$`) and alternations of
//! those. [`analyse`] turns such a pattern into [`PathMatch`] atoms that render as
//! `starts_with`, `ends_with`, `eq` and `contains`, and leaves everything else as
//! [`PathMatch::Regex`]. The translation is exact: a path matches the atoms if and only if it
//! matches the regular expression (a property test checks this against the `regex` crate).
//!
//! The same analysis proves two routes disjoint, so the renderers can leave out exclusions
//! that cannot change which route matches first.

/// The most literal strings one alternative may expand to (`\.(a|b|c)$` expands to three).
const MAX_EXPANSION: usize = 64;

/// What a path pattern matches.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathMatch {
    /// The path starts with this (`^/checkout`).
    Prefix(String),
    /// The path ends with this (`\.css$`).
    Suffix(String),
    /// The path is exactly this (`^/robots\.txt$`).
    Exact(String),
    /// The path contains this (`/api/`).
    Contains(String),
    /// Any of these atoms (never nested, never containing [`PathMatch::Regex`]).
    AnyOf(Vec<PathMatch>),
    /// Not expressible without a regular expression: the pattern as written.
    Regex(String),
}

impl PathMatch {
    /// The atoms: itself, or the alternatives of an [`PathMatch::AnyOf`].
    pub fn atoms(&self) -> &[PathMatch] {
        match self {
            PathMatch::AnyOf(all) => all,
            one => std::slice::from_ref(one),
        }
    }

    /// True when this needs a regular expression.
    pub fn is_regex(&self) -> bool {
        matches!(self, PathMatch::Regex(_))
    }

    /// Whether `path` matches, for the literal forms (`None` for [`PathMatch::Regex`]).
    pub fn matches(&self, path: &str) -> Option<bool> {
        Some(match self {
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Suffix(s) => path.ends_with(s.as_str()),
            PathMatch::Exact(e) => path == e,
            PathMatch::Contains(c) => path.contains(c.as_str()),
            PathMatch::AnyOf(all) => {
                let mut any = false;
                for atom in all {
                    any |= atom.matches(path)?;
                }
                any
            }
            PathMatch::Regex(_) => return None,
        })
    }

    /// True only when no path can match both (conservative: `false` when unsure).
    pub fn disjoint(&self, other: &PathMatch) -> bool {
        let (Some(mine), Some(theirs)) = (self.bounding_atoms(), other.bounding_atoms()) else {
            return false;
        };
        mine.iter()
            .all(|a| theirs.iter().all(|b| atoms_disjoint(a, b)))
    }

    /// Literal atoms matching at least what this matches: the atoms themselves, or for a
    /// regex anchored on a literal prefix (`^/products/[0-9]+`), that prefix.
    fn bounding_atoms(&self) -> Option<Vec<PathMatch>> {
        match self {
            PathMatch::Regex(r) => regex_prefix(r).map(|p| vec![PathMatch::Prefix(p)]),
            other => Some(other.atoms().to_vec()),
        }
    }
}

/// The literal every match of `pattern` starts with, when it is anchored (`^/p/[0-9]+` gives
/// `/p/`); `None` for unanchored patterns and top-level alternations.
fn regex_prefix(pattern: &str) -> Option<String> {
    if split_top_level(pattern)?.len() != 1 {
        return None;
    }
    let mut chars = pattern.strip_prefix('^')?.chars().peekable();
    let mut prefix = String::new();
    while let Some(c) = chars.next() {
        let lit = match c {
            '\\' => match chars.next().and_then(escaped_literal) {
                Some(l) => l,
                None => break,
            },
            c if is_meta(c) => break,
            c => c,
        };
        match chars.peek() {
            // The last literal is optional or repeated: it may be missing.
            Some('?' | '*' | '{') => break,
            Some('+') => {
                prefix.push(lit);
                break;
            }
            _ => prefix.push(lit),
        }
    }
    Some(prefix)
}

fn atoms_disjoint(a: &PathMatch, b: &PathMatch) -> bool {
    use PathMatch::{Contains, Exact, Prefix, Suffix};
    match (a, b) {
        (Prefix(x), Prefix(y)) => !x.starts_with(y.as_str()) && !y.starts_with(x.as_str()),
        (Suffix(x), Suffix(y)) => !x.ends_with(y.as_str()) && !y.ends_with(x.as_str()),
        (Exact(x), Exact(y)) => x != y,
        (Exact(x), Prefix(y)) | (Prefix(y), Exact(x)) => !x.starts_with(y.as_str()),
        (Exact(x), Suffix(y)) | (Suffix(y), Exact(x)) => !x.ends_with(y.as_str()),
        (Exact(x), Contains(y)) | (Contains(y), Exact(x)) => !x.contains(y.as_str()),
        _ => false,
    }
}

/// Analyses a route pattern (a regular expression over the path).
pub fn analyse(pattern: &str) -> PathMatch {
    let Some(alternatives) = split_top_level(pattern) else {
        return PathMatch::Regex(pattern.to_owned());
    };
    let mut atoms = Vec::new();
    for alt in alternatives {
        match literal_alternative(alt) {
            Some(mut more) => atoms.append(&mut more),
            None => return PathMatch::Regex(pattern.to_owned()),
        }
        if atoms.len() > MAX_EXPANSION {
            return PathMatch::Regex(pattern.to_owned());
        }
    }
    if atoms.len() == 1 {
        atoms
            .pop()
            .unwrap_or_else(|| PathMatch::Regex(pattern.to_owned()))
    } else {
        PathMatch::AnyOf(atoms)
    }
}

/// Splits on `|` outside groups and classes; `None` on unbalanced groups or a trailing `\`.
fn split_top_level(pattern: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut in_class = false;
    let mut start = 0;
    let mut chars = pattern.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next()?;
            }
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '(' if !in_class => depth += 1,
            ')' if !in_class => depth = depth.checked_sub(1)?,
            '|' if !in_class && depth == 0 => {
                parts.push(&pattern[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 || in_class {
        return None;
    }
    parts.push(&pattern[start..]);
    Some(parts)
}

/// One piece of an alternative: a literal, or a group of literal choices.
enum Piece {
    Literal(String),
    Choice(Vec<String>),
}

fn literal_alternative(alt: &str) -> Option<Vec<PathMatch>> {
    let (anchored_start, rest) = match alt.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, alt),
    };
    let (anchored_end, body) = match rest.strip_suffix('$') {
        // `\$` is a literal dollar, not an anchor.
        Some(body) if !ends_with_odd_backslashes(body) => (true, body),
        _ => (false, rest),
    };
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => literal.push(escaped_literal(chars.next()?)?),
            '(' => {
                if !literal.is_empty() {
                    pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                }
                let mut inner = String::new();
                loop {
                    match chars.next()? {
                        ')' => break,
                        '(' => return None,
                        '\\' => {
                            inner.push('\\');
                            inner.push(chars.next()?);
                        }
                        other => inner.push(other),
                    }
                }
                let inner = inner.strip_prefix("?:").unwrap_or(&inner).to_owned();
                if inner.starts_with('?') {
                    return None;
                }
                let choices = split_top_level(&inner)?
                    .into_iter()
                    .map(pure_literal)
                    .collect::<Option<Vec<_>>>()?;
                // `(a|b)?`, `(a)*`: quantified groups are not literal.
                if matches!(chars.peek(), Some('?' | '*' | '+' | '{')) {
                    return None;
                }
                pieces.push(Piece::Choice(choices));
            }
            c if is_meta(c) => return None,
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    let mut expanded = vec![String::new()];
    for piece in pieces {
        expanded = match piece {
            Piece::Literal(l) => expanded.into_iter().map(|e| e + &l).collect(),
            Piece::Choice(choices) => {
                if expanded.len().saturating_mul(choices.len()) > MAX_EXPANSION {
                    return None;
                }
                expanded
                    .iter()
                    .flat_map(|e| choices.iter().map(move |c| format!("{e}{c}")))
                    .collect()
            }
        };
    }
    Some(
        expanded
            .into_iter()
            .map(|s| match (anchored_start, anchored_end) {
                (true, true) => PathMatch::Exact(s),
                (true, false) => PathMatch::Prefix(s),
                (false, true) => PathMatch::Suffix(s),
                (false, false) => PathMatch::Contains(s),
            })
            .collect(),
    )
}

/// A literal with escapes and no metacharacters, as the string it matches.
fn pure_literal(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(escaped_literal(chars.next()?)?),
            c if is_meta(c) => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// `\.` is a dot; `\d`, `\b`, `\p` and friends are classes or assertions, not literals.
fn escaped_literal(c: char) -> Option<char> {
    // `\<` and `\>` are word boundaries in Rust's regex dialect (Cloudflare's).
    (c.is_ascii_punctuation() && c != '<' && c != '>').then_some(c)
}

fn is_meta(c: char) -> bool {
    matches!(
        c,
        '.' | '^' | '$' | '*' | '+' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '\\'
    ) || c.is_whitespace() && c != ' '
}

fn ends_with_odd_backslashes(s: &str) -> bool {
    s.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> PathMatch {
        PathMatch::Prefix(s.into())
    }

    #[test]
    fn prefixes_suffixes_and_alternations_become_literals() {
        assert_eq!(analyse("^/checkout"), p("/checkout"));
        assert_eq!(
            analyse("^/customer|^/cart|^/admin"),
            PathMatch::AnyOf(vec![p("/customer"), p("/cart"), p("/admin")])
        );
        assert_eq!(
            analyse("\\.(js|css|woff2)$"),
            PathMatch::AnyOf(vec![
                PathMatch::Suffix(".js".into()),
                PathMatch::Suffix(".css".into()),
                PathMatch::Suffix(".woff2".into()),
            ])
        );
        assert_eq!(
            analyse("^/robots\\.txt$"),
            PathMatch::Exact("/robots.txt".into())
        );
        assert_eq!(analyse("/api/"), PathMatch::Contains("/api/".into()));
    }

    #[test]
    fn anything_else_stays_a_regex() {
        for pattern in [
            "^/p/[0-9]+$",
            "^/a.b",
            "(?i)^/checkout",
            "^/x(a|b)?",
            "^/\\d",
            "^/(a|(b))",
            "^/x$|y*",
        ] {
            assert!(analyse(pattern).is_regex(), "{pattern}");
        }
    }

    #[test]
    fn disjointness_is_proved_only_for_literals_that_cannot_overlap() {
        assert!(analyse("^/checkout").disjoint(&analyse("^/customer|^/cart")));
        assert!(!analyse("^/cart").disjoint(&analyse("^/cart/items")));
        assert!(!analyse("^/products/").disjoint(&analyse("\\.js$")));
        assert!(analyse("\\.js$").disjoint(&analyse("\\.css$")));
        assert!(!analyse("^/a[0-9]").disjoint(&analyse("^/a")));
        assert!(analyse("^/products/[0-9]+$").disjoint(&analyse("^/cart|^/admin")));
        assert!(!analyse("^/ab?c[0-9]").disjoint(&analyse("^/a")));
        assert!(!analyse("/x[0-9]").disjoint(&analyse("^/b")));
    }

    proptest! {
        #[test]
        fn literal_translation_agrees_with_the_regex(
            pattern in "(\\^)?(/[a-c]{0,2}|\\\\\\.[a-c]{1,2})(\\((a|b|c)(\\|(a|b|c)){0,2}\\))?(\\$)?(\\|\\^/[abc]{1,2})?",
            path in "/[abc./]{0,6}",
        ) {
            let re = regex::Regex::new(&pattern).unwrap();
            let analysed = analyse(&pattern);
            if let Some(got) = analysed.matches(&path) {
                prop_assert_eq!(got, re.is_match(&path), "{} on {}: {:?}", pattern, path, analysed);
            }
        }

        #[test]
        fn disjoint_routes_never_both_match(
            a in "\\^?/[ab]{0,2}\\$?",
            b in "\\^?/[ab]{0,2}\\$?",
            path in "/[ab]{0,3}",
        ) {
            let (ma, mb) = (analyse(&a), analyse(&b));
            if ma.disjoint(&mb) {
                prop_assert!(!(ma.matches(&path) == Some(true) && mb.matches(&path) == Some(true)));
            }
        }

        #[test]
        fn a_regex_is_disjoint_only_from_what_its_matches_can_never_be(
            a in "\\^/[ab]{0,2}(\\[ab\\]|b?|a\\*|\\.)[ab]?\\$?",
            b in "\\^/[ab]{0,2}",
            path in "/[ab]{0,4}",
        ) {
            let (ma, mb) = (analyse(&a), analyse(&b));
            let re = regex::Regex::new(&a).unwrap();
            if ma.disjoint(&mb) {
                prop_assert!(!(re.is_match(&path) && mb.matches(&path) == Some(true)), "{} vs {} on {}", a, b, path);
            }
        }
    }
}
