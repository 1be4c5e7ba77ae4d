//! Manifest tagging: an origin's HLS multivariant playlist or DASH MPD rewritten so players
//! steer between CDNs.
//!
//! Content steering only works when the manifest names the steering server and offers every
//! pathway. [`tag_hls`] and [`tag_dash`] do that from a [`TagOptions`] (the server URI, the
//! default pathway and one [`Pathway`] per CDN with the base URL it serves the same paths from):
//!
//! - HLS (RFC 8216bis, Content Steering): `#EXT-X-CONTENT-STEERING:SERVER-URI=...,PATHWAY-ID=...`
//!   after the header; every `#EXT-X-STREAM-INF` and `#EXT-X-I-FRAME-STREAM-INF` once per
//!   pathway with its `PATHWAY-ID` and its URI on that pathway's host; every `#EXT-X-MEDIA`
//!   rendition once per pathway in a group of its own (`GROUP-ID="audio-cdn-b"`), and each
//!   pathway's variants pointing at their own pathway's groups.
//! - DASH (ISO/IEC 23009-1 5th edition, DASH-IF content steering): one MPD-level
//!   `<BaseURL serviceLocation="...">` per pathway and `<ContentSteering
//!   defaultServiceLocation="..." queryBeforeStart="true">`, everything else kept byte for byte.
//!
//! Tagging a tagged manifest again gives the same manifest: the copies of the first pathway the
//! input names are taken as the content, the others dropped, and the content is tagged afresh.
//! Nothing here panics on any input; what is wrong is a [`TagError`] with the line.
//!
//! ```
//! use multicdn_steering::video::tagging::{Pathway, TagOptions, tag_hls};
//!
//! let options = TagOptions {
//!     server_uri: "https://steer.example.com/hls.json".into(),
//!     default_pathway: "cdn-a".into(),
//!     pathways: vec![
//!         Pathway { id: "cdn-a".into(), base: "https://a.example.net/".parse()? },
//!         Pathway { id: "cdn-b".into(), base: "https://b.example.net/".parse()? },
//!     ],
//! };
//! let playlist = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1280000\nlow/index.m3u8\n";
//! let tagged = tag_hls(playlist, &"https://origin.example.com/vod/master.m3u8".parse()?, &options)?;
//! assert_eq!(tagged, "#EXTM3U\n\
//!     #EXT-X-CONTENT-STEERING:SERVER-URI=\"https://steer.example.com/hls.json\",PATHWAY-ID=\"cdn-a\"\n\
//!     #EXT-X-STREAM-INF:BANDWIDTH=1280000,PATHWAY-ID=\"cdn-a\"\n\
//!     https://a.example.net/vod/low/index.m3u8\n\
//!     #EXT-X-STREAM-INF:BANDWIDTH=1280000,PATHWAY-ID=\"cdn-b\"\n\
//!     https://b.example.net/vod/low/index.m3u8\n");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeSet;

use multicdn_core::Policy;
use quick_xml::events::{BytesEnd, BytesStart, BytesText, Event};
use quick_xml::{Reader, Writer};
use url::Url;

use super::manifest::is_valid_pathway_id;

/// One pathway: a CDN serving the same paths as the origin under its own base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pathway {
    /// The pathway id (`PATHWAY-ID` in HLS, `serviceLocation` in DASH): 1 to 64 of
    /// `A-Z a-z 0-9 . - _`.
    pub id: String,
    /// Where this CDN serves the manifest's paths (`https://a.example.net/`). A path prefix
    /// (`https://a.example.net/vod/`) is kept in front of every path.
    pub base: Url,
}

/// What a manifest is tagged with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagOptions {
    /// The steering server's URI as the player should request it: absolute, or relative to the
    /// manifest.
    pub server_uri: String,
    /// The pathway players use until the steering server has answered.
    pub default_pathway: String,
    /// The pathways, in the order their copies appear in the manifest.
    pub pathways: Vec<Pathway>,
}

