//! Deploying the rendered VCL snippets to a Fastly service: plan first, then apply.
//!
//! [`FastlyDeployer::plan`] reads the active version's snippets and diffs the renderer's own
//! (named `multicdn-...`) against the rendering; nothing is written. Snippets with other names
//! are someone else's: they are listed as unmanaged and left alone.
//!
//! [`FastlyDeployer::apply`] needs `confirm = true`, then: checks that the active version is
//! still the one planned against, clones it (`PUT /service/{sid}/version/{v}/clone`), deletes,
//! updates and creates snippets on the draft (form-urlencoded, `dynamic=0`), validates it
//! (`GET .../validate`) and activates it (`PUT .../activate`) only when validation says `ok`.
//! A failed validation leaves the active version untouched and reports Fastly's messages; the
//! draft stays for inspection.
//!
//! [`FastlyDeployer::drift`] reads the active version back and reports every snippet that
//! differs from the rendering.
//!
//! ## Console edits
//! Every snippet multicdn writes ends with a comment line `# multicdn-digest: <16 hex>`, the
//! [`fingerprint`] of its type, priority and content as written. A `multicdn-...` snippet whose
//! digest line is missing or no longer matches was changed outside multicdn (on the console,
//! say): the plan lists it in [`FastlyDeployPlan::console_edits`] when it would overwrite or
//! delete it, and [`FastlyDeployer::apply_with`] refuses such a plan unless forced. The digest
//! line is stripped on reading, so plans and drift compare the VCL alone.

use std::collections::BTreeMap;
use std::fmt;

use multicdn_core::policy::ProviderSpec;
use multicdn_core::{Error, ProviderId, ProviderKind, Secret};
use reqwest::{Method, RequestBuilder};
use serde_json::Value;

use super::wire;
use crate::http::{Answer, HttpSettings, VendorHttp, encode_segment, secret_header};
use crate::render::fastly_vcl::{FastlyRendering, SNIPPET_PREFIX, Snippet, SnippetKind};
use crate::render::plan::{
    Change, ChangeOp, ConsoleEdit, DeployError, DeployOptions, Drift, PlannedCall, console_edits,
    diff, fingerprint,
};
use crate::spec::required_field;

/// Deploys rendered snippets to one Fastly service.
#[derive(Clone)]
pub struct FastlyDeployer {
    id: ProviderId,
    service_id: String,
    token: Secret,
    /// `Fastly-Key`, built once and marked sensitive.
    key: http::HeaderValue,
    http: VendorHttp,
}

impl fmt::Debug for FastlyDeployer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastlyDeployer")
            .field("id", &self.id)
            .field("service_id", &self.service_id)
            .field("token", &self.token)
            .field("http", &self.http)
            .finish()
    }
}

/// What a deploy would change on Fastly, computed from the active version before anything is
/// written.
#[derive(Debug, Clone, PartialEq)]
pub struct FastlyDeployPlan {
    /// The provider.
    pub provider: ProviderId,
    /// The service.
    pub service_id: String,
    /// The version the plan was made against (the active one, or the latest when none is).
    pub base_version: u32,
    /// Whether `base_version` is active.
    pub base_active: bool,
    /// The service's newest version: the clone will be the next one.
    pub latest_version: u32,
    /// Snippet additions, updates and removals, in the order they will be sent.
    pub changes: Vec<Change<Snippet>>,
    /// Snippets on the service that the renderer does not own (left alone).
    pub unmanaged: Vec<String>,
    /// Snippets the changes would overwrite or delete that multicdn did not write as they are.
    pub console_edits: Vec<ConsoleEdit>,
}

