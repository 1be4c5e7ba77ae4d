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

use std::fmt;

use multicdn_core::policy::ProviderSpec;
use multicdn_core::{Error, ProviderId, ProviderKind, Secret};
use reqwest::{Method, RequestBuilder};
use serde_json::Value;

use super::wire;
use crate::http::{Answer, HttpSettings, VendorHttp, encode_segment, secret_header};
use crate::render::fastly_vcl::{FastlyRendering, SNIPPET_PREFIX, Snippet, SnippetKind};
use crate::render::plan::{Change, ChangeOp, DeployError, Drift, diff};
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
    /// Snippet additions, updates and removals, in the order they will be sent.
    pub changes: Vec<Change<Snippet>>,
    /// Snippets on the service that the renderer does not own (left alone).
    pub unmanaged: Vec<String>,
}

impl FastlyDeployPlan {
    /// True when the service already runs the rendering.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
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
            out.managed.push(Snippet {
                name: name.to_owned(),
                kind,
                priority,
                content: s
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
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
        Ok(FastlyDeployPlan {
            provider: self.id.clone(),
            service_id: self.service_id.clone(),
            base_version,
            base_active: active.is_some(),
            changes: diff(&keyed(&deployed.managed), &keyed(&rendering.snippets)),
            unmanaged: deployed.unmanaged,
        })
    }

    /// Applies `plan`; `confirm` must be `true` or nothing is sent.
    pub async fn apply(
        &self,
        plan: &FastlyDeployPlan,
        confirm: bool,
    ) -> Result<FastlyDeployed, DeployError> {
        if !confirm {
            return Err(DeployError::NotConfirmed {
                provider: self.id.clone(),
            });
        }
        if plan.provider != self.id || plan.service_id != self.service_id {
            return Err(DeployError::PlanOutdated {
                provider: self.id.clone(),
                what: format!(
                    "the plan is for {} service {}",
                    plan.provider, plan.service_id
                ),
            });
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
        let snippets = format!("/service/{sid}/version/{draft}/snippet");
        for change in &plan.changes {
            let named = format!("{snippets}/{}", encode_segment(&change.key));
            match (change.op, &change.rendered) {
                (ChangeOp::Remove, _) => {
                    self.call(Method::DELETE, &named, None)
                        .await
                        .map_err(partial)?;
                }
                (ChangeOp::Add, Some(s)) => {
                    let mut form = fields(s);
                    form.insert(0, ("name", s.name.clone()));
                    form.push(("dynamic", "0".to_owned()));
                    self.call(Method::POST, &snippets, Some(form))
                        .await
                        .map_err(partial)?;
                }
                (ChangeOp::Update, Some(s)) => {
                    self.call(Method::PUT, &named, Some(fields(s)))
                        .await
                        .map_err(partial)?;
                }
                (_, None) => {
                    return Err(DeployError::PlanOutdated {
                        provider: self.id.clone(),
                        what: format!("the change to {} has no rendered snippet", change.key),
                    });
                }
            }
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

/// The form fields of a snippet write (without `name`).
fn fields(s: &Snippet) -> Vec<(&'static str, String)> {
    vec![
        ("type", s.kind.as_str().to_owned()),
        ("content", s.content.clone()),
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

    #[test]
    fn validation_errors_are_read_as_text() {
        let v = serde_json::json!(["Syntax error: Unexpected '}'", {"message": "at line 3"}]);
        assert_eq!(
            messages(Some(&v)),
            vec!["Syntax error: Unexpected '}'", "at line 3"]
        );
    }
}
