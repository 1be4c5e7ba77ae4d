//! NS1's API for what multicdn uses of it, keeping state as NS1 does (`API-CONTRACTS.md`):
//!
//! | route | does |
//! |---|---|
//! | `GET /v1/zones/{zone}` | the zone with its records (`domain`, `type`) |
//! | `GET/PUT/POST/DELETE /v1/zones/{zone}/{domain}/{type}` | read, create, update, remove a record |
//! | `GET/PUT /v1/data/sources` | list, create a data source (`{name, sourcetype}`) |
//! | `GET/PUT /v1/data/feeds/{source}` | list, create a feed (`{name, config: {label}}`) |
//! | `POST /v1/feed/{source}` | publish `{label: {up: bool}}` |
//! | `GET/PUT /v1/lists` | list, create a notify list (`{name, notify_list: [...]}`) |
//! | `GET/PUT /v1/monitoring/jobs`, `POST /v1/monitoring/jobs/{id}` | list, create, replace a monitoring job (`{name, job_type, config, regions, ...}`) |
//!
//! Zones exist once made with [`Ns1Api::create_zone`] (as in NS1's console); a record in any
//! other zone is a 404 `zone not found`. Every request needs `X-NSONE-Key` equal to the emulator's key (otherwise 401
//! `{"message": "Unauthorized"}`). A record body must be a JSON object whose `zone`, `domain`
//! and `type` match the path, with `answers` an array of objects each carrying an `answer`
//! array; otherwise 400 `{"message": ...}` as NS1 answers. Creating a record that exists is a
//! 400 `record already exists`; reading or updating one that does not is a 404
//! `record not found`. NS1 reads back `weight` as a float (`9000.0`), as its Go SDK types it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::purge::{Fault, hang};
use crate::serve::serve;

type RecordKey = (String, String, String);

#[derive(Debug)]
struct Ns1State {
    key: String,
    fault: Mutex<Fault>,
    zones: Mutex<std::collections::BTreeSet<String>>,
    records: Mutex<BTreeMap<RecordKey, Value>>,
    sources: Mutex<Vec<Value>>,
    feeds: Mutex<BTreeMap<String, Vec<Value>>>,
    lists: Mutex<Vec<Value>>,
    jobs: Mutex<Vec<Value>>,
    published: Mutex<Vec<(String, Value)>>,
    writes: AtomicU64,
    ids: AtomicU64,
}

/// An emulated NS1 API on 127.0.0.1.
#[derive(Debug)]
pub struct Ns1Api {
    addr: SocketAddr,
    state: Arc<Ns1State>,
    _stop: oneshot::Sender<()>,
}

impl Ns1Api {
    /// Starts the API, accepting the key `key`.
    pub async fn start(key: &str) -> std::io::Result<Ns1Api> {
        let state = Arc::new(Ns1State {
            key: key.to_owned(),
            fault: Mutex::new(Fault::None),
            zones: Mutex::default(),
            records: Mutex::default(),
            sources: Mutex::default(),
            feeds: Mutex::default(),
            lists: Mutex::default(),
            jobs: Mutex::default(),
            published: Mutex::default(),
            writes: AtomicU64::new(0),
            ids: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/zones/{zone}", get(zone))
            .route("/v1/zones/{zone}/{domain}/{rtype}", any(record))
            .route("/v1/data/sources", any(sources))
            .route("/v1/data/feeds/{source}", any(feeds))
            .route("/v1/feed/{source}", post(publish))
            .route("/v1/lists", any(lists))
            .route("/v1/monitoring/jobs", any(jobs))
            .route("/v1/monitoring/jobs/{id}", post(replace_job))
            .fallback(|| async { ns1_error(StatusCode::NOT_FOUND, "Not Found") })
            .with_state(state.clone());
        let (addr, stop) = serve(app).await?;
        Ok(Ns1Api {
            addr,
            state,
            _stop: stop,
        })
    }

    /// The base URL for [`Ns1Client`](https://docs.rs/multicdn-providers) (`http://127.0.0.1:PORT`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Makes the zone `zone` (empty).
    pub fn create_zone(&self, zone: &str) {
        self.state
            .zones
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(zone.to_owned());
    }

    /// Injects `fault` into every answer until changed.
    pub fn set_fault(&self, fault: Fault) {
        *self
            .state
            .fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = fault;
    }

    /// The record at `zone`/`domain`/`rtype`, as NS1 would answer it.
    pub fn record(&self, zone: &str, domain: &str, rtype: &str) -> Option<Value> {
        self.state
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(zone.to_owned(), domain.to_owned(), rtype.to_owned()))
            .cloned()
    }

    /// Puts a record in place as if made in NS1's console (any type), making its zone.
    pub fn insert_record(&self, record: Value) {
        self.create_zone(&str_field(&record, "zone"));
        let key = (
            str_field(&record, "zone"),
            str_field(&record, "domain"),
            str_field(&record, "type"),
        );
        self.state
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, record);
    }

