//! Reading a provider's entry in the policy (`providers.<id>`) for an adapter: the kind must be
//! the adapter's, the identifier it needs must be there, and the token comes from the variable
//! `token_env` names. One place, so every adapter refuses a bad entry with the same words,
//! naming the field to fix.

use multicdn_core::policy::ProviderSpec;
use multicdn_core::{Error, ProviderId, ProviderKind, Secret};

/// The value of the entry's `field` (`value`), checked for an adapter of `expected` kind used
/// `purpose` (`for a Fastly purger`, `to deploy to Cloudflare`).
///
/// `Err` names `providers.<id>.kind` when the entry is of another kind, and
/// `providers.<id>.<field>` when the value is missing or blank.
pub(crate) fn required_field(
    id: &ProviderId,
    spec: &ProviderSpec,
    expected: ProviderKind,
    field: &str,
    value: Option<&String>,
    purpose: &str,
) -> Result<String, Error> {
    if spec.kind != expected {
        return Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!(
                "provider {id} is of kind {}, not {expected}; an adapter {purpose} needs providers.{id}.kind: {expected}",
                spec.kind
            ),
        });
    }
    match value.map(|v| v.trim()) {
        Some(v) if !v.is_empty() => Ok(v.to_owned()),
        Some(_) => Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!("providers.{id}.{field} is empty; it is required {purpose}"),
        }),
        None => Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!("providers.{id}.{field} is required {purpose}"),
        }),
    }
}

/// Reads the token the provider entry's `token_env` names.
pub(crate) fn token_from_env(id: &ProviderId, spec: &ProviderSpec) -> Result<Secret, Error> {
    let Some(var) = spec.token_env.as_deref() else {
        return Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!(
                "providers.{id}.token_env is not set; name the environment variable holding the API token"
            ),
        });
    };
    Secret::from_env(var).ok_or_else(|| Error::InvalidRequest {
        provider: id.clone(),
        message: format!(
            "the environment variable {var} (providers.{id}.token_env) is unset or empty"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: ProviderKind, service_id: Option<&str>) -> ProviderSpec {
        let json = serde_json::json!({
            "kind": kind.as_str(),
            "edge_host": "example.map.fastly.net",
            "service_id": service_id,
        });
        serde_json::from_value(json).unwrap()
    }

    fn id() -> ProviderId {
        ProviderId::new("primary").unwrap()
    }

    /// The service id, read for a Fastly adapter.
    fn service_id(s: &ProviderSpec, purpose: &str) -> Result<String, String> {
        let got = required_field(
            &id(),
            s,
            ProviderKind::Fastly,
            "service_id",
            s.service_id.as_ref(),
            purpose,
        );
        got.map_err(|e| e.to_string())
    }

    #[test]
    fn a_present_field_of_the_right_kind_is_returned() {
        let s = spec(ProviderKind::Fastly, Some("SU1Z0isxPaozGVKXdv0eY"));
        let got = service_id(&s, "for a Fastly purger");
        assert_eq!(got.unwrap(), "SU1Z0isxPaozGVKXdv0eY");
    }

    #[test]
    fn another_kind_is_refused_naming_both_kinds_and_the_field_to_fix() {
        let s = spec(ProviderKind::Cloudflare, Some("x"));
        let err = service_id(&s, "to deploy to Fastly").unwrap_err();
        assert!(err.contains("of kind cloudflare, not fastly"), "{err}");
        assert!(err.contains("providers.primary.kind: fastly"), "{err}");
    }

    #[test]
    fn a_missing_or_blank_field_is_named_with_its_purpose() {
        for value in [None, Some("  ")] {
            let s = spec(ProviderKind::Fastly, value);
            let err = service_id(&s, "for a Fastly purger").unwrap_err();
            assert!(err.contains("providers.primary.service_id"), "{err}");
            assert!(err.contains("required for a Fastly purger"), "{err}");
        }
    }

    #[test]
    fn an_unset_token_env_is_named() {
        let s = spec(ProviderKind::Fastly, Some("x"));
        let err = token_from_env(&id(), &s).unwrap_err().to_string();
        assert!(
            err.contains("providers.primary.token_env is not set"),
            "{err}"
        );
    }
}