/// Why a manifest could not be tagged: bad options, or a manifest that is not what it should
/// be (with the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TagError {
    /// The options list no pathway.
    #[error("no pathway to tag the manifest with: list at least one")]
    NoPathway,
    /// A pathway id has characters the specifications forbid.
    #[error("pathway id {0:?} is not valid: use 1 to 64 of A-Z a-z 0-9 . - _")]
    PathwayId(String),
    /// Two pathways share an id.
    #[error("pathway id {0:?} appears twice")]
    DuplicatePathway(String),
    /// The default pathway is not one of the pathways.
    #[error("the default pathway {default:?} is not one of the pathways ({known})")]
    UnknownDefault {
        /// The default asked for.
        default: String,
        /// The pathway ids, comma-separated.
        known: String,
    },
    /// A pathway's base URL cannot carry the manifest's paths.
    #[error("pathway {id:?}: base {base} {reason}")]
    PathwayBase {
        /// The pathway.
        id: String,
        /// Its base URL.
        base: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The steering server URI cannot be written into a manifest.
    #[error("steering server URI {uri:?} {reason}")]
    ServerUri {
        /// The URI.
        uri: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Every provider of the policy is a standby: none can be the default pathway.
    #[error(
        "every provider of the policy is a standby, so none can be the default pathway: \
         mark one `standby: false`"
    )]
    NoDefaultProvider,
    /// A provider's edge host does not make a base URL.
    #[error("provider {provider:?}: edge_host {edge_host:?} does not make a base URL: {message}")]
    EdgeHost {
        /// The provider.
        provider: String,
        /// Its edge host.
        edge_host: String,
        /// What the URL parser said.
        message: String,
    },
    /// The manifest's own URL cannot be a base for relative URIs.
    #[error("manifest URL {url} cannot resolve relative URIs: {message}")]
    ManifestUrl {
        /// The URL.
        url: String,
        /// What the URL parser said.
        message: String,
    },
    /// The text is not an HLS playlist.
    #[error("line {line}: not an HLS playlist: {reason}")]
    NotPlaylist {
        /// The line (1-based).
        line: usize,
        /// What was found instead.
        reason: String,
    },
    /// The playlist is a media playlist: steering is declared in the multivariant playlist.
    #[error(
        "line {line}: {tag} is a media playlist tag; tag the multivariant playlist (the one \
         with #EXT-X-STREAM-INF) instead"
    )]
    MediaPlaylist {
        /// The line (1-based).
        line: usize,
        /// The media playlist tag found.
        tag: String,
    },
    /// The playlist has no variant.
    #[error("the playlist has no #EXT-X-STREAM-INF, so it is not a multivariant playlist")]
    NoVariant,
    /// A tag's attribute list cannot be read.
    #[error("line {line}: {tag}: {message}")]
    Attributes {
        /// The line (1-based).
        line: usize,
        /// The tag.
        tag: String,
        /// What is wrong.
        message: String,
    },
    /// An `#EXT-X-STREAM-INF` is not followed by its URI line.
    #[error("line {line}: #EXT-X-STREAM-INF is not followed by a URI line")]
    MissingUri {
        /// The line of the tag (1-based).
        line: usize,
    },
    /// A URI in the playlist does not resolve to a URL that can be moved to another host.
    #[error("line {line}: URI {uri:?} cannot be moved to a pathway: {message}")]
    Uri {
        /// The line (1-based).
        line: usize,
        /// The URI as written.
        uri: String,
        /// Why.
        message: String,
    },
    /// The MPD is not well-formed XML.
    #[error("line {line}: malformed XML: {message}")]
    Xml {
        /// The line (1-based).
        line: usize,
        /// What the XML reader said.
        message: String,
    },
    /// The document has no root element.
    #[error("the document has no root element, so it is not an MPD")]
    NoRoot,
    /// The root element is not `MPD`.
    #[error("line {line}: the root element is <{found}>, not <MPD>")]
    NotMpd {
        /// The line (1-based).
        line: usize,
        /// The root element's name.
        found: String,
    },
    /// The MPD-level `BaseURL` cannot be resolved.
    #[error("line {line}: BaseURL {text:?} cannot be moved to a pathway: {message}")]
    BaseUrl {
        /// The line (1-based).
        line: usize,
        /// The BaseURL's text.
        text: String,
        /// Why.
        message: String,
    },
}

impl TagOptions {
    /// One pathway per provider of the policy (id: the provider id, base:
    /// `https://{edge_host}/`), in id order; the default is the first provider that is not a
    /// standby.
    pub fn from_policy(
        policy: &Policy,
        server_uri: impl Into<String>,
    ) -> Result<TagOptions, TagError> {
        let mut pathways = Vec::with_capacity(policy.providers.len());
        let mut default = None;
        for (id, spec) in &policy.providers {
            let base = Url::parse(&format!("https://{}/", spec.video_host())).map_err(|e| {
                TagError::EdgeHost {
                    provider: id.as_str().to_string(),
                    edge_host: spec.video_host().to_owned(),
                    message: e.to_string(),
                }
            })?;
            if default.is_none() && !spec.standby {
                default = Some(id.as_str().to_string());
            }
            pathways.push(Pathway {
                id: id.as_str().to_string(),
                base,
            });
        }
        if pathways.is_empty() {
            return Err(TagError::NoPathway);
        }
        let options = TagOptions {
            server_uri: server_uri.into(),
            default_pathway: default.ok_or(TagError::NoDefaultProvider)?,
            pathways,
        };
        options.validate()?;
        Ok(options)
    }

