//! Route 53 health checks against wiremock stubs: the exact check made from the policy,
//! `HealthCheckAlreadyExists` resolved without a duplicate, checker reports read back as
//! observations, and a policy Route 53 cannot check refused before any request.

// Helpers outside `#[test]` functions unwrap too: a failed setup should fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::{FailReason, Outcome, Policy, ProviderId, RegionId, Secret};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::route53::health::checker_regions;
use multicdn_providers::route53::{AwsCredentials, HealthCheckSpec, Route53Client, Route53Steerer};
use wiremock::matchers::{header_regex, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HEALTHCHECK: &str = "/2013-04-01/healthcheck";

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn policy() -> Policy {
    Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap()
}

fn client(server: &MockServer) -> Route53Client {
    let settings = HttpSettings::default()
        .with_max_attempts(2)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(2));
    Route53Client::new(
        &server.uri(),
        AwsCredentials::new("AKID", Secret::new("secret")),
        settings,
    )
    .unwrap()
}

fn xml(status: u16, body: impl Into<String>) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_raw(body.into(), "text/xml")
}

fn list(checks: &[(&str, &str)]) -> String {
    let items: String = checks
        .iter()
        .map(|(id, reference)| {
            format!(
                "<HealthCheck><Id>{id}</Id><CallerReference>{reference}</CallerReference><HealthCheckConfig><Type>HTTPS_STR_MATCH</Type></HealthCheckConfig><HealthCheckVersion>1</HealthCheckVersion></HealthCheck>"
            )
        })
        .collect();
    format!(
        r#"<ListHealthChecksResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><HealthChecks>{items}</HealthChecks><Marker></Marker><IsTruncated>false</IsTruncated><MaxItems>100</MaxItems></ListHealthChecksResponse>"#
    )
}

fn created(id: &str, reference: &str) -> String {
    format!(
        r#"<CreateHealthCheckResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><HealthCheck><Id>{id}</Id><CallerReference>{reference}</CallerReference><HealthCheckConfig><Type>HTTPS_STR_MATCH</Type></HealthCheckConfig><HealthCheckVersion>1</HealthCheckVersion></HealthCheck></CreateHealthCheckResponse>"#
    )
}

fn spec(policy: &Policy, provider: &str) -> HealthCheckSpec {
    let edge = &policy.providers[&p(provider)].edge_host;
    HealthCheckSpec::new(
        p(provider),
        edge,
        &policy.health,
        checker_regions(&policy.health).unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn each_provider_gets_one_string_match_check_from_the_policy() {
    let server = MockServer::start().await;
    let policy = policy();
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(HEALTHCHECK))
        .respond_with(xml(200, list(&[])))
        .mount(&server)
        .await;
    let cf = spec(&policy, "cloudflare").caller_reference();
    let fastly = spec(&policy, "fastly").caller_reference();
    Mock::given(method("POST"))
        .and(path(HEALTHCHECK))
        .and(wiremock::matchers::body_string_contains(
            "example.cdn.cloudflare.net",
        ))
        .respond_with(xml(201, created("hc-c", &cf)))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(HEALTHCHECK))
        .and(wiremock::matchers::body_string_contains(
            "example.map.fastly.net",
        ))
        .respond_with(xml(201, created("hc-f", &fastly)))
        .mount(&server)
        .await;
    let mut steerer = Route53Steerer::from_policy(client(&server), "Z1", &policy);
    let ids = steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap();
    assert_eq!(
        ids,
        [
            (p("cloudflare"), "hc-c".to_owned()),
            (p("fastly"), "hc-f".to_owned())
        ]
        .into()
    );
    assert_eq!(steerer.health_checks(), &ids);

    let posts: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST")
        .map(|r| String::from_utf8(r.body).unwrap())
        .collect();
    assert_eq!(posts.len(), 2);
    let fastly_body = posts.iter().find(|b| b.contains("fastly")).unwrap();
    let want = format!(
        "<CreateHealthCheckRequest xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><CallerReference>{fastly}</CallerReference><HealthCheckConfig><Port>443</Port><Type>HTTPS_STR_MATCH</Type><ResourcePath>/_health/v3.txt</ResourcePath><FullyQualifiedDomainName>example.map.fastly.net</FullyQualifiedDomainName><SearchString>healthy-v3</SearchString><RequestInterval>30</RequestInterval><FailureThreshold>2</FailureThreshold><MeasureLatency>false</MeasureLatency><Inverted>false</Inverted><Disabled>false</Disabled><EnableSNI>true</EnableSNI><Regions><Region>eu-west-1</Region><Region>us-east-1</Region><Region>us-west-2</Region><Region>ap-southeast-1</Region><Region>sa-east-1</Region></Regions></HealthCheckConfig></CreateHealthCheckRequest>"
    );
    assert!(fastly_body.ends_with(&want), "{fastly_body}");
}

