//! What the command-line tools share: loading the policy, `--edge provider=URL` overrides, exit
//! codes. Each tool includes this file with `#[path]`, so a tool copied out of this directory
//! takes this file with it.

#![allow(dead_code)] // each tool uses a different part

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use multicdn_core::policy::{Policy, PolicyError, ProviderSpec};
use multicdn_core::{ProviderId, ProviderKind, Secret};
use multicdn_providers::cloudflare::CloudflarePurger;
use multicdn_providers::fanout::{FanoutMember, PurgeFanout};
use multicdn_providers::fastly::FastlyPurger;
use multicdn_providers::http::HttpSettings;

/// Exit code: the tool ran and found nothing wrong.
pub(crate) const OK: u8 = 0;
/// Exit code: the finding the tool exists for (a provider down, edges that differ, a missed purge).
pub(crate) const FINDING: u8 = 1;
/// Exit code: the tool could not do its job (usage, policy, credentials, transport setup).
pub(crate) const ERROR: u8 = 2;

/// Exit code: stdout was closed early (`tool | head`), as a shell reports a closed pipe.
pub(crate) const CLOSED_PIPE: u8 = 141;

/// `println!` for tools: a reader that stops early (`tool | head`) ends the tool quietly (exit
/// code 141, as a shell reports a closed pipe) instead of a panic; any other failure to write
/// is reported on stderr (exit 2).
#[allow(unused_macros)] // each tool uses a different part
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            $crate::common::stdout_failed(&e);
        }
    }};
}
#[allow(unused_imports)]
pub(crate) use out;

/// `print!` for tools, with [`out!`]'s handling of a closed pipe.
#[allow(unused_macros)]
macro_rules! out_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout().lock(), $($arg)*) {
            $crate::common::stdout_failed(&e);
        }
    }};
}
#[allow(unused_imports)]
pub(crate) use out_part;

/// Ends the tool after a failed write to stdout.
pub(crate) fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(i32::from(CLOSED_PIPE));
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(i32::from(ERROR));
}

/// A failure that stops a tool, with its exit code; the message goes to stderr.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Fail {
    /// A usage, configuration or setup error (exit 2).
    pub(crate) fn error(message: impl Into<String>) -> Fail {
        Fail {
            code: ERROR,
            message: message.into(),
        }
    }

    /// Prints the message to stderr and returns the exit code.
    pub(crate) fn report(self) -> ExitCode {
        eprintln!("{}", self.message);
        ExitCode::from(self.code)
    }
}

/// Loads and validates the policy; every problem is named with file, line and field.
pub(crate) fn load_policy(path: &Path) -> Result<Policy, Fail> {
    match Policy::load(path) {
        Ok(p) => Ok(p),
        Err(e @ PolicyError::Read { .. }) => Err(Fail::error(format!("error: {e}"))),
        Err(e) => {
            let n = e.diagnostics().len();
            Err(Fail::error(format!(
                "{e}\n{n} problem{} in {}; `policy check {}` explains each",
                if n == 1 { "" } else { "s" },
                path.display(),
                path.display()
            )))
        }
    }
}

/// Logs to stderr at `info`, or as `RUST_LOG` says.
pub(crate) fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

/// Parses `provider=URL` (as `--edge` takes it).
pub(crate) fn parse_edge(s: &str) -> Result<(ProviderId, String), String> {
    let Some((provider, url)) = s.split_once('=') else {
        return Err(format!(
            "{s:?} is not provider=URL; write fastly=http://127.0.0.1:8080"
        ));
    };
    let provider = ProviderId::new(provider.trim())
        .map_err(|e| format!("{provider:?} is not a provider id: {e}"))?;
    let url = url.trim();
    if url.is_empty() {
        return Err(format!("{s:?} gives no URL for {provider}"));
    }
    Ok((provider, url.to_owned()))
}

/// The `--edge` overrides as a map; a provider named twice is an error.
pub(crate) fn overrides(
    edges: &[(ProviderId, String)],
) -> Result<BTreeMap<ProviderId, String>, Fail> {
    let mut out = BTreeMap::new();
    for (p, url) in edges {
        if out.insert(p.clone(), url.clone()).is_some() {
            return Err(Fail::error(format!(
                "error: --edge names {p} twice; give one URL per provider"
            )));
        }
    }
    Ok(out)
}

/// Parses a duration as the policy writes them: `90s`, `250ms`, `1h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration ({e}); write 90s, 250ms or 1h"))
}