    /// Checks what tagging needs: at least one pathway, valid and unique ids, the default among
    /// them, hierarchical `http(s)` bases without query or fragment, and a server URI that can
    /// be quoted.
    pub fn validate(&self) -> Result<(), TagError> {
        if self.pathways.is_empty() {
            return Err(TagError::NoPathway);
        }
        let mut seen = BTreeSet::new();
        for p in &self.pathways {
            if !is_valid_pathway_id(&p.id) {
                return Err(TagError::PathwayId(p.id.clone()));
            }
            if !seen.insert(p.id.as_str()) {
                return Err(TagError::DuplicatePathway(p.id.clone()));
            }
            let reason = if !matches!(p.base.scheme(), "http" | "https") {
                Some("is not http or https")
            } else if p.base.host_str().is_none_or(str::is_empty) {
                Some("has no host")
            } else if p.base.query().is_some() {
                Some("has a query; the manifest's own queries go there")
            } else if p.base.fragment().is_some() {
                Some("has a fragment")
            } else if !p.base.username().is_empty() || p.base.password().is_some() {
                Some("carries credentials")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(TagError::PathwayBase {
                    id: p.id.clone(),
                    base: p.base.to_string(),
                    reason,
                });
            }
        }
        if !seen.contains(self.default_pathway.as_str()) {
            return Err(TagError::UnknownDefault {
                default: self.default_pathway.clone(),
                known: seen.into_iter().collect::<Vec<_>>().join(", "),
            });
        }
        let reason = if self.server_uri.trim().is_empty() {
            Some("is empty")
        } else if self.server_uri.contains('"') {
            Some("contains a double quote")
        } else if self.server_uri.contains(['\n', '\r']) {
            Some("contains a line break")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(TagError::ServerUri {
                uri: self.server_uri.clone(),
                reason,
            });
        }
        Ok(())
    }

    fn pathway(&self, id: &str) -> Option<&Pathway> {
        self.pathways.iter().find(|p| p.id == id)
    }
}

// ---- URLs ----

/// `url`'s path and query on `base`'s scheme, host and port, under `base`'s path prefix. When
/// `url` is already on `source` (the pathway an already tagged manifest was on), `source`'s
/// prefix is taken off first, so tagging twice does not stack prefixes.
fn rebase(url: &Url, source: Option<&Url>, base: &Url) -> Url {
    // A URL with a host but no path (`foo://host`) is at the root.
    let mut path = match url.path() {
        "" => "/",
        path => path,
    };
    if let Some(source) = source.filter(|s| same_origin(url, s)) {
        let prefix = source.path().trim_end_matches('/');
        if let Some(rest) = path.strip_prefix(prefix)
            && rest.starts_with('/')
        {
            path = rest;
        }
    }
    let mut out = base.clone();
    let prefix = base.path().trim_end_matches('/');
    out.set_path(&format!("{prefix}{path}"));
    out.set_query(url.query());
    out.set_fragment(url.fragment());
    out
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// `uri` resolved against the manifest's URL; it must be hierarchical to be moved to a host.
fn resolve(manifest_url: &Url, uri: &str) -> Result<Url, String> {
    let url = manifest_url.join(uri).map_err(|e| e.to_string())?;
    if url.cannot_be_a_base() || url.host_str().is_none() {
        return Err(format!("{url} has no host to replace"));
    }
    Ok(url)
}

fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(60).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

// ---- HLS ----

const STEERING_TAG: &str = "#EXT-X-CONTENT-STEERING";
const STREAM_INF: &str = "#EXT-X-STREAM-INF";
const IFRAME_STREAM_INF: &str = "#EXT-X-I-FRAME-STREAM-INF";
const MEDIA: &str = "#EXT-X-MEDIA";
/// The pathway of a variant without `PATHWAY-ID` (RFC 8216bis).
const DEFAULT_PATHWAY_ID: &str = ".";
/// Tags only a media playlist has.
const MEDIA_PLAYLIST_TAGS: &[&str] = &[
    "#EXTINF",
    "#EXT-X-TARGETDURATION",
    "#EXT-X-MEDIA-SEQUENCE",
    "#EXT-X-DISCONTINUITY-SEQUENCE",
    "#EXT-X-ENDLIST",
    "#EXT-X-PLAYLIST-TYPE",
    "#EXT-X-I-FRAMES-ONLY",
    "#EXT-X-BYTERANGE",
    "#EXT-X-DISCONTINUITY",
    "#EXT-X-PROGRAM-DATE-TIME",
    "#EXT-X-MAP",
    "#EXT-X-KEY",
    "#EXT-X-PART",
    "#EXT-X-PART-INF",
    "#EXT-X-SERVER-CONTROL",
    "#EXT-X-SKIP",
    "#EXT-X-PRELOAD-HINT",
    "#EXT-X-RENDITION-REPORT",
    "#EXT-X-GAP",
    "#EXT-X-BITRATE",
];
/// Variant attributes naming rendition groups (`CLOSED-CAPTIONS` may also be `NONE`).
const GROUP_REFERENCES: &[&str] = &["AUDIO", "VIDEO", "SUBTITLES", "CLOSED-CAPTIONS"];

/// An attribute list (`BANDWIDTH=1280000,CODECS="avc1.4d401f,mp4a.40.2"`): names with their
/// values as written (quoted strings keep their quotes), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attributes(Vec<(String, String)>);

impl Attributes {
    fn parse(text: &str) -> Result<Attributes, String> {
        let bytes = text.as_bytes();
        let mut list: Vec<(String, String)> = Vec::new();
        if text.is_empty() {
            return Ok(Attributes(list));
        }
        let mut i = 0;
        loop {
            let start = i;
            while i < bytes.len() && bytes[i] != b'=' && bytes[i] != b',' {
                i += 1;
            }
            let name = &text[start..i];
            if name.is_empty() {
                return Err(format!("an attribute has no name at column {}", start + 1));
            }
            if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(format!(
                    "attribute name {:?} is not A-Z, 0-9 and -",
                    excerpt(name)
                ));
            }
            if i >= bytes.len() || bytes[i] != b'=' {
                return Err(format!("attribute {name} has no value"));
            }
            i += 1;
            let value_start = i;
            if bytes.get(i) == Some(&b'"') {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += 1;
                }
                if i >= bytes.len() {
                    return Err(format!("the quoted value of {name} is not closed"));
                }
                i += 1;
                if i < bytes.len() && bytes[i] != b',' {
                    return Err(format!("text after the quoted value of {name}"));
                }
            } else {
                while i < bytes.len() && bytes[i] != b',' {
                    if bytes[i] == b'"' {
                        return Err(format!(
                            "a double quote inside the unquoted value of {name}"
                        ));
                    }
                    i += 1;
                }
                if i == value_start {
                    return Err(format!("attribute {name} has an empty value"));
                }
            }
            if list.iter().any(|(n, _)| n == name) {
                return Err(format!("attribute {name} appears twice"));
            }
            list.push((name.to_string(), text[value_start..i].to_string()));
            if i >= bytes.len() {
                return Ok(Attributes(list));
            }
            i += 1;
            if i >= bytes.len() {
                return Err("the attribute list ends with a comma".into());
            }
        }
    }

    fn raw(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of a quoted-string attribute, without its quotes.
    fn quoted(&self, name: &str) -> Option<&str> {
        self.raw(name)
            .and_then(|v| v.strip_prefix('"'))
            .and_then(|v| v.strip_suffix('"'))
    }

    fn set(&mut self, name: &str, raw: String) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = raw,
            None => self.0.push((name.to_string(), raw)),
        }
    }

    fn set_quoted(&mut self, name: &str, value: &str) {
        self.set(name, format!("\"{value}\""));
    }

    fn render(&self, tag: &str) -> String {
        let mut out = String::from(tag);
        for (i, (name, value)) in self.0.iter().enumerate() {
            out.push(if i == 0 { ':' } else { ',' });
            out.push_str(name);
            out.push('=');
            out.push_str(value);
        }
        out
    }
}