    /// The monitoring jobs, as NS1 lists them.
    pub fn jobs(&self) -> Vec<Value> {
        self.state
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Record creations and updates accepted so far.
    pub fn writes(&self) -> u64 {
        self.state.writes.load(Ordering::Relaxed)
    }

    /// Every feed publish: (source id, body).
    pub fn published(&self) -> Vec<(String, Value)> {
        self.state
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn str_field(v: &Value, name: &str) -> String {
    v.get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn ns1_error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "message": message }))).into_response()
}

impl Ns1State {
    fn gate(&self, headers: &HeaderMap) -> Option<Response> {
        let fault = self.current_fault();
        let key_ok = headers
            .get("x-nsone-key")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|k| k == self.key);
        if fault == Fault::RefuseTokens || !key_ok {
            return Some(ns1_error(StatusCode::UNAUTHORIZED, "Unauthorized"));
        }
        match fault {
            Fault::Unavailable => Some(ns1_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "service unavailable",
            )),
            Fault::RateLimited => Some(
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [
                        ("x-ratelimit-limit", "10"),
                        ("x-ratelimit-remaining", "0"),
                        ("x-ratelimit-period", "1"),
                    ],
                    axum::Json(json!({"message": "rate limit exceeded"})),
                )
                    .into_response(),
            ),
            Fault::None | Fault::RefuseTokens | Fault::Hang => None,
        }
    }

    /// An injected hang, then the gate: what every route does first.
    async fn admit(&self, headers: &HeaderMap) -> Option<Response> {
        hang(self.current_fault()).await;
        self.gate(headers)
    }

    /// [`Ns1State::admit`], then a 404 for a data source that does not exist.
    async fn admit_source(&self, headers: &HeaderMap, source: &str) -> Option<Response> {
        hang(self.current_fault()).await;
        self.source_gate(headers, source)
    }

    fn current_fault(&self) -> Fault {
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn zone_exists(&self, zone: &str) -> bool {
        self.zones
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(zone)
    }

    fn id(&self) -> String {
        format!(
            "{:024x}",
            0x5f1d_0000 + self.ids.fetch_add(1, Ordering::Relaxed)
        )
    }
}

async fn zone(
    State(s): State<Arc<Ns1State>>,
    Path(zone): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = s.admit(&headers).await {
        return refusal;
    }
    if !s.zone_exists(&zone) {
        return ns1_error(StatusCode::NOT_FOUND, "zone not found");
    }
    let records = s.records.lock().unwrap_or_else(PoisonError::into_inner);
    let listed: Vec<Value> = records
        .iter()
        .filter(|((z, _, _), _)| *z == zone)
        .map(|((_, domain, rtype), r)| {
            json!({"domain": domain, "type": rtype, "ttl": r.get("ttl").cloned().unwrap_or(json!(3600))})
        })
        .collect();
    axum::Json(json!({"zone": zone, "records": listed})).into_response()
}