/// `12 ms`, `1.25 s`: a latency as people read it.
pub(crate) fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// The API token of provider `id`, from the environment variable its `token_env` names.
pub(crate) fn policy_token(
    id: &ProviderId,
    spec: &ProviderSpec,
    dry_run: bool,
) -> Result<Secret, Fail> {
    let Some(var) = spec.token_env.as_deref() else {
        if dry_run {
            return Ok(Secret::new("dry-run"));
        }
        return Err(Fail::error(format!(
            "error: providers.{id}.token_env is not set in the policy; name the environment variable holding {id}'s API token"
        )));
    };
    match Secret::from_env(var) {
        Some(t) => Ok(t),
        None if dry_run => {
            eprintln!(
                "note: {var} (providers.{id}.token_env) is unset; a real purge would stop here"
            );
            Ok(Secret::new("dry-run"))
        }
        None => Err(Fail::error(format!(
            "error: the environment variable {var} (providers.{id}.token_env) is unset or empty; it must hold {id}'s API token"
        ))),
    }
}

/// Where the vendors' APIs are (`None`: the vendor's own).
#[derive(Debug, Clone, Default)]
pub(crate) struct VendorApis {
    /// Fastly's API base.
    pub(crate) fastly: Option<String>,
    /// Cloudflare's API base.
    pub(crate) cloudflare: Option<String>,
    /// The origin shield's purge address, instead of the policy's `shield.url`.
    pub(crate) shield: Option<String>,
}

/// Every provider of the policy as one purge fan-out, each with the token its `token_env`
/// names (a stand-in token when `dry_run`, with a note), behind the policy's origin shield
/// when it has one (purged first).
pub(crate) fn purge_fanout(
    policy: &Policy,
    policy_path: &Path,
    settings: &HttpSettings,
    apis: &VendorApis,
    dry_run: bool,
) -> Result<PurgeFanout, Fail> {
    let mut members = Vec::new();
    for (id, spec) in &policy.providers {
        let setup = |e: multicdn_core::Error| {
            Fail::error(format!(
                "error: {}: provider {id}: {e}",
                policy_path.display()
            ))
        };
        match spec.kind {
            ProviderKind::Fastly => {
                let purger = FastlyPurger::from_spec(
                    id.clone(),
                    spec,
                    policy_token(id, spec, dry_run)?,
                    apis.fastly.as_deref(),
                    settings.clone(),
                )
                .map_err(setup)?;
                members.push(FanoutMember::new(Arc::new(purger)));
            }
            ProviderKind::Cloudflare => {
                let purger = CloudflarePurger::from_spec(
                    id.clone(),
                    spec,
                    policy_token(id, spec, dry_run)?,
                    apis.cloudflare.as_deref(),
                    settings.clone(),
                )
                .map_err(setup)?;
                members.push(FanoutMember::new(Arc::new(purger)));
            }
            ProviderKind::Akamai => {
                let credentials = match multicdn_providers::akamai::credentials_from_env(id, spec) {
                    Ok(c) => c,
                    Err(e) if dry_run => {
                        eprintln!("note: {e}; a real purge would stop here");
                        let dry = || Secret::new("dry-run");
                        multicdn_providers::akamai::EdgeGridCredentials {
                            client_token: dry(),
                            client_secret: dry(),
                            access_token: dry(),
                        }
                    }
                    Err(e) => return Err(setup(e)),
                };
                let purger = multicdn_providers::akamai::AkamaiPurger::from_spec(
                    id.clone(),
                    spec,
                    credentials,
                    None,
                    settings.clone(),
                )
                .map_err(setup)?;
                members.push(FanoutMember::new(Arc::new(purger)));
            }
            other => {
                return Err(Fail::error(format!(
                    "error: {}: providers.{id} is of kind {other}, which has no purge adapter; purge it by other means, or remove it from the policy for this purge",
                    policy_path.display()
                )));
            }
        }
    }
    let fanout = PurgeFanout::new(members);
    let Some(spec) = &policy.shield else {
        return Ok(fanout);
    };
    let id = multicdn_core::ProviderId::new(multicdn_providers::shield::SHIELD_ID)
        .map_err(|e| Fail::error(format!("error: {e}")))?;
    let shield = multicdn_providers::shield::ShieldPurger::from_spec(
        id,
        spec,
        apis.shield.as_deref(),
        settings.clone(),
    )
    .map_err(|e| Fail::error(format!("error: {}: shield.url: {e}", policy_path.display())))?;
    Ok(fanout.with_shield(FanoutMember::new(Arc::new(shield))))
}