/// One line of the playlist, or a variant with its URI line.
#[derive(Debug)]
enum Item<'a> {
    /// Passed through unchanged.
    Line(&'a str),
    /// `#EXT-X-STREAM-INF` and its URI; `between` are comments and blank lines between them.
    Variant {
        attrs: Attributes,
        between: Vec<&'a str>,
        uri: Url,
    },
    /// `#EXT-X-I-FRAME-STREAM-INF`.
    IFrame { attrs: Attributes, uri: Url },
    /// `#EXT-X-MEDIA`; `uri` when it has one.
    Media {
        attrs: Attributes,
        group: String,
        uri: Option<Url>,
    },
}

/// The tag name of a line (`#EXT-X-STREAM-INF` of `#EXT-X-STREAM-INF:BANDWIDTH=1`).
fn tag_name(line: &str) -> &str {
    line.split_once(':').map_or(line, |(tag, _)| tag)
}

fn parse_attributes(line: usize, tag: &str, text: &str) -> Result<Attributes, TagError> {
    Attributes::parse(text).map_err(|message| TagError::Attributes {
        line,
        tag: tag.to_string(),
        message,
    })
}

fn quoted_uri(
    line: usize,
    tag: &str,
    attrs: &Attributes,
    manifest_url: &Url,
) -> Result<Option<Url>, TagError> {
    let Some(raw) = attrs.raw("URI") else {
        return Ok(None);
    };
    let Some(uri) = attrs.quoted("URI") else {
        return Err(TagError::Attributes {
            line,
            tag: tag.to_string(),
            message: format!("URI {:?} is not a quoted string", excerpt(raw)),
        });
    };
    resolve(manifest_url, uri)
        .map(Some)
        .map_err(|message| TagError::Uri {
            line,
            uri: uri.to_string(),
            message,
        })
}

