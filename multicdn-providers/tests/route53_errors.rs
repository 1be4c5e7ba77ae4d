//! Route 53 against wiremock stubs of its real answers: throttling retried, errors surfaced
//! with Route 53's code and messages, paging guarded, invalid plans refused before any
//! request, requests signed, large change sets split in order.

// Helpers outside `#[test]` functions unwrap too: a failed setup should fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use multicdn_core::{
    ApplyOptions, CohortId, CohortPlan, Error, ManualClock, NetworkKey, ProviderId, Secret,
    Steerer, SteeringPlan, Timestamp, Weights,
};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::route53::{AwsCredentials, Route53Client, Route53Steerer};
use wiremock::matchers::{header_regex, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const ZONE: &str = "Z0123456789";
const RRSET: &str = "/2013-04-01/hostedzone/Z0123456789/rrset";
const CHANGE: &str = "/2013-04-01/hostedzone/Z0123456789/rrset/";

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn fast() -> HttpSettings {
    HttpSettings::default()
        .with_request_timeout(Duration::from_secs(5))
        .with_max_attempts(4)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
}

fn edges() -> BTreeMap<ProviderId, String> {
    [
        (p("fastly"), "example.map.fastly.net".to_owned()),
        (p("cloudflare"), "example.cdn.cloudflare.net".to_owned()),
    ]
    .into()
}

fn steerer(server: &MockServer) -> Route53Steerer {
    let creds = AwsCredentials::new(
        "AKIDEXAMPLE",
        Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
    );
    let clock = ManualClock::new(Timestamp::parse_rfc3339("2026-11-30T12:00:00Z").unwrap());
    let client = Route53Client::new(&server.uri(), creds, fast())
        .unwrap()
        .with_clock(std::sync::Arc::new(clock));
    Route53Steerer::new(client, ZONE, "example.com", "www.example.com", edges())
        .with_sync_wait(Duration::from_secs(1), Duration::from_millis(1))
}

fn cohort(name: &str, networks: &[&str], weights: Weights) -> CohortPlan {
    CohortPlan {
        cohort: CohortId::new(name).unwrap(),
        networks: networks.iter().map(|n| n.parse().unwrap()).collect(),
        weights,
    }
}

fn split(fastly: f64) -> Weights {
    Weights::from_percentages([(p("fastly"), fastly), (p("cloudflare"), 100.0 - fastly)]).unwrap()
}

fn plan() -> SteeringPlan {
    SteeringPlan {
        record: "www.example.com".into(),
        ttl: Duration::from_secs(30),
        cohorts: vec![
            cohort("europe", &["DE", "FR"], split(90.0)),
            cohort("default", &["*"], split(50.0)),
        ],
    }
}

const EMPTY_LIST: &str = r#"<?xml version="1.0"?>
<ListResourceRecordSetsResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><ResourceRecordSets></ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>300</MaxItems></ListResourceRecordSetsResponse>"#;

fn change_info(status: &str) -> String {
    format!(
        r#"<?xml version="1.0"?><ChangeResourceRecordSetsResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><ChangeInfo><Id>/change/C1</Id><Status>{status}</Status><SubmittedAt>2026-11-30T12:00:00Z</SubmittedAt></ChangeInfo></ChangeResourceRecordSetsResponse>"#
    )
}

fn error(code: &str, message: &str) -> String {
    format!(
        r#"<?xml version="1.0"?><ErrorResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error><RequestId>r-1</RequestId></ErrorResponse>"#
    )
}

fn xml(status: u16, body: impl Into<String>) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_raw(body.into(), "text/xml")
}

#[tokio::test]
async fn throttling_and_prior_request_not_complete_are_retried_until_they_pass() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(400, error("Throttling", "Rate exceeded")))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(200, EMPTY_LIST))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(CHANGE))
        .respond_with(xml(
            400,
            error(
                "PriorRequestNotComplete",
                "The request was rejected because Route 53 was still processing a prior request.",
            ),
        ))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(CHANGE))
        .respond_with(xml(200, change_info("PENDING")))
        .mount(&server)
        .await;

    let diff = steerer(&server)
        .apply(&plan(), &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(diff.changes.len(), 2);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.method.as_str() == "GET")
            .count(),
        3
    );
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.method.as_str() == "POST")
            .count(),
        2
    );
}

