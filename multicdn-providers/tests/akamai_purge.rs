//! The Akamai purger against the strict Fast Purge stub: every object type, both networks,
//! invalidate and delete, batching by body size, 429 retried, problem-details errors, and a
//! signature made with the wrong secret refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::policy::AkamaiNetwork;
use multicdn_core::{Error, ProviderId, PurgeRequest, PurgeScope, Purger, Secret};
use multicdn_providers::akamai::{AkamaiPurger, EdgeGridCredentials};
use multicdn_providers::http::HttpSettings;
use multicdn_test_support::{AkamaiApi, Fault};

const CT: &str = "akab-client-token-xxx-xxxxxxxxxxxxxxxx";
const CS: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx=";
const AT: &str = "akab-access-token-xxx-xxxxxxxxxxxxxxxx";

fn creds(secret: &str) -> EdgeGridCredentials {
    EdgeGridCredentials {
        client_token: Secret::new(CT),
        client_secret: Secret::new(secret),
        access_token: Secret::new(AT),
    }
}

fn purger(api: &AkamaiApi, network: AkamaiNetwork, secret: &str) -> AkamaiPurger {
    let settings = HttpSettings::default()
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .with_max_attempts(3);
    AkamaiPurger::new(
        ProviderId::new("akamai").unwrap(),
        "www.example.com.edgekey.net",
        "akab-abcdefghijklmnop-qrstuvwxyz012345.luna.akamaiapis.net",
        network,
        vec![12345, 67890],
        creds(secret),
        Some(&api.base()),
        settings,
    )
    .unwrap()
}

fn req(scope: PurgeScope, soft: bool) -> PurgeRequest {
    let mut r = PurgeRequest::everything();
    r.scope = scope;
    r.soft = soft;
    r
}