/// Tags an HLS multivariant playlist for content steering (see the [module](self) docs).
pub fn tag_hls(
    playlist: &str,
    manifest_url: &Url,
    options: &TagOptions,
) -> Result<String, TagError> {
    options.validate()?;
    // The first line says how lines end; only a CRLF playlist has a `\r` taken off each line,
    // so what is written reads back the same.
    let crlf = playlist
        .split('\n')
        .next()
        .is_some_and(|first| first.ends_with('\r') && playlist.contains('\n'));
    let newline = if crlf { "\r\n" } else { "\n" };
    let mut lines: Vec<&str> = playlist
        .split('\n')
        .map(|l| {
            if crlf {
                l.strip_suffix('\r').unwrap_or(l)
            } else {
                l
            }
        })
        .collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    match lines.first() {
        None => {
            return Err(TagError::NotPlaylist {
                line: 1,
                reason: "the text is empty".into(),
            });
        }
        Some(first) if first.trim_end() != "#EXTM3U" => {
            return Err(TagError::NotPlaylist {
                line: 1,
                reason: format!("it starts with {:?}, not #EXTM3U", excerpt(first)),
            });
        }
        Some(_) => {}
    }

    let mut items = Vec::with_capacity(lines.len());
    let mut i = 1;
    while i < lines.len() {
        let line = lines[i];
        let number = i + 1;
        let tag = tag_name(line);
        let attrs_text = line.get(tag.len() + 1..).unwrap_or("");
        i += 1;
        match tag {
            STREAM_INF => {
                let attrs = parse_attributes(number, tag, attrs_text)?;
                let mut between = Vec::new();
                let uri_line = loop {
                    let Some(next) = lines.get(i) else {
                        return Err(TagError::MissingUri { line: number });
                    };
                    i += 1;
                    if next.trim().is_empty()
                        || (next.starts_with('#') && !next.starts_with("#EXT"))
                    {
                        between.push(*next);
                    } else if next.starts_with('#') {
                        return Err(TagError::MissingUri { line: number });
                    } else {
                        break next.trim();
                    }
                };
                let uri = resolve(manifest_url, uri_line).map_err(|message| TagError::Uri {
                    line: i,
                    uri: uri_line.to_string(),
                    message,
                })?;
                items.push(Item::Variant {
                    attrs,
                    between,
                    uri,
                });
            }
            IFRAME_STREAM_INF => {
                let attrs = parse_attributes(number, tag, attrs_text)?;
                let uri = quoted_uri(number, tag, &attrs, manifest_url)?.ok_or_else(|| {
                    TagError::Attributes {
                        line: number,
                        tag: tag.to_string(),
                        message: "it has no URI".into(),
                    }
                })?;
                items.push(Item::IFrame { attrs, uri });
            }
            MEDIA => {
                let attrs = parse_attributes(number, tag, attrs_text)?;
                let group = attrs
                    .quoted("GROUP-ID")
                    .filter(|g| !g.is_empty())
                    .ok_or_else(|| TagError::Attributes {
                        line: number,
                        tag: tag.to_string(),
                        message: "it has no quoted, non-empty GROUP-ID".into(),
                    })?
                    .to_string();
                let uri = quoted_uri(number, tag, &attrs, manifest_url)?;
                items.push(Item::Media { attrs, group, uri });
            }
            STEERING_TAG => {}
            _ if MEDIA_PLAYLIST_TAGS.contains(&tag) => {
                return Err(TagError::MediaPlaylist {
                    line: number,
                    tag: tag.to_string(),
                });
            }
            _ => items.push(Item::Line(line)),
        }
    }

    let pathway_of = |attrs: &Attributes| -> String {
        attrs
            .quoted("PATHWAY-ID")
            .or_else(|| attrs.raw("PATHWAY-ID"))
            .unwrap_or(DEFAULT_PATHWAY_ID)
            .to_string()
    };
    let Some(source) = items.iter().find_map(|item| match item {
        Item::Variant { attrs, .. } => Some(pathway_of(attrs)),
        _ => None,
    }) else {
        return Err(TagError::NoVariant);
    };
    // An already tagged playlist: keep the source pathway's copies, as they were before.
    let tagged: BTreeSet<String> = items
        .iter()
        .filter_map(|item| match item {
            Item::Variant { attrs, .. } | Item::IFrame { attrs, .. } => Some(pathway_of(attrs)),
            _ => None,
        })
        .filter(|p| p != DEFAULT_PATHWAY_ID)
        .collect();
    let source_base = options.pathway(&source).map(|p| &p.base);
    items.retain_mut(|item| match item {
        Item::Variant { attrs, .. } | Item::IFrame { attrs, .. } => pathway_of(attrs) == source,
        Item::Media { group, .. } => {
            let suffix_of = tagged
                .iter()
                .filter(|p| group.len() > p.len() + 1 && group.ends_with(&format!("-{p}")))
                .max_by_key(|p| p.len());
            match suffix_of {
                Some(p) if *p == source => {
                    group.truncate(group.len() - p.len() - 1);
                    true
                }
                Some(_) => false,
                None => true,
            }
        }
        Item::Line(_) => true,
    });
    let groups: BTreeSet<String> = items
        .iter()
        .filter_map(|item| match item {
            Item::Media { group, .. } => Some(group.clone()),
            _ => None,
        })
        .collect();
    // A variant's group reference, as the group it means. In a tagged playlist a variant names
    // `<group>-<pathway>`: that is stripped first, even when a group named like the suffixed
    // one exists too; in an untagged one the exact name wins. A reference that names no group
    // stays as it is.
    let mut suffixes: Vec<&str> = tagged
        .iter()
        .map(String::as_str)
        .chain(options.pathways.iter().map(|p| p.id.as_str()))
        .filter(|p| *p != DEFAULT_PATHWAY_ID)
        .collect();
    suffixes.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let stripped = |value: &str| -> Option<String> {
        suffixes.iter().find_map(|p| {
            value
                .strip_suffix(*p)
                .and_then(|g| g.strip_suffix('-'))
                .filter(|g| groups.contains(*g))
                .map(str::to_string)
        })
    };
    let original_group = |value: &str| -> Option<String> {
        let exact = || Some(value.to_string()).filter(|v| groups.contains(v));
        if tagged.is_empty() {
            exact().or_else(|| stripped(value))
        } else {
            stripped(value).or_else(exact)
        }
    };
    let for_pathway = |attrs: &Attributes, pathway: &Pathway| -> Attributes {
        let mut attrs = attrs.clone();
        attrs.set_quoted("PATHWAY-ID", &pathway.id);
        for name in GROUP_REFERENCES {
            if let Some(group) = attrs.quoted(name).and_then(original_group) {
                attrs.set_quoted(name, &format!("{group}-{}", pathway.id));
            }
        }
        attrs
    };

    let header = 1 + items
        .iter()
        .take_while(|item| matches!(item, Item::Line(l) if tag_name(l) == "#EXT-X-VERSION"))
        .count();
    let mut out: Vec<String> = Vec::with_capacity(lines.len() * (options.pathways.len() + 1));
    out.push(lines[0].to_string());
    for (index, item) in items.iter().enumerate() {
        if index + 1 == header {
            out.push(format!(
                "{STEERING_TAG}:SERVER-URI=\"{}\",PATHWAY-ID=\"{}\"",
                options.server_uri, options.default_pathway
            ));
        }
        match item {
            Item::Line(line) => out.push((*line).to_string()),
            Item::Variant {
                attrs,
                between,
                uri,
            } => {
                out.extend(between.iter().map(|l| (*l).to_string()));
                for pathway in &options.pathways {
                    out.push(for_pathway(attrs, pathway).render(STREAM_INF));
                    out.push(rebase(uri, source_base, &pathway.base).to_string());
                }
            }
            Item::IFrame { attrs, uri } => {
                for pathway in &options.pathways {
                    let mut attrs = for_pathway(attrs, pathway);
                    attrs.set_quoted("URI", rebase(uri, source_base, &pathway.base).as_str());
                    out.push(attrs.render(IFRAME_STREAM_INF));
                }
            }
            Item::Media { attrs, group, uri } => {
                for pathway in &options.pathways {
                    let mut attrs = attrs.clone();
                    attrs.set_quoted("GROUP-ID", &format!("{group}-{}", pathway.id));
                    if let Some(uri) = uri {
                        attrs.set_quoted("URI", rebase(uri, source_base, &pathway.base).as_str());
                    }
                    out.push(attrs.render(MEDIA));
                }
            }
        }
    }
    if header > items.len() {
        out.push(format!(
            "{STEERING_TAG}:SERVER-URI=\"{}\",PATHWAY-ID=\"{}\"",
            options.server_uri, options.default_pathway
        ));
    }
    let mut text = out.join(newline);
    text.push_str(newline);
    Ok(text)
}