#[tokio::test]
async fn throttling_that_never_ends_fails_as_throttling() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(400, error("Throttling", "Rate exceeded")))
        .mount(&server)
        .await;
    let err = steerer(&server).current().await.unwrap_err();
    match &err {
        Error::Vendor {
            code,
            status,
            retryable,
            ..
        } => {
            assert_eq!(code.as_deref(), Some("Throttling"));
            assert_eq!(*status, 400);
            assert!(*retryable);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}

#[tokio::test]
async fn an_invalid_change_batch_is_surfaced_with_every_message_and_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(200, EMPTY_LIST))
        .mount(&server)
        .await;
    let body = r#"<?xml version="1.0"?><InvalidChangeBatch xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Messages><Message>Tried to create resource record set [name='www.example.com.', type='CNAME', set-identifier='geo-DE'] but it already exists</Message><Message>RRSet with DNS name europe._steer.www.example.com. is not permitted in zone example.org.</Message></Messages><RequestId>r-2</RequestId></InvalidChangeBatch>"#;
    Mock::given(method("POST"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(CHANGE))
        .respond_with(xml(400, body))
        .mount(&server)
        .await;

    let err = steerer(&server)
        .apply(&plan(), &ApplyOptions::default())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("InvalidChangeBatch"), "{text}");
    assert!(
        text.contains("but it already exists") && text.contains("is not permitted in zone"),
        "{text}"
    );
    assert!(!err.is_retryable());
    let posts = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST")
        .count();
    assert_eq!(posts, 1);
}

#[tokio::test]
async fn a_missing_hosted_zone_says_so() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(
            404,
            error(
                "NoSuchHostedZone",
                "No hosted zone found with ID: Z0123456789",
            ),
        ))
        .mount(&server)
        .await;
    let err = steerer(&server).plan(&plan()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Vendor { code: Some(c), status: 404, .. } if c == "NoSuchHostedZone"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("No hosted zone found with ID: Z0123456789")
    );
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_server_repeating_a_page_is_an_error_not_a_loop() {
    let server = MockServer::start().await;
    let page = r#"<ListResourceRecordSetsResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><ResourceRecordSets><ResourceRecordSet><Name>www.example.com.</Name><Type>CNAME</Type><SetIdentifier>geo-DE</SetIdentifier><GeoLocation><CountryCode>DE</CountryCode></GeoLocation><TTL>30</TTL><ResourceRecords><ResourceRecord><Value>europe._steer.www.example.com</Value></ResourceRecord></ResourceRecords></ResourceRecordSet></ResourceRecordSets><IsTruncated>true</IsTruncated><NextRecordName>www.example.com.</NextRecordName><NextRecordType>CNAME</NextRecordType><MaxItems>1</MaxItems></ListResourceRecordSetsResponse>"#;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(200, page))
        .mount(&server)
        .await;
    let err = steerer(&server).current().await.unwrap_err();
    assert!(err.to_string().contains("repeated a page"), "{err}");
    assert!(server.received_requests().await.unwrap().len() <= 2);
}

#[tokio::test]
async fn plans_route53_cannot_express_are_refused_before_any_request() {
    let server = MockServer::start().await;
    let s = steerer(&server);
    let mut asn = plan();
    asn.cohorts
        .insert(0, cohort("comcast", &["AS7922"], split(50.0)));
    let mut tiny = plan();
    tiny.cohorts[0].weights = Weights::new([(p("fastly"), 9_990), (p("cloudflare"), 10)]).unwrap();
    let mut unknown = plan();
    unknown.cohorts[0].weights = Weights::single(p("akamai"));
    let mut outside = plan();
    outside.record = "www.example.org".into();
    for (bad, says) in [
        (asn, "ASN"),
        (tiny, "rounds to weight 0"),
        (unknown, "unknown provider akamai"),
        (outside, "outside the hosted zone"),
    ] {
        let err = s
            .apply(&bad, &ApplyOptions::default().force(true))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidRequest { .. }), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
        let err = s.plan(&bad).await.unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    // Weights that do not sum cannot even be built into a plan.
    let json = r#"{"record":"www.example.com","ttl":30000,"cohorts":[{"cohort":"default","networks":["*"],"weights":{"fastly":9000,"cloudflare":500}}]}"#;
    let err = serde_json::from_str::<SteeringPlan>(json).unwrap_err();
    assert!(
        err.to_string().contains("must sum to exactly 10000"),
        "{err}"
    );
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn requests_are_sigv4_signed_for_route53_at_the_clocks_time() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(200, EMPTY_LIST))
        .mount(&server)
        .await;
    steerer(&server).current().await.unwrap();
    let requests = server.received_requests().await.unwrap();
    let auth = requests[0]
        .headers
        .get("authorization")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/route53/aws4_request"
        ),
        "{auth}"
    );
    assert!(auth.contains("SignedHeaders=") && auth.contains("Signature="));
    assert_eq!(
        requests[0].headers.get("x-amz-date").unwrap(),
        "20261130T120000Z"
    );
    assert!(!auth.contains("wJalrXUtnFEMI"));
    assert!(
        requests[0]
            .url
            .query()
            .unwrap()
            .contains("name=www.example.com.")
    );
}