#[tokio::test]
async fn existing_checks_are_reused_and_already_exists_is_resolved_without_a_duplicate() {
    let server = MockServer::start().await;
    let policy = policy();
    let cf = spec(&policy, "cloudflare").caller_reference();
    let fastly = spec(&policy, "fastly").caller_reference();
    // The first listing shows only cloudflare's check; fastly's appears by the time the
    // create races into HealthCheckAlreadyExists.
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(HEALTHCHECK))
        .respond_with(xml(200, list(&[("hc-c", &cf)])))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(HEALTHCHECK))
        .respond_with(xml(
            200,
            list(&[("hc-c", &cf), ("hc-f", &fastly), ("other", "someone-else")]),
        ))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header_regex("authorization", "^AWS4-HMAC-SHA256 Credential="))
        .and(path(HEALTHCHECK))
        .respond_with(xml(
            409,
            r#"<ErrorResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Error><Type>Sender</Type><Code>HealthCheckAlreadyExists</Code><Message>A health check with this caller reference already exists.</Message></Error><RequestId>r</RequestId></ErrorResponse>"#,
        ))
        .expect(1)
        .mount(&server)
        .await;
    let mut steerer = Route53Steerer::from_policy(client(&server), "Z1", &policy);
    let ids = steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap();
    assert_eq!(
        ids,
        [
            (p("cloudflare"), "hc-c".to_owned()),
            (p("fastly"), "hc-f".to_owned())
        ]
        .into()
    );
}

#[tokio::test]
async fn checker_reports_are_read_back_as_observations() {
    let server = MockServer::start().await;
    let body = r#"<GetHealthCheckStatusResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><HealthCheckObservations>
<HealthCheckObservation><Region>eu-west-1</Region><IPAddress>15.177.62.21</IPAddress><StatusReport><Status>Success: HTTP Status Code 200, OK</Status><CheckedTime>2026-11-30T12:00:01Z</CheckedTime></StatusReport></HealthCheckObservation>
<HealthCheckObservation><Region>us-east-1</Region><IPAddress>15.177.2.21</IPAddress><StatusReport><Status>Failure: HTTP Status Code 503, Service Unavailable</Status><CheckedTime>2026-11-30T12:00:02Z</CheckedTime></StatusReport></HealthCheckObservation>
<HealthCheckObservation><Region>sa-east-1</Region><IPAddress>15.177.42.21</IPAddress><StatusReport><Status>Failure: The response body did not contain the search string.</Status><CheckedTime>2026-11-30T12:00:03Z</CheckedTime></StatusReport></HealthCheckObservation>
</HealthCheckObservations></GetHealthCheckStatusResponse>"#;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path("/2013-04-01/healthcheck/hc-f/status"))
        .respond_with(xml(200, body))
        .mount(&server)
        .await;
    let checks = [(p("fastly"), "hc-f".to_owned())].into();
    let obs = client(&server)
        .health_observations(&checks, "healthy-v3")
        .await
        .unwrap();
    assert_eq!(obs.len(), 3);
    assert!(obs.iter().all(|o| o.provider == p("fastly")));
    assert_eq!(obs[0].runner, RegionId::new("route53-eu-west-1").unwrap());
    assert!(obs[0].passed());
    assert_eq!(
        obs[1].outcome,
        Outcome::Fail {
            reason: FailReason::Status { got: 503 }
        }
    );
    assert_eq!(obs[1].status, Some(503));
    assert_eq!(
        obs[2].outcome,
        Outcome::Fail {
            reason: FailReason::ContentMismatch {
                expected: "healthy-v3".into()
            }
        }
    );
    assert_eq!(obs[2].at.to_string(), "2026-11-30T12:00:03Z");
}