// ---- DASH ----

/// The 1-based line of a byte offset.
fn line_of(text: &str, offset: u64) -> usize {
    let end = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(text.len());
    1 + text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

fn offset(position: u64, text: &str) -> usize {
    usize::try_from(position)
        .unwrap_or(usize::MAX)
        .min(text.len())
}

/// What an MPD child is, for tagging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Child {
    ProgramInformation,
    BaseUrl,
    ContentSteering,
    Other,
}

/// The first MPD-level `BaseURL`: its text and `serviceLocation`.
#[derive(Debug, Default)]
struct FirstBase {
    text: String,
    service_location: Option<String>,
    line: usize,
}

fn xml_error(mpd: &str, position: u64, message: impl std::fmt::Display) -> TagError {
    TagError::Xml {
        line: line_of(mpd, position),
        message: message.to_string(),
    }
}

fn outside_root(line: usize, what: &str) -> TagError {
    TagError::Xml {
        line,
        message: format!("{what} outside the root element"),
    }
}

/// Tags a DASH MPD for content steering (see the [module](self) docs).
pub fn tag_dash(mpd: &str, manifest_url: &Url, options: &TagOptions) -> Result<String, TagError> {
    options.validate()?;
    let mut reader = Reader::from_str(mpd);
    let mut depth = 0usize;
    // The MPD's prefix (`mpd:` or empty) and whether `<MPD/>` is empty.
    let mut prefix: Option<String> = None;
    let mut root_empty_end = None;
    let mut root_closed = false;
    let mut scan = Scan::default();
    let mut separator: Option<String> = None;
    let mut child: Option<(Child, usize)> = None;

    loop {
        let before = offset(reader.buffer_position(), mpd);
        let event = reader
            .read_event()
            .map_err(|e| xml_error(mpd, reader.error_position(), e))?;
        let after = offset(reader.buffer_position(), mpd);
        let at = || line_of(mpd, before as u64);
        let is_empty = matches!(event, Event::Empty(_));
        match event {
            Event::Start(e) | Event::Empty(e) => {
                let name = e.name().as_ref().to_string();
                // Attributes are read lazily: check every element's, so a malformed or
                // repeated attribute anywhere is refused like any other malformed XML.
                for attr in e.attributes() {
                    attr.map_err(|err| xml_error(mpd, before as u64, err))?;
                }
                if root_closed {
                    return Err(TagError::Xml {
                        line: at(),
                        message: format!("<{name}> after the root element"),
                    });
                }
                if depth == 0 {
                    if e.local_name().as_ref() != "MPD" {
                        return Err(TagError::NotMpd {
                            line: at(),
                            found: excerpt(&name),
                        });
                    }
                    prefix = Some(name.strip_suffix("MPD").unwrap_or("").to_string());
                    scan.insert_at = after;
                    if is_empty {
                        root_empty_end = Some(after);
                        root_closed = true;
                    } else {
                        depth = 1;
                    }
                    continue;
                }
                if depth == 1 {
                    let p = prefix.as_deref().unwrap_or("");
                    let kind = match name.strip_prefix(p) {
                        Some("ProgramInformation") => Child::ProgramInformation,
                        Some("BaseURL") => Child::BaseUrl,
                        Some("ContentSteering") => Child::ContentSteering,
                        _ => Child::Other,
                    };
                    if kind == Child::BaseUrl && scan.first_base.is_none() {
                        let mut service_location = None;
                        for attr in e.attributes() {
                            let attr = attr.map_err(|err| xml_error(mpd, before as u64, err))?;
                            if attr.key.as_ref() == "serviceLocation" {
                                service_location = Some(
                                    attr.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                                        .map_err(|err| xml_error(mpd, before as u64, err))?
                                        .into_owned(),
                                );
                            }
                        }
                        scan.reading_base = Some(FirstBase {
                            text: String::new(),
                            service_location,
                            line: at(),
                        });
                    }
                    if separator.is_none() {
                        separator = Some(String::new());
                    }
                    if is_empty {
                        scan.end_child(mpd, kind, before, after);
                    } else {
                        child = Some((kind, before));
                        depth += 1;
                    }
                    continue;
                }
                if !is_empty {
                    depth += 1;
                }
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    root_closed = true;
                } else if depth == 1
                    && let Some((kind, start)) = child.take()
                {
                    scan.end_child(mpd, kind, start, after);
                }
            }
            Event::Text(text) => {
                let content = text.xml10_content();
                if depth == 0 && !xml_blank(&content) {
                    let leading = text.len() - text.trim_start().len();
                    return Err(TagError::Xml {
                        line: line_of(mpd, (before + leading) as u64),
                        message: format!(
                            "text {:?} outside the root element",
                            excerpt(content.trim())
                        ),
                    });
                }
                if depth == 1 && separator.is_none() && xml_blank(&content) {
                    separator = Some(line_separator(&content));
                }
                if let Some(base) = scan.reading_base.as_mut() {
                    base.text.push_str(&content);
                }
            }
            Event::CData(cdata) => {
                if depth == 0 {
                    return Err(outside_root(at(), "CDATA"));
                }
                if let Some(base) = scan.reading_base.as_mut() {
                    base.text.push_str(&cdata.xml10_content());
                }
            }
            Event::GeneralRef(reference) => {
                if depth == 0 {
                    return Err(outside_root(at(), "an entity reference"));
                }
                if let Some(base) = scan.reading_base.as_mut() {
                    let resolved = match reference
                        .resolve_char_ref()
                        .map_err(|e| xml_error(mpd, before as u64, e))?
                    {
                        Some(c) => c.to_string(),
                        None => quick_xml::escape::resolve_predefined_entity(&reference)
                            .ok_or_else(|| TagError::Xml {
                                line: at(),
                                message: format!("unknown entity &{};", excerpt(&reference)),
                            })?
                            .to_string(),
                    };
                    base.text.push_str(&resolved);
                }
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
    let Some(prefix) = prefix else {
        return Err(TagError::NoRoot);
    };
    if !root_closed {
        return Err(TagError::Xml {
            line: line_of(mpd, mpd.len() as u64),
            message: format!("the document ends before </{prefix}MPD>"),
        });
    }

    let root = match &scan.first_base {
        Some(base) => {
            let text = base.text.trim();
            resolve(manifest_url, text).map_err(|message| TagError::BaseUrl {
                line: base.line,
                text: excerpt(text),
                message,
            })?
        }
        None => manifest_url
            .join("./")
            .ok()
            .filter(|u| !u.cannot_be_a_base() && u.host_str().is_some())
            .ok_or_else(|| TagError::ManifestUrl {
                url: manifest_url.to_string(),
                message: "it has no directory on a host".into(),
            })?,
    };
    let source = scan
        .first_base
        .as_ref()
        .and_then(|b| b.service_location.as_deref())
        .and_then(|id| options.pathway(id))
        .map(|p| &p.base);

    // The whitespace before the first element replaced, else before the first child: the
    // elements replaced go with the whitespace before them, so a separator read anywhere
    // else could change from one tagging to the next.
    let separator = match scan.first_gap {
        Some((from, start)) => line_separator(mpd.get(from..start).unwrap_or_default()),
        None => separator.unwrap_or_default(),
    };
    let insertion = dash_elements(&prefix, &separator, &root, source, options)?;
    let mut edits: Vec<(usize, usize, String)> = scan
        .removals
        .into_iter()
        .map(|(start, end)| (start, end, String::new()))
        .collect();
    match root_empty_end {
        Some(end) => {
            let start = end.saturating_sub(2);
            if mpd.get(start..end) != Some("/>") {
                return Err(xml_error(
                    mpd,
                    start as u64,
                    "the empty root does not end in />",
                ));
            }
            edits.push((start, end, format!(">{insertion}</{prefix}MPD>")));
        }
        None => edits.push((scan.insert_at, scan.insert_at, insertion)),
    }
    edits.sort_by_key(|(start, end, _)| (*start, *end));

    let mut out = String::with_capacity(mpd.len() + 256);
    let mut cursor = 0;
    for (start, end, replacement) in edits {
        if start < cursor {
            continue;
        }
        out.push_str(mpd.get(cursor..start).ok_or_else(|| {
            xml_error(
                mpd,
                start as u64,
                "an edit does not fall on a character boundary",
            )
        })?);
        out.push_str(&replacement);
        cursor = end;
    }
    out.push_str(mpd.get(cursor..).unwrap_or(""));
    Ok(out)
}

/// What the scan of the MPD's children found.
#[derive(Debug, Default)]
struct Scan {
    /// Where the new elements go: after the MPD start tag and any `ProgramInformation`.
    insert_at: usize,
    /// A child other than `ProgramInformation`, `BaseURL` or `ContentSteering` was seen.
    seen_other: bool,
    /// The MPD-level `BaseURL` and `ContentSteering` elements, with the whitespace before.
    removals: Vec<(usize, usize)>,
    /// The whitespace before the first of them: the separator the new elements get, so that
    /// tagging a tagged MPD finds the separator it was tagged with.
    first_gap: Option<(usize, usize)>,
    /// The first MPD-level `BaseURL`, once it has ended.
    first_base: Option<FirstBase>,
    /// The first MPD-level `BaseURL` while its text is being read.
    reading_base: Option<FirstBase>,
}

impl Scan {
    /// An MPD child ended at `end`: remember where to insert, what to remove (with the
    /// whitespace before it) and the first `BaseURL`.
    fn end_child(&mut self, mpd: &str, kind: Child, start: usize, end: usize) {
        match kind {
            Child::ProgramInformation if !self.seen_other => self.insert_at = end,
            Child::ProgramInformation => {}
            Child::BaseUrl | Child::ContentSteering => {
                let bytes = mpd.as_bytes();
                let mut from = start.min(bytes.len());
                while from > 0 && matches!(bytes[from - 1], b' ' | b'\t' | b'\r' | b'\n') {
                    from -= 1;
                }
                self.removals.push((from, end));
                self.first_gap.get_or_insert((from, start));
                if kind == Child::BaseUrl
                    && self.first_base.is_none()
                    && let Some(base) = self.reading_base.take()
                {
                    self.first_base = Some(base);
                }
            }
            Child::Other => self.seen_other = true,
        }
    }
}

/// XML's whitespace (space, tab, line feed, carriage return): the only characters the
/// removal of an old element takes with it, so the only ones an indentation may be made of
/// (a vertical tab, whitespace to `str::trim`, would be left behind and pile up).
fn xml_blank(text: &str) -> bool {
    text.bytes()
        .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// What goes before each inserted element: the last line break and indentation of the
/// whitespace before the MPD's first child.
fn line_separator(whitespace: &str) -> String {
    match whitespace.rfind('\n') {
        Some(at) => {
            let from = if at > 0 && whitespace.as_bytes()[at - 1] == b'\r' {
                at - 1
            } else {
                at
            };
            whitespace[from..].to_string()
        }
        None => whitespace.to_string(),
    }
}

/// The `BaseURL` per pathway and the `ContentSteering` element, written with quick-xml (text
/// and attributes escaped).
fn dash_elements(
    prefix: &str,
    separator: &str,
    root: &Url,
    source: Option<&Url>,
    options: &TagOptions,
) -> Result<String, TagError> {
    let base_url = format!("{prefix}BaseURL");
    let steering = format!("{prefix}ContentSteering");
    let mut writer = Writer::new(Vec::new());
    let io = |e: std::io::Error| TagError::Xml {
        line: 0,
        message: format!("writing the inserted elements: {e}"),
    };
    for pathway in &options.pathways {
        writer.get_mut().extend_from_slice(separator.as_bytes());
        let url = rebase(root, source, &pathway.base);
        writer
            .write_event(Event::Start(
                BytesStart::new(base_url.as_str())
                    .with_attributes([("serviceLocation", pathway.id.as_str())]),
            ))
            .map_err(io)?;
        writer
            .write_event(Event::Text(BytesText::new(url.as_str())))
            .map_err(io)?;
        writer
            .write_event(Event::End(BytesEnd::new(base_url.as_str())))
            .map_err(io)?;
    }
    writer.get_mut().extend_from_slice(separator.as_bytes());
    writer
        .write_event(Event::Start(
            BytesStart::new(steering.as_str()).with_attributes([
                ("defaultServiceLocation", options.default_pathway.as_str()),
                ("queryBeforeStart", "true"),
            ]),
        ))
        .map_err(io)?;
    writer
        .write_event(Event::Text(BytesText::new(options.server_uri.as_str())))
        .map_err(io)?;
    writer
        .write_event(Event::End(BytesEnd::new(steering.as_str())))
        .map_err(io)?;
    String::from_utf8(writer.into_inner()).map_err(|e| TagError::Xml {
        line: 0,
        message: format!("the inserted elements are not UTF-8: {e}"),
    })
}

#[cfg(test)]
mod tests;