/// The body's problem as NS1 words it, if any.
fn invalid_record(body: &Value, zone: &str, domain: &str, rtype: &str) -> Option<String> {
    let Value::Object(o) = body else {
        return Some("invalid record: the body must be a JSON object".into());
    };
    for (field, want) in [("zone", zone), ("domain", domain), ("type", rtype)] {
        match o.get(field).and_then(Value::as_str) {
            Some(got) if got.eq_ignore_ascii_case(want) => {}
            Some(got) => return Some(format!("{field} {got:?} does not match the URL ({want:?})")),
            None => return Some(format!("invalid record: {field} is required")),
        }
    }
    let Some(answers) = o.get("answers").and_then(Value::as_array) else {
        return Some("invalid record: answers must be an array".into());
    };
    if answers
        .iter()
        .any(|a| !a.get("answer").is_some_and(Value::is_array))
    {
        return Some("invalid answer: each answer needs an answer array".into());
    }
    if o.get("filters").is_some_and(|f| !f.is_array()) {
        return Some("invalid record: filters must be an array".into());
    }
    None
}

/// NS1's Go SDK types `weight` as a float: answer with it as one.
fn as_read_back(mut record: Value) -> Value {
    if let Some(answers) = record.get_mut("answers").and_then(Value::as_array_mut) {
        for a in answers {
            if let Some(w) = a.pointer_mut("/meta/weight")
                && let Some(n) = w.as_f64()
                && w.is_u64()
            {
                *w = json!(n);
            }
        }
    }
    record
}

async fn record(
    State(s): State<Arc<Ns1State>>,
    Path((zone, domain, rtype)): Path<(String, String, String)>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit(&headers).await {
        return refusal;
    }
    if !s.zone_exists(&zone) {
        return ns1_error(StatusCode::NOT_FOUND, "zone not found");
    }
    let key = (zone.clone(), domain.clone(), rtype.clone());
    let mut records = s.records.lock().unwrap_or_else(PoisonError::into_inner);
    match method {
        Method::GET => match records.get(&key) {
            Some(r) => axum::Json(as_read_back(r.clone())).into_response(),
            None => ns1_error(StatusCode::NOT_FOUND, "record not found"),
        },
        Method::DELETE => match records.remove(&key) {
            Some(_) => axum::Json(json!({})).into_response(),
            None => ns1_error(StatusCode::NOT_FOUND, "record not found"),
        },
        Method::PUT | Method::POST => {
            let Ok(parsed) = serde_json::from_slice::<Value>(&body) else {
                return ns1_error(StatusCode::BAD_REQUEST, "invalid json");
            };
            if let Some(why) = invalid_record(&parsed, &zone, &domain, &rtype) {
                return ns1_error(StatusCode::BAD_REQUEST, &why);
            }
            let exists = records.contains_key(&key);
            if method == Method::PUT && exists {
                return ns1_error(StatusCode::BAD_REQUEST, "record already exists");
            }
            if method == Method::POST && !exists {
                return ns1_error(StatusCode::NOT_FOUND, "record not found");
            }
            s.writes.fetch_add(1, Ordering::Relaxed);
            records.insert(key, parsed.clone());
            axum::Json(as_read_back(parsed)).into_response()
        }
        _ => ns1_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
    }
}

async fn sources(
    State(s): State<Arc<Ns1State>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit(&headers).await {
        return refusal;
    }
    let mut sources = s.sources.lock().unwrap_or_else(PoisonError::into_inner);
    match method {
        Method::GET => axum::Json(Value::Array(sources.clone())).into_response(),
        Method::PUT => {
            let parsed: Value = serde_json::from_slice(&body).unwrap_or_default();
            let name = parsed.get("name").and_then(Value::as_str);
            let kind = parsed.get("sourcetype").and_then(Value::as_str);
            let (Some(name), Some(kind)) = (name, kind) else {
                return ns1_error(StatusCode::BAD_REQUEST, "name and sourcetype are required");
            };
            let made = json!({"id": s.id(), "name": name, "sourcetype": kind, "feeds": []});
            sources.push(made.clone());
            axum::Json(made).into_response()
        }
        _ => ns1_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
    }
}