impl FastlyDeployPlan {
    /// True when the service already runs the rendering.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Every write applying the plan sends, in order, as it will be sent (the draft's number
    /// is the one Fastly gives the clone: the next after [`Self::latest_version`]). Empty
    /// when there is nothing to change.
    pub fn calls(&self) -> Vec<PlannedCall> {
        if self.changes.is_empty() {
            return Vec::new();
        }
        let sid = &self.service_id;
        let draft = self.latest_version.saturating_add(1);
        let mut out = vec![PlannedCall {
            method: "PUT",
            path: format!("/service/{sid}/version/{}/clone", self.base_version),
            body: String::new(),
        }];
        for w in snippet_writes(sid, draft, &self.changes) {
            out.push(PlannedCall {
                method: verb(&w.method),
                path: w.path,
                body: w.summary,
            });
        }
        out.push(PlannedCall {
            method: "GET",
            path: format!("/service/{sid}/version/{draft}/validate"),
            body: String::new(),
        });
        out.push(PlannedCall {
            method: "PUT",
            path: format!("/service/{sid}/version/{draft}/activate"),
            body: String::new(),
        });
        out
    }
}

/// One snippet write on the draft.
struct SnippetWrite {
    method: Method,
    path: String,
    form: Option<Vec<(&'static str, String)>>,
    summary: String,
}

/// The name of a write's method, as a plan shows it.
fn verb(m: &Method) -> &'static str {
    match *m {
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        _ => "GET",
    }
}

/// The snippet writes of `changes` on draft version `draft`, in order.
fn snippet_writes(sid: &str, draft: u32, changes: &[Change<Snippet>]) -> Vec<SnippetWrite> {
    let snippets = format!("/service/{sid}/version/{draft}/snippet");
    let mut out = Vec::new();
    for change in changes {
        let named = format!("{snippets}/{}", encode_segment(&change.key));
        match (change.op, &change.rendered) {
            (ChangeOp::Remove, _) => out.push(SnippetWrite {
                method: Method::DELETE,
                path: named,
                form: None,
                summary: String::new(),
            }),
            (ChangeOp::Add, Some(s)) => {
                let mut form = fields(s);
                form.insert(0, ("name", s.name.clone()));
                form.push(("dynamic", "0".to_owned()));
                out.push(SnippetWrite {
                    method: Method::POST,
                    path: snippets.clone(),
                    form: Some(form),
                    summary: format!("form: name={}, {}, dynamic=0", s.name, field_summary(s)),
                });
            }
            (ChangeOp::Update, Some(s)) => out.push(SnippetWrite {
                method: Method::PUT,
                path: named,
                form: Some(fields(s)),
                summary: format!("form: {}", field_summary(s)),
            }),
            // A plan's additions and updates always carry the rendered snippet.
            (_, None) => {}
        }
    }
    out
}

fn field_summary(s: &Snippet) -> String {
    format!(
        "type={}, priority={}, content={} line(s) + digest",
        s.kind,
        s.priority,
        s.content.lines().count()
    )
}

impl fmt::Display for FastlyDeployPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let base = if self.base_active {
            format!("active version {}", self.base_version)
        } else {
            format!("version {} (none is active)", self.base_version)
        };
        if self.changes.is_empty() {
            write!(
                f,
                "{} service {}: {base} already matches the rendering",
                self.provider, self.service_id
            )?;
        } else {
            write!(
                f,
                "{} service {}: clone {base}, {} snippet change(s), validate, activate",
                self.provider,
                self.service_id,
                self.changes.len()
            )?;
            for c in &self.changes {
                write!(f, "\n  {c}")?;
            }
        }
        if !self.unmanaged.is_empty() {
            write!(
                f,
                "\n  unmanaged (left alone): {}",
                self.unmanaged.join(", ")
            )?;
        }
        for e in &self.console_edits {
            write!(f, "\n  console edit, overwritten only when forced: {e}")?;
        }
        Ok(())
    }
}

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FastlyDeployed {
    /// Nothing to change; no version was made.
    Unchanged {
        /// The version that already runs the rendering.
        version: u32,
    },
    /// A new version was validated and activated.
    Activated {
        /// The version it was cloned from.
        previous: u32,
        /// The version now active.
        version: u32,
    },
}

/// The snippets of one version, split into the renderer's own and everybody else's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeployedSnippets {
    /// `multicdn-...` snippets.
    pub managed: Vec<Snippet>,
    /// Other snippets' names.
    pub unmanaged: Vec<String>,
    /// `multicdn-...` snippets multicdn did not write as they are (no digest line, or one that
    /// no longer matches), with what was found.
    pub unverified: BTreeMap<String, String>,
}