#[tokio::test]
async fn waiting_for_sync_polls_the_change_until_insync() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(200, EMPTY_LIST))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(CHANGE))
        .respond_with(xml(200, change_info("PENDING")))
        .mount(&server)
        .await;
    let get_change = |status: &str| {
        xml(
            200,
            change_info(status).replace("ChangeResourceRecordSetsResponse", "GetChangeResponse"),
        )
    };
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path("/2013-04-01/change/C1"))
        .respond_with(get_change("PENDING"))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path("/2013-04-01/change/C1"))
        .respond_with(get_change("INSYNC"))
        .mount(&server)
        .await;
    steerer(&server)
        .apply(&plan(), &ApplyOptions::default().wait_for_sync(true))
        .await
        .unwrap();
    let polls = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path() == "/2013-04-01/change/C1")
        .count();
    assert_eq!(polls, 3);
}

#[tokio::test]
async fn more_than_a_thousand_records_are_split_pools_first() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(RRSET))
        .respond_with(xml(200, EMPTY_LIST))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header_regex(
            "authorization",
            "^AWS4-HMAC-SHA256 Credential=",
        ))
        .and(path(CHANGE))
        .respond_with(xml(200, change_info("INSYNC")))
        .mount(&server)
        .await;
    let providers: Vec<ProviderId> = (0..11).map(|i| p(&format!("cdn{i}"))).collect();
    let edges: BTreeMap<ProviderId, String> = providers
        .iter()
        .map(|id| (id.clone(), format!("{id}.edge.example.net")))
        .collect();
    let countries: Vec<String> = (b'A'..=b'Z')
        .flat_map(|a| (b'A'..=b'Z').map(move |b| String::from_utf8(vec![a, b]).unwrap()))
        .filter(|c| {
            multicdn_core::Country::new(c)
                .ok()
                .and_then(|c| c.continent())
                .is_some()
        })
        .take(99)
        .collect();
    let weights = Weights::even(providers.clone()).unwrap();
    let mut cohorts: Vec<CohortPlan> = countries
        .iter()
        .map(|c| CohortPlan {
            cohort: CohortId::new(&format!("c-{}", c.to_ascii_lowercase())).unwrap(),
            networks: [NetworkKey::Country(multicdn_core::Country::new(c).unwrap())].into(),
            weights: weights.clone(),
        })
        .collect();
    cohorts.push(cohort("default", &["*"], weights.clone()));
    let big = SteeringPlan {
        record: "www.example.com".into(),
        ttl: Duration::from_secs(30),
        cohorts,
    };
    let s = steerer(&server);
    let s = Route53Steerer::new(
        s.client().clone(),
        ZONE,
        "example.com",
        "www.example.com",
        edges,
    );
    s.apply(&big, &ApplyOptions::default()).await.unwrap();
    let posts: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST")
        .map(|r| String::from_utf8(r.body).unwrap())
        .collect();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].matches("<Change>").count(), 1000);
    assert_eq!(posts[1].matches("<Change>").count(), 200);
    assert!(!posts[0].contains("<GeoLocation>"));
    assert_eq!(posts[1].matches("<GeoLocation>").count(), 100);
    assert!(posts[1].contains("(batch 2 of 2)"));
}