impl Ns1State {
    /// The gate, then a 404 for a data source that does not exist.
    fn source_gate(&self, headers: &HeaderMap, source: &str) -> Option<Response> {
        if let Some(refusal) = self.gate(headers) {
            return Some(refusal);
        }
        let exists = self
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|x| x.get("id").and_then(Value::as_str) == Some(source));
        (!exists).then(|| ns1_error(StatusCode::NOT_FOUND, "data source not found"))
    }
}

async fn feeds(
    State(s): State<Arc<Ns1State>>,
    Path(source): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit_source(&headers, &source).await {
        return refusal;
    }
    let mut feeds = s.feeds.lock().unwrap_or_else(PoisonError::into_inner);
    let list = feeds.entry(source).or_default();
    match method {
        Method::GET => axum::Json(Value::Array(list.clone())).into_response(),
        Method::PUT => {
            let parsed: Value = serde_json::from_slice(&body).unwrap_or_default();
            let name = parsed.get("name").and_then(Value::as_str);
            let config = parsed.get("config").filter(|c| c.is_object());
            let (Some(name), Some(config)) = (name, config) else {
                return ns1_error(StatusCode::BAD_REQUEST, "name and config are required");
            };
            let made = json!({"id": s.id(), "name": name, "config": config});
            list.push(made.clone());
            axum::Json(made).into_response()
        }
        _ => ns1_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
    }
}

async fn publish(
    State(s): State<Arc<Ns1State>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit_source(&headers, &source).await {
        return refusal;
    }
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(&body) else {
        return ns1_error(StatusCode::BAD_REQUEST, "the body must be a JSON object");
    };
    if o.values().any(|v| !v.is_object()) {
        return ns1_error(
            StatusCode::BAD_REQUEST,
            "each label takes an object of metadata",
        );
    }
    s.published
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((source, Value::Object(o)));
    axum::Json(json!({})).into_response()
}

/// `GET` lists `items`; `PUT` adds the body (a JSON object with every field in `required`)
/// with a new `id`.
fn collection(
    s: &Ns1State,
    items: &Mutex<Vec<Value>>,
    method: &Method,
    body: &[u8],
    required: &[&str],
) -> Response {
    let mut items = items.lock().unwrap_or_else(PoisonError::into_inner);
    match *method {
        Method::GET => axum::Json(Value::Array(items.clone())).into_response(),
        Method::PUT => {
            let Ok(Value::Object(mut item)) = serde_json::from_slice::<Value>(body) else {
                return ns1_error(StatusCode::BAD_REQUEST, "Input validation failed");
            };
            if let Some(missing) = required.iter().find(|k| !item.contains_key(**k)) {
                return ns1_error(
                    StatusCode::BAD_REQUEST,
                    &format!("Input validation failed: {missing} is required"),
                );
            }
            item.insert("id".into(), json!(s.id()));
            let item = Value::Object(item);
            items.push(item.clone());
            axum::Json(item).into_response()
        }
        _ => ns1_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed"),
    }
}

async fn lists(
    State(s): State<Arc<Ns1State>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit(&headers).await {
        return refusal;
    }
    collection(&s, &s.lists, &method, &body, &["name", "notify_list"])
}

async fn jobs(
    State(s): State<Arc<Ns1State>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit(&headers).await {
        return refusal;
    }
    collection(
        &s,
        &s.jobs,
        &method,
        &body,
        &["name", "job_type", "config", "regions"],
    )
}

async fn replace_job(
    State(s): State<Arc<Ns1State>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.admit(&headers).await {
        return refusal;
    }
    let Ok(Value::Object(mut job)) = serde_json::from_slice::<Value>(&body) else {
        return ns1_error(StatusCode::BAD_REQUEST, "Input validation failed");
    };
    let mut jobs = s.jobs.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(existing) = jobs
        .iter_mut()
        .find(|j| j.get("id").and_then(Value::as_str) == Some(id.as_str()))
    else {
        return ns1_error(StatusCode::NOT_FOUND, "job not found");
    };
    job.insert("id".into(), json!(id));
    *existing = Value::Object(job);
    axum::Json(existing.clone()).into_response()
}