/// The digest line multicdn appends to every snippet it writes.
const DIGEST_LINE: &str = "# multicdn-digest: ";

fn snippet_fingerprint(kind: SnippetKind, priority: u32, content: &str) -> String {
    fingerprint(&[kind.as_str(), &priority.to_string(), content])
}

/// The snippet as multicdn writes it: its content followed by the digest line.
pub fn as_written(s: &Snippet) -> Snippet {
    let sep = if s.content.is_empty() || s.content.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    let digest = snippet_fingerprint(s.kind, s.priority, &s.content);
    Snippet {
        content: format!("{}{sep}{DIGEST_LINE}{digest}\n", s.content),
        ..s.clone()
    }
}

/// A deployed snippet's content without multicdn's digest line, and `None` when the digest
/// matches (multicdn wrote it as it is) or what was found instead.
fn read_written(kind: SnippetKind, priority: u32, content: &str) -> (String, Option<String>) {
    let at = if content.starts_with(DIGEST_LINE) {
        Some(0)
    } else {
        content.rfind(&format!("\n{DIGEST_LINE}")).map(|i| i + 1)
    };
    let Some(at) = at else {
        return (
            content.to_owned(),
            Some("not written by multicdn (it has no multicdn-digest line)".to_owned()),
        );
    };
    let body = &content[..at];
    let digest = content[at + DIGEST_LINE.len()..].trim();
    for candidate in [body, body.strip_suffix('\n').unwrap_or(body)] {
        if snippet_fingerprint(kind, priority, candidate) == digest {
            return (candidate.to_owned(), None);
        }
    }
    (
        body.to_owned(),
        Some("edited since multicdn wrote it (its multicdn-digest no longer matches)".to_owned()),
    )
}

impl FastlyDeployer {
    /// A deployer for service `service_id` at `base_url` (HTTPS, or HTTP on loopback).
    pub fn new(
        id: ProviderId,
        service_id: impl Into<String>,
        token: Secret,
        base_url: &str,
        settings: HttpSettings,
    ) -> Result<FastlyDeployer, Error> {
        let service_id = service_id.into();
        super::check_service_id(&id, &service_id)?;
        let key = secret_header(&id, token.expose())?;
        let http = VendorHttp::new(id.clone(), base_url, settings)?;
        Ok(FastlyDeployer {
            id,
            service_id,
            token,
            key,
            http,
        })
    }

    /// A deployer from the policy's provider entry (`kind: fastly`, `service_id`);
    /// `base_url` overrides Fastly's API address.
    pub fn from_spec(
        id: ProviderId,
        spec: &ProviderSpec,
        token: Secret,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<FastlyDeployer, Error> {
        let service_id = required_field(
            &id,
            spec,
            ProviderKind::Fastly,
            "service_id",
            spec.service_id.as_ref(),
            "to deploy to Fastly",
        )?;
        FastlyDeployer::new(
            id,
            service_id,
            token,
            base_url.unwrap_or(super::DEFAULT_BASE_URL),
            settings,
        )
    }

    /// The provider.
    pub fn provider(&self) -> &ProviderId {
        &self.id
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, path)
            .header("Fastly-Key", self.key.clone())
            .header("Accept", "application/json")
    }

    fn unexpected(&self, label: &str, message: String) -> Error {
        Error::UnexpectedResponse {
            provider: self.id.clone(),
            request: label.to_owned(),
            message,
        }
    }

