//! The dashboard's JSON API (`/api/v1/*`) and `/metrics`.
//!
//! One table first (seed 000 section 14: p75 TTFB by provider by country, with each provider's
//! share of the requests, thin cells marked), then what explains it: the weights in force,
//! the loop's own health, provider health with reasons, the journal searchable by network and
//! time with each entry's evidence, and the history behind the charts.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use multicdn_core::{CohortId, NetworkKey, ProviderId, Timestamp, Weights};
use multicdn_steering::journal::{self, JournalEntry};
use multicdn_steering::scoreboard::{CellView, Metric, Snapshot};
use serde::{Deserialize, Serialize};

use super::Service;
use super::metrics::rule_label;

/// A provider's split as fractions.
pub(crate) fn fractions(w: &Weights) -> BTreeMap<String, f64> {
    w.iter()
        .map(|(p, bp)| (p.to_string(), f64::from(bp) / 10_000.0))
        .collect()
}

#[derive(Debug, Serialize)]
pub(crate) struct Cell {
    provider: String,
    p75: Option<f64>,
    samples: u64,
    share: f64,
    steerable: bool,
    status: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct Row {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    country: Option<String>,
    total: u64,
    cells: Vec<Cell>,
}

fn status_text(v: &CellView) -> String {
    use multicdn_steering::scoreboard::CellStatus;
    match &v.status {
        CellStatus::Steerable => "steerable".to_owned(),
        CellStatus::Empty => "empty".to_owned(),
        CellStatus::TooFewSamples { samples, needed } => {
            format!("too few samples ({samples} of {needed})")
        }
        CellStatus::Stale { age, limit } => {
            format!("stale ({}s old, limit {}s)", age.as_secs(), limit.as_secs())
        }
    }
}

fn row(
    snapshot: &Snapshot,
    metric: Metric,
    key: NetworkKey,
    label: String,
    providers: &[ProviderId],
) -> Row {
    let views: Vec<CellView> = providers
        .iter()
        .map(|p| snapshot.cell(metric, key, p))
        .collect();
    let total: u64 = views.iter().map(|v| v.stats.samples).sum();
    let cells = providers
        .iter()
        .zip(&views)
        .map(|(p, v)| Cell {
            provider: p.to_string(),
            p75: v.stats.p75,
            samples: v.stats.samples,
            share: if total == 0 {
                0.0
            } else {
                v.stats.samples as f64 / total as f64
            },
            steerable: v.status.is_steerable(),
            status: status_text(v),
        })
        .collect();
    let country = match key {
        NetworkKey::Asn(a) => snapshot.country_of_asn(a).map(|c| c.to_string()),
        _ => None,
    };
    Row {
        key: label,
        country,
        total,
        cells,
    }
}

/// Cells with samples and cells that may steer, over countries and networks.
pub(crate) fn count_cells(
    snapshot: &Snapshot,
    metric: Metric,
    providers: &[ProviderId],
) -> (usize, usize) {
    let mut cells = 0;
    let mut steerable = 0;
    for key in snapshot.networks(metric) {
        if !matches!(key, NetworkKey::Country(_) | NetworkKey::Asn(_)) {
            continue;
        }
        for p in providers {
            let v = snapshot.cell(metric, key, p);
            if v.stats.samples > 0 {
                cells += 1;
            }
            if v.status.is_steerable() {
                steerable += 1;
            }
        }
    }
    (cells, steerable)
}

#[derive(Debug, Deserialize)]
pub(crate) struct BoardQuery {
    #[serde(default)]
    metric: Option<String>,
    #[serde(default)]
    networks: Option<usize>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Board {
    at: Timestamp,
    window_s: u64,
    min_samples: u64,
    metric: &'static str,
    providers: Vec<String>,
    countries: Vec<Row>,
    all: Row,
    networks: Vec<Row>,
}

/// The one table, and the same for the busiest networks.
pub(crate) fn board_at(service: &Service, metric: Metric, busiest: usize, now: Timestamp) -> Board {
    let snapshot = service.inner.controller.snapshot(now);
    let providers = service.providers();
    let mut countries = Vec::new();
    let mut asns = Vec::new();
    for key in snapshot.networks(metric) {
        match key {
            NetworkKey::Country(c) => {
                countries.push(row(&snapshot, metric, key, c.to_string(), providers));
            }
            NetworkKey::Asn(_) => asns.push((snapshot.samples(metric, key), key)),
            _ => {}
        }
    }
    countries.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.key.cmp(&b.key)));
    asns.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let networks = asns
        .into_iter()
        .take(busiest)
        .map(|(_, key)| row(&snapshot, metric, key, key.to_string(), providers))
        .collect();
    let rum = &service.inner.controller.policy().steering.rum;
    Board {
        at: now,
        window_s: rum.window.get().as_secs(),
        min_samples: rum.min_samples,
        metric: if metric == Metric::Probe {
            "probe"
        } else {
            "ttfb"
        },
        providers: providers.iter().map(ToString::to_string).collect(),
        countries,
        all: row(
            &snapshot,
            metric,
            NetworkKey::Global,
            "all".to_owned(),
            providers,
        ),
        networks,
    }
}