#[tokio::test]
async fn a_policy_with_too_few_checker_regions_is_refused_before_any_request() {
    let server = MockServer::start().await;
    let mut policy = policy();
    policy.health.regions = vec![
        RegionId::new("eu-west").unwrap(),
        RegionId::new("office").unwrap(),
    ];
    let mut steerer = Route53Steerer::from_policy(client(&server), "Z1", &policy);
    let err = steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("at least 3") && text.contains("us-east-1"),
        "{text}"
    );
    let err = steerer
        .provision_health_checks(
            &policy,
            Some(vec![
                "eu-west-1".into(),
                "mars-1".into(),
                "us-east-1".into(),
            ]),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("mars-1"), "{err}");
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_check_edited_since_it_was_made_is_put_back_at_its_version_and_a_lookup_writes_nothing() {
    let server = MockServer::start().await;
    let policy = policy();
    let cf = spec(&policy, "cloudflare").caller_reference();
    let fastly = spec(&policy, "fastly").caller_reference();
    let config = |fqdn: &str, search: &str, disabled: bool| {
        format!(
            "<HealthCheckConfig><Port>443</Port><Type>HTTPS_STR_MATCH</Type><ResourcePath>/_health/v3.txt</ResourcePath><FullyQualifiedDomainName>{fqdn}</FullyQualifiedDomainName><SearchString>{search}</SearchString><RequestInterval>30</RequestInterval><FailureThreshold>2</FailureThreshold><Inverted>false</Inverted><Disabled>{disabled}</Disabled><EnableSNI>true</EnableSNI><Regions><Region>us-east-1</Region><Region>eu-west-1</Region><Region>us-west-2</Region><Region>ap-southeast-1</Region><Region>sa-east-1</Region></Regions></HealthCheckConfig>"
        )
    };
    // Cloudflare's check is as made; someone disabled fastly's and changed its string.
    let listing = format!(
        r#"<ListHealthChecksResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><HealthChecks><HealthCheck><Id>hc-c</Id><CallerReference>{cf}</CallerReference>{}<HealthCheckVersion>1</HealthCheckVersion></HealthCheck><HealthCheck><Id>hc-f</Id><CallerReference>{fastly}</CallerReference>{}<HealthCheckVersion>7</HealthCheckVersion></HealthCheck></HealthChecks><Marker></Marker><IsTruncated>false</IsTruncated><MaxItems>100</MaxItems></ListHealthChecksResponse>"#,
        config("example.cdn.cloudflare.net", "healthy-v3", false),
        config("example.map.fastly.net", "whatever", true),
    );
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(HEALTHCHECK))
        .respond_with(xml(200, listing))
        .mount(&server)
        .await;
    let want = "<UpdateHealthCheckRequest xmlns=\"https://route53.amazonaws.com/doc/2013-04-01/\"><HealthCheckVersion>7</HealthCheckVersion><Port>443</Port><ResourcePath>/_health/v3.txt</ResourcePath><FullyQualifiedDomainName>example.map.fastly.net</FullyQualifiedDomainName><SearchString>healthy-v3</SearchString><FailureThreshold>2</FailureThreshold><Inverted>false</Inverted><Disabled>false</Disabled><EnableSNI>true</EnableSNI><Regions><Region>eu-west-1</Region><Region>us-east-1</Region><Region>us-west-2</Region><Region>ap-southeast-1</Region><Region>sa-east-1</Region></Regions></UpdateHealthCheckRequest>";
    Mock::given(method("POST"))
        .and(path("/2013-04-01/healthcheck/hc-f"))
        .and(wiremock::matchers::header_exists("authorization"))
        .and(wiremock::matchers::body_string_contains(want))
        .respond_with(xml(
            200,
            format!(
                r#"<UpdateHealthCheckResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><HealthCheck><Id>hc-f</Id><CallerReference>{fastly}</CallerReference>{}<HealthCheckVersion>8</HealthCheckVersion></HealthCheck></UpdateHealthCheckResponse>"#,
                config("example.map.fastly.net", "healthy-v3", false)
            ),
        ))
        .expect(1)
        .mount(&server)
        .await;

    let mut steerer = Route53Steerer::from_policy(client(&server), "Z1", &policy);
    // A dry run's lookup names what differs and sends nothing that writes.
    let found = steerer.find_health_checks(&policy, None).await.unwrap();
    let fastly_found = found
        .iter()
        .find(|f| f.spec.provider == p("fastly"))
        .unwrap();
    assert_eq!(fastly_found.id.as_deref(), Some("hc-f"));
    assert_eq!(
        fastly_found.differences,
        [
            "SearchString: whatever -> healthy-v3",
            "Disabled: true -> false"
        ]
    );
    assert!(
        found
            .iter()
            .find(|f| f.spec.provider == p("cloudflare"))
            .unwrap()
            .differences
            .is_empty()
    );
    let writes = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() != "GET")
        .count();
    assert_eq!(writes, 0);

    let ids = steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap();
    assert_eq!(
        ids,
        [
            (p("cloudflare"), "hc-c".to_owned()),
            (p("fastly"), "hc-f".to_owned())
        ]
        .into()
    );
}