#[tokio::test]
async fn each_kind_on_each_network_is_signed_and_accepted() {
    let api = AkamaiApi::start(CT, CS, AT).await.unwrap();
    let prod = purger(&api, AkamaiNetwork::Production, CS);
    let staging = purger(&api, AkamaiNetwork::Staging, CS);
    let urls = PurgeScope::Urls(vec!["https://www.example.com/a.css".into()]);
    let r = prod.purge(&req(urls, true)).await.unwrap();
    assert_eq!(r.purge_ids.len(), 1);
    staging
        .purge(&req(
            PurgeScope::Tags(vec!["product-1".into(), "product-2".into()]),
            false,
        ))
        .await
        .unwrap();
    prod.purge(&req(PurgeScope::Everything, false))
        .await
        .unwrap();
    let got: Vec<(String, String, String, usize)> = api
        .purged()
        .into_iter()
        .map(|(a, k, n, o)| (a, k, n, o.len()))
        .collect();
    assert_eq!(
        got,
        [
            ("invalidate".into(), "url".into(), "production".into(), 1),
            ("delete".into(), "tag".into(), "staging".into(), 2),
            ("delete".into(), "cpcode".into(), "production".into(), 2),
        ]
    );
    assert!(api.refused().is_empty(), "{:?}", api.refused());
    // Hosts are not a Fast Purge object: refused before sending.
    let e = prod
        .purge(&req(
            PurgeScope::Hosts(vec!["www.example.com".into()]),
            false,
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

#[tokio::test]
async fn urls_past_the_body_limit_are_cut_into_requests_within_it() {
    let api = AkamaiApi::start(CT, CS, AT).await.unwrap();
    let p = purger(&api, AkamaiNetwork::Production, CS);
    let urls: Vec<String> = (0..1_200)
        .map(|i| format!("https://www.example.com/assets/{i:0>70}.js"))
        .collect();
    let r = p
        .purge(&req(PurgeScope::Urls(urls.clone()), false))
        .await
        .unwrap();
    let purged = api.purged();
    assert!(purged.len() >= 2, "{}", purged.len());
    assert_eq!(r.purge_ids.len(), purged.len());
    let sent: usize = purged.iter().map(|(_, _, _, o)| o.len()).sum();
    assert_eq!(sent, urls.len());
    assert!(api.refused().is_empty());
}

#[tokio::test]
async fn a_429_is_retried_after_its_wait() {
    let api = AkamaiApi::start(CT, CS, AT).await.unwrap();
    let p = purger(&api, AkamaiNetwork::Production, CS);
    api.set_fault(Fault::RateLimited);
    let r = p
        .purge(&req(PurgeScope::Tags(vec!["t".into()]), false))
        .await
        .unwrap();
    assert_eq!(r.attempts, 2);
    assert_eq!(api.refused().first().map(|r| r.0), Some(429));
}

#[tokio::test]
async fn a_refusal_carries_akamais_code_and_detail() {
    let api = AkamaiApi::start(CT, CS, AT).await.unwrap();
    let p = purger(&api, AkamaiNetwork::Production, CS);
    api.set_max_body(100);
    let urls: Vec<String> = (0..5)
        .map(|i| format!("https://www.example.com/{i:0>40}"))
        .collect();
    let e = p
        .purge(&req(PurgeScope::Urls(urls), false))
        .await
        .unwrap_err();
    match &e {
        Error::Vendor {
            status,
            code,
            message,
            retryable,
            ..
        } => {
            assert_eq!(*status, 413);
            assert_eq!(code.as_deref(), Some("Request entity too large"));
            assert!(
                message.contains("at most 100") && message.contains("supportId"),
                "{message}"
            );
            assert!(!retryable);
        }
        other => panic!("expected a vendor error, got {other}"),
    }
}

#[tokio::test]
async fn a_signature_with_the_wrong_secret_is_an_auth_error() {
    let api = AkamaiApi::start(CT, CS, AT).await.unwrap();
    let p = purger(&api, AkamaiNetwork::Production, "not-the-secret");
    let e = p
        .purge(&req(PurgeScope::Tags(vec!["t".into()]), false))
        .await
        .unwrap_err();
    match &e {
        Error::Auth {
            status, message, ..
        } => {
            assert_eq!(*status, 401);
            assert!(message.contains("signature does not match"), "{message}");
        }
        other => panic!("expected an auth error, got {other}"),
    }
    assert!(api.purged().is_empty());
    assert!(!e.to_string().contains("not-the-secret"));
}

mod support;

#[tokio::test]
async fn the_fanout_purges_fastly_cloudflare_and_akamai_together() {
    use multicdn_providers::cloudflare::CloudflareLimits;
    use multicdn_providers::fanout::{FanoutMember, PurgeFanout};
    use std::sync::Arc;
    let vendors = multicdn_test_support::PurgeApi::start().await.unwrap();
    let akamai = AkamaiApi::start(CT, CS, AT).await.unwrap();
    let settings = support::vendors::fast(3);
    let fanout = PurgeFanout::new([
        FanoutMember::new(Arc::new(support::vendors::fastly(
            &vendors.fastly_base(),
            settings.clone(),
        ))),
        FanoutMember::new(Arc::new(support::vendors::cloudflare(
            &vendors.cloudflare_base(),
            CloudflareLimits::default(),
            settings,
        ))),
        FanoutMember::new(Arc::new(purger(&akamai, AkamaiNetwork::Production, CS))),
    ]);
    let report = fanout
        .purge(&PurgeRequest::tags(["product-1", "product-2"]))
        .await
        .unwrap();
    let mut providers: Vec<String> = report
        .receipts
        .iter()
        .map(|r| r.provider.to_string())
        .collect();
    providers.sort();
    assert_eq!(providers, ["akamai", "cloudflare", "fastly"]);
    assert_eq!(akamai.purged().len(), 1);
    assert_eq!(akamai.purged()[0].3.len(), 2);
    assert!(!vendors.purged().is_empty());
}