fn bad_request(msg: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": msg })),
    )
        .into_response()
}

pub(crate) async fn board(State(s): State<Service>, Query(q): Query<BoardQuery>) -> Response {
    let metric = match q.metric.as_deref() {
        None | Some("ttfb") => Metric::Ttfb,
        Some("probe") => Metric::Probe,
        Some(other) => {
            return bad_request(format!(
                "metric {:?}: use ttfb or probe",
                other.chars().take(32).collect::<String>()
            ));
        }
    };
    let now = s.inner.controller.clock().now();
    let busiest = q.networks.unwrap_or(20).min(500);
    // Copying and reading the whole scoreboard: on a blocking thread, not one serving beacons.
    let board = crate::controller::off_runtime(move || board_at(&s, metric, busiest, now)).await;
    Json(board).into_response()
}

#[derive(Debug, Serialize)]
struct CohortRow {
    cohort: String,
    networks: Vec<String>,
    weights: BTreeMap<String, f64>,
}

pub(crate) async fn weights(State(s): State<Service>) -> Response {
    let plan = s.inner.controller.plan().await;
    let round = s.inner.controller.last_round().await;
    let mode = s.inner.controller.last_record().await.map_or_else(
        || "not yet run".to_owned(),
        |r| {
            serde_json::to_value(r.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        },
    );
    let overrides = s.inner.controller.overrides().await;
    let static_on = overrides
        .static_mode
        .unwrap_or(s.inner.controller.policy().steering.guardrails.static_mode);
    let cohorts: Vec<CohortRow> = plan
        .cohorts
        .iter()
        .map(|c| CohortRow {
            cohort: c.cohort.to_string(),
            networks: c.networks.iter().map(ToString::to_string).collect(),
            weights: fractions(&c.weights),
        })
        .collect();
    Json(serde_json::json!({
        "round": round,
        "mode": mode,
        "dry_run": s.inner.controller.is_dry_run(),
        "static": static_on,
        "cohorts": cohorts,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoopQuery {
    #[serde(default)]
    hours: Option<u64>,
}

pub(crate) async fn loop_health(State(s): State<Service>, Query(q): Query<LoopQuery>) -> Response {
    let now = s.inner.controller.clock().now();
    let hours = q.hours.unwrap_or(24).clamp(1, 24 * 90);
    let from = now.minus(Duration::from_secs(hours * 3600));
    let j = s.inner.controller.journal().await;
    // Reversals within two hours count as oscillation, as the journal's own report does.
    let h = j.loop_health(from, now, Duration::from_secs(7200), 3);
    let by_rule: BTreeMap<String, usize> = h
        .by_rule
        .iter()
        .map(|(r, n)| (rule_label(*r), *n))
        .collect();
    Json(serde_json::json!({
        "from": from,
        "to": now,
        "moves": h.moves,
        "moves_per_day": h.moves_per_day,
        "by_rule": by_rule,
        "oscillating": h.oscillating.iter().map(|o| serde_json::json!({
            "cohort": o.cohort.to_string(), "reversals": o.reversals, "from": o.from, "to": o.to,
        })).collect::<Vec<_>>(),
        "mean_gain_ms": h.mean_gain_ms,
        "improvements": h.improvements.iter().map(|i| serde_json::json!({
            "cohort": i.cohort.to_string(), "moved_at": i.moved_at, "measured_at": i.measured_at,
            "before_ms": i.before_ms, "after_ms": i.after_ms,
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

pub(crate) async fn health(State(s): State<Service>) -> Response {
    let ledger = s.inner.controller.ledger().await;
    let providers: Vec<serde_json::Value> = ledger
        .entries()
        .map(|(p, e)| {
            serde_json::json!({
                "provider": p.to_string(),
                "out": e.is_out(),
                "since": e.health.since,
                "reasons": e.reasons.iter().map(|r| serde_json::json!({
                    "kind": r.kind(), "detail": r.to_string(), "since": r.since(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(serde_json::json!({ "providers": providers })).into_response()
}

/// The policy's drills: each one's schedule, progress (shift, abort, figures per region before,
/// during and after) and its report as text.
pub(crate) async fn drills(State(s): State<Service>) -> Response {
    let progress = s.inner.controller.drills().await;
    let drills: Vec<serde_json::Value> = s
        .inner
        .controller
        .policy()
        .steering
        .drills
        .iter()
        .map(|spec| {
            let p = progress.get(&spec.name).cloned().unwrap_or_default();
            serde_json::json!({
                "name": spec.name.as_str(),
                "at": spec.at,
                "to": spec.to.as_str(),
                "share": spec.share.to_string(),
                "hold_s": spec.hold.get().as_secs(),
                "time_to_shift_s": p.time_to_shift().map(|d| d.as_secs()),
                "progress": p,
                "report": multicdn_steering::engine::drill::report(spec, &p),
            })
        })
        .collect();
    Json(serde_json::json!({ "drills": drills })).into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct JournalQuery {
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    moves_only: Option<bool>,
    #[serde(default)]
    limit: Option<usize>,
}

fn entry_json(e: &JournalEntry) -> serde_json::Value {
    let ev = &e.evidence;
    serde_json::json!({
        "at": e.at,
        "cohort": e.cohort.to_string(),
        "networks": e.networks.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "before": fractions(&e.before),
        "after": fractions(&e.after),
        "rule": rule_label(e.rule),
        "evidence": {
            "network": ev.network.map(|n| n.to_string()),
            "providers": ev.providers.iter().map(|p| serde_json::json!({
                "provider": p.provider.to_string(), "score": p.score, "samples": p.samples,
                "stderr": p.stderr,
            })).collect::<Vec<_>>(),
            "gap_ms": ev.gap_ms,
            "gap_relative": ev.gap_relative,
            "required_ms": ev.required_ms,
            "required_relative": ev.required_relative,
            "switching_back": ev.switching_back,
            "capped_by": ev.capped_by,
            "note": ev.note,
        },
    })
}

fn time_param(name: &str, raw: Option<&str>) -> Result<Option<Timestamp>, String> {
    match raw.filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => Timestamp::parse_rfc3339(s).map(Some).map_err(|e| {
            format!(
                "{name} {:?}: {e}; write an RFC 3339 time like 2026-12-01T09:00:00Z",
                s.chars().take(40).collect::<String>()
            )
        }),
    }
}

pub(crate) async fn journal(State(s): State<Service>, Query(q): Query<JournalQuery>) -> Response {
    let from = match time_param("from", q.from.as_deref()) {
        Ok(t) => t,
        Err(msg) => return bad_request(msg),
    };
    let to = match time_param("to", q.to.as_deref()) {
        Ok(t) => t,
        Err(msg) => return bad_request(msg),
    };
    let mut query = journal::Query::default();
    if let Some(raw) = q
        .network
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        // A network (`AS7922`, `GB`) finds every cohort it was decided in; anything else is
        // a cohort's name (`europe`).
        match raw.to_uppercase().parse::<NetworkKey>() {
            Ok(key) => query.network = Some(key),
            Err(_) => match CohortId::new(raw) {
                Ok(c) => query.cohort = Some(c),
                Err(e) => return bad_request(format!("network {raw:?}: {e}")),
            },
        }
    }
    query.from = from;
    query.to = to;
    query.moves_only = q.moves_only.unwrap_or(false);
    let limit = q.limit.unwrap_or(200).clamp(1, 5000);
    let j = s.inner.controller.journal().await;
    let found = j.query(&query);
    let total = found.len();
    let entries: Vec<serde_json::Value> = found
        .iter()
        .rev()
        .take(limit)
        .map(|e| entry_json(e))
        .collect();
    let operator: Vec<serde_json::Value> = s
        .inner
        .controller
        .operator_log()
        .await
        .iter()
        .filter(|r| from.is_none_or(|f| r.at >= f) && to.is_none_or(|t| r.at <= t))
        .rev()
        .take(limit)
        .map(|r| {
            serde_json::json!({
                "at": r.at, "who": r.operator.who, "why": r.operator.why,
                "action": r.command.to_string(), "from_round": r.from_round,
            })
        })
        .collect();
    Json(serde_json::json!({
        "total": total,
        "entries": entries,
        "operator": operator,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
pub(crate) struct HistoryQuery {
    #[serde(default)]
    cohort: Option<String>,
    #[serde(default)]
    network: Option<String>,
}

pub(crate) async fn history(State(s): State<Service>, Query(q): Query<HistoryQuery>) -> Response {
    let plan = s.inner.controller.plan().await;
    let cohort = match q.cohort.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => match CohortId::new(c) {
            Ok(c) => Some(c),
            Err(e) => return bad_request(format!("cohort {c:?}: {e}")),
        },
        None => plan.cohorts.first().map(|c| c.cohort.clone()),
    };
    let network = match q.network.as_deref().filter(|n| !n.is_empty()) {
        None => NetworkKey::Global,
        Some(n) => match n.to_uppercase().parse::<NetworkKey>() {
            Ok(k) => k,
            Err(e) => return bad_request(format!("network {n:?}: {e}")),
        },
    };
    // Weights over time come from the journal: the split before the first change, then
    // every change as decided, then the split in force now.
    let mut weights = Vec::new();
    if let Some(cohort) = &cohort {
        let j = s.inner.controller.journal().await;
        let entries = j.query(&journal::Query::cohort(cohort.clone()));
        let start = s.history_start();
        match entries.first() {
            Some(first) => weights.push(serde_json::json!({ "at": start.unwrap_or(first.at), "weights": fractions(&first.before) })),
            // No change yet: the split in force since the history began.
            None => {
                if let (Some(start), Some(c)) = (start, plan.cohort(cohort)) {
                    weights.push(serde_json::json!({ "at": start, "weights": fractions(&c.weights) }));
                }
            }
        }
        for e in &entries {
            weights.push(serde_json::json!({ "at": e.at, "weights": fractions(&e.after) }));
        }
        if let Some(c) = plan.cohort(cohort) {
            weights.push(serde_json::json!({ "at": s.inner.controller.clock().now(), "weights": fractions(&c.weights) }));
        }
    }
    let p75 = s.history_p75(network);
    Json(serde_json::json!({
        "cohort": cohort.map(|c| c.to_string()),
        "network": network.to_string(),
        "cohorts": plan.cohorts.iter().map(|c| c.cohort.to_string()).collect::<Vec<_>>(),
        "weights": weights,
        "p75": p75,
    }))
    .into_response()
}

pub(crate) async fn metrics(State(s): State<Service>) -> Response {
    let mut r = s.metrics_text().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
