//! The shared vendor HTTP layer against wiremock on loopback: what is retried and what is not,
//! `Retry-After` and `Fastly-RateLimit-Reset`, pacing, connection errors, base URLs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use multicdn_core::{Error, ManualClock, Stopwatch, Timestamp};
use multicdn_providers::http::{Answer, HttpSettings, Pacer, RateLimit, ReadResult, VendorHttp};
use reqwest::Method;
use support::vendors::{fast, pid};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn client(base: &str, settings: HttpSettings) -> VendorHttp {
    VendorHttp::new(pid("vendor"), base, settings).unwrap()
}

/// Reads 2xx as the body text, anything else through `status_error`.
fn reader(http: &VendorHttp) -> impl Fn(&Answer) -> ReadResult<String> + '_ {
    move |a: &Answer| {
        if a.status.is_success() {
            Ok(a.text())
        } else {
            Err(http.status_error("POST /thing", a, Some("E1".into()), a.text()))
        }
    }
}

async fn send(http: &VendorHttp) -> Result<multicdn_providers::http::Sent<String>, Error> {
    http.send(
        "POST /thing",
        || http.request(Method::POST, "/thing"),
        reader(http),
    )
    .await
}

#[tokio::test]
async fn a_retry_after_is_waited_for_even_when_longer_than_the_backoff() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0.2"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(200).set_body_string("done"))
        .mount(&server)
        .await;
    let http = client(&server.uri(), fast(3));
    let watch = Stopwatch::start();
    let sent = send(&http).await.unwrap();
    assert!(
        watch.elapsed() >= Duration::from_millis(200),
        "{:?}",
        watch.elapsed()
    );
    assert_eq!((sent.value.as_str(), sent.attempts), ("done", 2));
}

#[tokio::test]
async fn fastly_rate_limit_reset_is_read_against_the_clock() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(429).insert_header("Fastly-RateLimit-Reset", "1000"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    // The clock stands 150 ms before the reset.
    let clock = ManualClock::new(Timestamp::from_millis(999_850));
    let http = client(&server.uri(), fast(3)).with_clock(Arc::new(clock));
    let watch = Stopwatch::start();
    assert_eq!(send(&http).await.unwrap().attempts, 2);
    assert!(
        watch.elapsed() >= Duration::from_millis(150),
        "{:?}",
        watch.elapsed()
    );
}

#[tokio::test]
async fn client_errors_are_not_retried_and_carry_the_vendor_code() {
    for status in [400u16, 401, 403, 404] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/thing"))
            .respond_with(ResponseTemplate::new(status).set_body_string("nope"))
            .expect(1)
            .mount(&server)
            .await;
        let http = client(&server.uri(), fast(4));
        let e = send(&http).await.unwrap_err();
        assert!(!e.is_retryable(), "{status}: {e:?}");
        assert_eq!(e.is_auth(), status == 401 || status == 403, "{status}");
        assert!(
            e.to_string().contains("POST /thing") && e.to_string().contains("nope"),
            "{e}"
        );
        if status == 400 {
            assert!(e.to_string().contains("(E1)"), "{e}");
        }
    }
}

#[tokio::test]
async fn server_errors_are_retried_up_to_the_attempt_limit() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(502))
        .expect(4)
        .mount(&server)
        .await;
    let e = send(&client(&server.uri(), fast(4))).await.unwrap_err();
    assert!(e.is_retryable() && e.may_have_applied(), "{e:?}");
}

#[tokio::test]
async fn a_refused_connection_is_retried_then_reported_as_not_applied() {
    // Bind and drop a listener to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = client(&format!("http://127.0.0.1:{port}"), fast(3));
    let e = send(&http).await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(e.is_retryable() && !e.may_have_applied(), "{e:?}");
    assert!(e.to_string().contains("could not connect"), "{e}");
}

#[tokio::test]
async fn a_client_rate_limit_paces_requests() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(200))
        .expect(5)
        .mount(&server)
        .await;
    let http = client(&server.uri(), fast(1)).with_rate_limit(RateLimit::new(50.0, 1));
    assert_eq!(http.rate_limit(), Some(RateLimit::new(50.0, 1)));
    let watch = Stopwatch::start();
    for _ in 0..5 {
        send(&http).await.unwrap();
    }
    // One at once, then four 20 ms periods.
    assert!(
        watch.elapsed() >= Duration::from_millis(80),
        "{:?}",
        watch.elapsed()
    );
}

#[tokio::test]
async fn a_shared_pacer_is_one_budget_for_every_client() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let budget = Pacer::new("account", RateLimit::new(50.0, 2));
    let a = client(&server.uri(), fast(1));
    let b = client(&server.uri(), fast(1));
    let watch = Stopwatch::start();
    for http in [&a, &b, &a, &b] {
        http.send_paced(
            "POST /thing",
            &[(&budget, 1)],
            || http.request(Method::POST, "/thing"),
            reader(http),
        )
        .await
        .unwrap();
    }
    // Two from the bucket, two more at 20 ms each.
    assert!(
        watch.elapsed() >= Duration::from_millis(40),
        "{:?}",
        watch.elapsed()
    );
}

#[test]
fn plain_http_is_refused_off_loopback() {
    let e = VendorHttp::new(
        pid("vendor"),
        "http://api.example.com",
        HttpSettings::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("plain HTTP"), "{e}");
    assert!(
        VendorHttp::new(
            pid("vendor"),
            "https://api.example.com",
            HttpSettings::default()
        )
        .is_ok()
    );
}

#[tokio::test]
async fn an_endless_body_is_cut_off_at_the_limit_with_a_classified_error() {
    // A 2 GiB chunked body, no Content-Length: read no further than the limit.
    let app = axum::Router::new().route(
        "/thing",
        axum::routing::post(|| async {
            let chunk = axum::body::Bytes::from(vec![b'x'; 1 << 20]);
            let stream = futures::stream::iter(
                (0..2048).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
            );
            axum::body::Body::from_stream(stream)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let http = client(
        &format!("http://{addr}"),
        fast(3).with_max_body_bytes(4 << 20),
    );
    let e = send(&http).await.unwrap_err();
    assert!(matches!(e, Error::UnexpectedResponse { .. }), "{e:?}");
    assert!(!e.is_retryable(), "{e:?}");
    assert!(
        e.to_string().contains("larger than the 4194304 bytes"),
        "{e}"
    );
    server.abort();
}

#[tokio::test]
async fn a_content_length_above_the_limit_is_refused_before_reading() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/thing"))
        .respond_with(ResponseTemplate::new(200).set_body_string("y".repeat(2048)))
        .expect(2)
        .mount(&server)
        .await;
    let http = client(&server.uri(), fast(3).with_max_body_bytes(1024));
    let e = send(&http).await.unwrap_err();
    assert!(e.to_string().contains("Content-Length 2048"), "{e}");
    // Under the limit, the same answer reads whole.
    let http = client(&server.uri(), fast(3).with_max_body_bytes(4096));
    assert_eq!(send(&http).await.unwrap().value.len(), 2048);
}