    /// Reads a 2xx answer as JSON, anything else as the error it means.
    fn read_json(&self, label: &str, answer: &Answer) -> Result<Value, Error> {
        if !answer.status.is_success() {
            return Err(self.http.status_error(
                label,
                answer,
                None,
                wire::error_message(&answer.body),
            ));
        }
        serde_json::from_slice(&answer.body).map_err(|e| {
            let start: String = answer.text().chars().take(200).collect();
            self.unexpected(label, format!("expected JSON ({e}); got {start:?}"))
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        form: Option<Vec<(&str, String)>>,
    ) -> Result<Value, Error> {
        let label = format!("{method} {path}");
        let body = form.map(|fields| {
            let mut s = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in &fields {
                s.append_pair(k, v);
            }
            s.finish()
        });
        let sent = self
            .http
            .send(
                &label,
                || {
                    let r = self.request(method.clone(), path);
                    match &body {
                        Some(b) => r
                            .header("Content-Type", "application/x-www-form-urlencoded")
                            .body(b.clone()),
                        None => r,
                    }
                },
                |answer| self.read_json(&label, answer),
            )
            .await?;
        Ok(sent.value)
    }

    /// Fastly's verdict on a draft: `{"status":"ok"}` or `{"status":"error","msg",...}`, read
    /// from a 2xx answer or from a 400 that carries a verdict (a plain error otherwise).
    async fn validation(&self, path: &str) -> Result<Value, Error> {
        let label = format!("GET {path}");
        let sent = self
            .http
            .send(
                &label,
                || self.request(Method::GET, path),
                |answer| {
                    if answer.status.as_u16() == 400
                        && let Ok(v) = serde_json::from_slice::<Value>(&answer.body)
                        && v.get("status").and_then(Value::as_str).is_some()
                    {
                        return Ok(v);
                    }
                    self.read_json(&label, answer)
                },
            )
            .await?;
        Ok(sent.value)
    }

    /// The active version, or `None` with the latest version when none is active.
    pub async fn versions(&self) -> Result<(Option<u32>, u32), Error> {
        let path = format!("/service/{}/version", self.service_id);
        let label = format!("GET {path}");
        let value = self.call(Method::GET, &path, None).await?;
        let Some(list) = value.as_array() else {
            return Err(self.unexpected(&label, "expected a list of versions".into()));
        };
        let mut active = None;
        let mut latest = None;
        for v in list {
            let Some(number) = v.get("number").and_then(as_u32) else {
                return Err(self.unexpected(&label, format!("a version without a number: {v}")));
            };
            latest = latest.max(Some(number));
            if v.get("active").and_then(Value::as_bool) == Some(true) {
                active = Some(number);
            }
        }
        let Some(latest) = latest else {
            return Err(self.unexpected(&label, "the service has no versions".into()));
        };
        Ok((active, latest))
    }

    /// The snippets of `version`.
    pub async fn snippets(&self, version: u32) -> Result<DeployedSnippets, Error> {
        let path = format!("/service/{}/version/{version}/snippet", self.service_id);
        let label = format!("GET {path}");
        let value = self.call(Method::GET, &path, None).await?;
        let Some(list) = value.as_array() else {
            return Err(self.unexpected(&label, "expected a list of snippets".into()));
        };
        let mut out = DeployedSnippets::default();
        for s in list {
            let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() {
                return Err(self.unexpected(&label, format!("a snippet without a name: {s}")));
            }
            if !name.starts_with(SNIPPET_PREFIX) {
                out.unmanaged.push(name.to_owned());
                continue;
            }
            let kind_s = s.get("type").and_then(Value::as_str).unwrap_or_default();
            let Some(kind) = SnippetKind::parse(kind_s) else {
                return Err(self.unexpected(
                    &label,
                    format!("snippet {name:?} has type {kind_s:?}, not a Fastly snippet type"),
                ));
            };
            let Some(priority) = s.get("priority").and_then(as_u32) else {
                return Err(
                    self.unexpected(&label, format!("snippet {name:?} has no readable priority"))
                );
            };
            let raw = s.get("content").and_then(Value::as_str).unwrap_or_default();
            let (content, unverified) = read_written(kind, priority, raw);
            if let Some(what) = unverified {
                out.unverified.insert(name.to_owned(), what);
            }
            out.managed.push(Snippet {
                name: name.to_owned(),
                kind,
                priority,
                content,
            });
        }
        out.managed.sort_by(|a, b| a.name.cmp(&b.name));
        out.unmanaged.sort();
        Ok(out)
    }

    /// What deploying `rendering` would change; reads only.
    pub async fn plan(&self, rendering: &FastlyRendering) -> Result<FastlyDeployPlan, Error> {
        let (active, latest) = self.versions().await?;
        let base_version = active.unwrap_or(latest);
        let deployed = self.snippets(base_version).await?;
        let changes = diff(&keyed(&deployed.managed), &keyed(&rendering.snippets));
        Ok(FastlyDeployPlan {
            provider: self.id.clone(),
            service_id: self.service_id.clone(),
            base_version,
            base_active: active.is_some(),
            latest_version: latest,
            console_edits: console_edits(&changes, &deployed.unverified),
            changes,
            unmanaged: deployed.unmanaged,
        })
    }

    /// Applies `plan`; `confirm` must be `true` or nothing is sent. A plan with
    /// [console edits](FastlyDeployPlan::console_edits) is refused; see [`Self::apply_with`].
    pub async fn apply(
        &self,
        plan: &FastlyDeployPlan,
        confirm: bool,
    ) -> Result<FastlyDeployed, DeployError> {
        self.apply_with(plan, DeployOptions::default().confirm(confirm))
            .await
    }

    /// Applies `plan` when `options.confirm`; a plan that would overwrite console edits only
    /// with `options.force`. Refusals send nothing.
    pub async fn apply_with(
        &self,
        plan: &FastlyDeployPlan,
        options: DeployOptions,
    ) -> Result<FastlyDeployed, DeployError> {
        if let Some(refusal) = options.refusal(&self.id, &plan.console_edits) {
            return Err(refusal);
        }
        let (active, latest) = self.versions().await?;
        let now = active.unwrap_or(latest);
        if now != plan.base_version || active.is_some() != plan.base_active {
            return Err(DeployError::PlanOutdated {
                provider: self.id.clone(),
                what: format!(
                    "planned against version {}, the service is now at {}version {now}",
                    plan.base_version,
                    if active.is_some() { "active " } else { "" }
                ),
            });
        }
        if plan.changes.is_empty() {
            return Ok(FastlyDeployed::Unchanged { version: now });
        }
        let sid = &self.service_id;
        let clone_path = format!("/service/{sid}/version/{now}/clone");
        let cloned = self.call(Method::PUT, &clone_path, None).await?;
        let Some(draft) = cloned.get("number").and_then(as_u32) else {
            return Err(self
                .unexpected(
                    &format!("PUT {clone_path}"),
                    format!("the clone has no version number: {cloned}"),
                )
                .into());
        };
        let partial = |source: Error| DeployError::Partial {
            done: format!(
                "draft version {draft} cloned from version {now}; version {now} stays active unless the failed call was the activation"
            ),
            source,
        };
        if let Some(c) = plan
            .changes
            .iter()
            .find(|c| c.op != ChangeOp::Remove && c.rendered.is_none())
        {
            return Err(DeployError::PlanOutdated {
                provider: self.id.clone(),
                what: format!("the change to {} has no rendered snippet", c.key),
            });
        }
        for w in snippet_writes(sid, draft, &plan.changes) {
            self.call(w.method, &w.path, w.form)
                .await
                .map_err(partial)?;
        }
        let validate = format!("/service/{sid}/version/{draft}/validate");
        let verdict = self.validation(&validate).await.map_err(partial)?;
        match verdict.get("status").and_then(Value::as_str) {
            Some("ok") => {}
            Some(_) => {
                return Err(DeployError::ValidationFailed {
                    provider: self.id.clone(),
                    version: draft,
                    message: verdict
                        .get("msg")
                        .and_then(Value::as_str)
                        .unwrap_or("validation failed")
                        .to_owned(),
                    errors: messages(verdict.get("errors")),
                });
            }
            None => {
                return Err(self
                    .unexpected(
                        &format!("GET {validate}"),
                        format!("expected {{\"status\":\"ok\"|\"error\"}}; got {verdict}"),
                    )
                    .into());
            }
        }
        let activate = format!("/service/{sid}/version/{draft}/activate");
        self.call(Method::PUT, &activate, None)
            .await
            .map_err(partial)?;
        Ok(FastlyDeployed::Activated {
            previous: now,
            version: draft,
        })
    }

    /// Every `multicdn-...` snippet of the active version that differs from `rendering`.
    pub async fn drift(&self, rendering: &FastlyRendering) -> Result<Drift<Snippet>, Error> {
        let (active, latest) = self.versions().await?;
        let version = active.unwrap_or(latest);
        let deployed = self.snippets(version).await?;
        Ok(Drift {
            provider: self.id.clone(),
            source: match active {
                Some(v) => format!("service {}, active version {v}", self.service_id),
                None => format!(
                    "service {}, version {version}, none active",
                    self.service_id
                ),
            },
            differences: diff(&keyed(&deployed.managed), &keyed(&rendering.snippets)),
            unmanaged: deployed.unmanaged,
        })
    }
}

fn keyed(snippets: &[Snippet]) -> Vec<(String, Snippet)> {
    snippets
        .iter()
        .map(|s| (s.name.clone(), s.clone()))
        .collect()
}

/// The form fields of a snippet write (without `name`): the content as written, digest line
/// included.
fn fields(s: &Snippet) -> Vec<(&'static str, String)> {
    vec![
        ("type", s.kind.as_str().to_owned()),
        ("content", as_written(s).content),
        ("priority", s.priority.to_string()),
    ]
}

/// Fastly writes numbers as numbers or as strings (`"priority": "100"`).
fn as_u32(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Validation errors as text: strings, or objects with a message.
fn messages(v: Option<&Value>) -> Vec<String> {
    let Some(Value::Array(list)) = v else {
        return Vec::new();
    };
    list.iter()
        .map(|e| match e {
            Value::String(s) => s.clone(),
            other => other
                .get("message")
                .or_else(|| other.get("msg"))
                .and_then(Value::as_str)
                .map_or_else(|| other.to_string(), str::to_owned),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_from_numbers_and_strings() {
        assert_eq!(as_u32(&serde_json::json!(10)), Some(10));
        assert_eq!(as_u32(&serde_json::json!("100")), Some(100));
        assert_eq!(as_u32(&serde_json::json!("x")), None);
        assert_eq!(as_u32(&serde_json::json!(-1)), None);
    }

    fn snippet(content: &str) -> Snippet {
        Snippet {
            name: "multicdn-recv-routes".into(),
            kind: SnippetKind::Recv,
            priority: 10,
            content: content.into(),
        }
    }

    #[test]
    fn a_snippet_as_written_reads_back_as_rendered_and_verified() {
        for content in ["return(pass);\n", "return(pass);", ""] {
            let s = snippet(content);
            let w = as_written(&s);
            assert!(w.content.contains(DIGEST_LINE), "{:?}", w.content);
            assert_eq!(
                read_written(s.kind, s.priority, &w.content),
                (content.to_owned(), None)
            );
        }
    }

    #[test]
    fn an_edited_or_unmarked_snippet_is_not_verified() {
        let w = as_written(&snippet("return(pass);\n"));
        let edited = w.content.replace("pass", "lookup");
        let (content, found) = read_written(SnippetKind::Recv, 10, &edited);
        assert_eq!(content, "return(lookup);\n");
        assert!(found.unwrap().contains("edited since multicdn wrote it"));
        // The same VCL at another priority was edited too.
        assert!(read_written(SnippetKind::Recv, 20, &w.content).1.is_some());
        let (content, found) = read_written(SnippetKind::Recv, 10, "return(pass);\n");
        assert_eq!(content, "return(pass);\n");
        assert!(found.unwrap().contains("no multicdn-digest line"));
    }

    #[test]
    fn validation_errors_are_read_as_text() {
        let v = serde_json::json!(["Syntax error: Unexpected '}'", {"message": "at line 3"}]);
        assert_eq!(
            messages(Some(&v)),
            vec!["Syntax error: Unexpected '}'", "at line 3"]
        );
    }
}
