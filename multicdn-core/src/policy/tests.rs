use super::*;

const EXAMPLE: &str = include_str!("../../../examples/policy.yaml");

fn invalid(src: &str) -> Vec<Diagnostic> {
    match Policy::from_yaml(src, "p.yaml") {
        Ok(_) => panic!("policy unexpectedly valid"),
        Err(e) => e.diagnostics().to_vec(),
    }
}

/// The example with one line replaced.
fn edit(from: &str, to: &str) -> String {
    assert!(EXAMPLE.contains(from), "example lacks {from:?}");
    EXAMPLE.replacen(from, to, 1)
}

fn line_of(src: &str, needle: &str) -> usize {
    src.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn the_shipped_example_validates() {
    let p = Policy::from_yaml(EXAMPLE, "examples/policy.yaml").unwrap();
    assert_eq!(p.providers.len(), 2);
    assert_eq!(p.health.quorum, 3);
    assert_eq!(p.health.regions.len(), 5);
    assert_eq!(
        p.steering.failover.steps,
        vec![Share::percent(50), Share::percent(100)]
    );
    assert_eq!(p.steering.failover.interval, Dur::secs(90));
    assert_eq!(p.cache.routes.len(), 4);
    assert_eq!(p.cache.defaults.stale_if_error, Dur::secs(7 * 86_400));
    let plan = p.static_plan();
    assert_eq!(plan.cohorts.len(), 4);
    assert_eq!(plan.cohorts[3].cohort.as_str(), "default");
    assert!(plan.check(Some(&p.provider_ids())).is_ok());
}

#[test]
fn an_unknown_key_names_its_line_and_column() {
    let src = edit("  quorum: 3 ", "  quorom: 3 ");
    let d = invalid(&src);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].position.line, line_of(&src, "quorom"));
    assert_eq!(d[0].position.column, 3);
    assert_eq!(d[0].path, "health.quorom");
    assert!(d[0].message.contains("quorom"), "{}", d[0].message);
    let shown = d[0].to_string();
    assert!(
        shown.starts_with(&format!("p.yaml:{}:3: health.quorom:", d[0].position.line)),
        "{shown}"
    );
}

#[test]
fn region_weights_that_sum_to_90_percent_are_refused_at_their_line() {
    let src = edit(
        "weights: { fastly: 85%, cloudflare: 15% }",
        "weights: { fastly: 75%, cloudflare: 15% }",
    );
    let d = invalid(&src);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].path, "steering.regions[1].weights");
    assert_eq!(d[0].position.line, line_of(&src, "fastly: 75%"));
    assert!(d[0].message.contains("sum to 90%"), "{}", d[0].message);
    assert!(d[0].message.contains("100%"), "{}", d[0].message);
}

#[test]
fn a_wrong_type_names_its_line_and_column() {
    let src = edit("  quorum: 3 ", "  quorum: three ");
    let d = invalid(&src);
    assert_eq!(d[0].position.line, line_of(&src, "quorum: three"));
    assert_eq!(d[0].path, "health.quorum");
    assert!(d[0].position.column >= 3);
}

#[test]
fn an_unknown_provider_lists_the_defined_ones() {
    let src = edit(
        "weights: { cloudflare: 90%, fastly: 10% }",
        "weights: { akamai: 90%, fastly: 10% }",
    );
    let d = invalid(&src);
    let unknown = d
        .iter()
        .find(|d| d.path == "steering.regions[2].weights.akamai")
        .unwrap();
    assert!(
        unknown.message.contains("cloudflare, fastly"),
        "{}",
        unknown.message
    );
    assert_eq!(unknown.position.line, line_of(&src, "akamai: 90%"));
}

#[test]
fn exactly_one_default_region_is_required() {
    let src = edit("match: [\"*\"]", "match: [BR]");
    let d = invalid(&src);
    assert!(
        d.iter()
            .any(|d| d.path == "steering.regions" && d.message.contains("exactly one"))
    );
}

#[test]
fn failover_steps_must_rise_to_100() {
    let d = invalid(&edit("steps: [50%, 100%]", "steps: [50%, 40%]"));
    assert_eq!(d[0].path, "steering.failover.steps");
    let d = invalid(&edit("steps: [50%, 100%]", "steps: [50%, 90%]"));
    assert!(d[0].message.contains("end at 100%"));
}

#[test]
fn route_patterns_must_compile() {
    let d = invalid(&edit("\"^/products/\"", "\"^/products/(\""));
    assert_eq!(d[0].path, "cache.routes[2].match");
    assert!(d[0].message.contains("regular expression"));
}

#[test]
fn floors_must_leave_room() {
    let d = invalid(&edit("measurement: 10%", "measurement: 60%"));
    assert_eq!(d[0].path, "steering.floors");
    assert!(d[0].message.contains("120%"), "{}", d[0].message);
}

#[test]
fn thresholds_out_of_range_are_refused() {
    let d = invalid(&edit("  quorum: 3 ", "  quorum: 6 "));
    assert!(
        d[0].message
            .contains("between 1 and the number of regions (5)")
    );
    let d = invalid(&edit("switch_back_factor: 1.5", "switch_back_factor: 0.5"));
    assert_eq!(d[0].path, "steering.rum.switch_back_factor");
    let d = invalid(&edit("timeout: 3s", "timeout: 45s"));
    assert_eq!(d[0].path, "health.timeout");
}

#[test]
fn every_problem_is_reported_at_once() {
    let src = edit("steps: [50%, 100%]", "steps: [100%, 50%]").replacen(
        "min_samples: 200",
        "min_samples: 0",
        1,
    );
    let d = invalid(&src);
    assert!(d.len() >= 2, "{d:?}");
}

#[test]
fn a_pin_needs_a_reason_and_valid_weights() {
    let d = invalid(&edit(
        "weights: { fastly: 50%, cloudflare: 50% }\n      until",
        "weights: { fastly: 50%, cloudflare: 40% }\n      until",
    ));
    assert_eq!(d[0].path, "steering.pins[0].weights");
}

#[test]
fn a_record_outside_its_zone_is_refused() {
    let d = invalid(&edit("zone: example.com", "zone: example.org"));
    assert_eq!(d[0].path, "steering.record");
}

#[test]
fn a_record_at_the_zone_apex_is_refused() {
    let d = invalid(&edit("zone: example.com", "zone: www.example.com"));
    assert_eq!(d[0].path, "steering.record");
    assert!(d[0].message.contains("zone apex"), "{:?}", d[0]);
}

#[test]
fn syntax_errors_give_a_position() {
    let d = invalid("providers: {\n  fastly: [\n");
    assert!(d[0].position.line >= 1);
}

#[test]
fn a_missing_file_is_a_read_error() {
    let e = Policy::load("/nonexistent/policy.yaml").unwrap_err();
    assert!(matches!(e, PolicyError::Read { .. }));
    assert!(e.to_string().contains("/nonexistent/policy.yaml"));
}

#[test]
fn header_names_must_be_tokens_and_values_single_lines() {
    let src = edit(
        "headers: { Cache-Control: \"private, no-store\" }",
        "headers: { \"X-A\\nset req.http.Evil = 1;\": ok, X-B: \"a\\r\\nInjected: 1\", X-Ok: \"fine\\tvalue\" }",
    );
    let d = invalid(&src);
    assert_eq!(d.len(), 2, "{d:?}");
    assert_eq!(d[0].path, "cache.routes[0].headers");
    assert!(d[0].message.contains("RFC 9110 token"), "{}", d[0].message);
    assert_eq!(d[1].path, "cache.routes[0].headers.X-B");
    assert!(d[1].message.contains("line break"), "{}", d[1].message);
    for diag in &d {
        assert!(!diag.to_string().contains('\n'), "{diag}");
    }
}

#[test]
fn a_value_folded_over_lines_is_quoted_on_one_line() {
    // A plain scalar continued after a blank line folds into "fastly\ns": the deserializer's
    // message quotes it, and a diagnostic is still one line, the break escaped.
    let src = edit("    kind: fastly\n", "    kind: fastly\n \n     s\n");
    let d = invalid(&src);
    let kind = d
        .iter()
        .find(|d| d.path == "providers.fastly.kind")
        .unwrap_or_else(|| panic!("no diagnostic for the kind in {d:?}"));
    assert!(kind.message.contains("fastly\\ns"), "{}", kind.message);
    assert_eq!(kind.position.line, line_of(&src, "kind: fastly"));
    for diag in &d {
        assert!(!diag.to_string().contains(['\n', '\r']), "{diag}");
    }
}

#[test]
fn strings_that_reach_a_renderer_carry_no_control_characters() {
    let src = edit("match: \"^/checkout\"", "match: \"^/check\\nout\"")
        .replacen("[currency, trade]", "[currency, \"tr ade\"]", 1)
        .replacen("[page, sort, colour, size]", "[page, \"a&b\"]", 1)
        .replacen("host: www.example.com", "host: \"www.example.com\\nX\"", 1);
    let paths: Vec<String> = invalid(&src).into_iter().map(|d| d.path).collect();
    for want in [
        "site.host",
        "cache.routes[0].match",
        "cache.cache_key.cookie_allowlist[1]",
        "cache.cache_key.query_allowlist[1]",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} in {paths:?}");
    }
}

#[test]
fn durations_are_bounded_by_what_the_vendors_accept() {
    let src = edit(
        "ttl_edge: 1h\n    ttl_browser",
        "ttl_edge: 18446744073709551615s\n    ttl_browser",
    )
    .replacen("ttl: 30s", "ttl: 2147483648s", 1)
    .replacen("interval: 90s", "interval: 31d", 1);
    let d = invalid(&src);
    let find = |p: &str| {
        d.iter()
            .find(|x| x.path == p)
            .unwrap_or_else(|| panic!("{p} in {d:?}"))
    };
    assert!(
        find("cache.defaults.ttl_edge")
            .message
            .contains("above 31536000 s"),
        "{d:?}"
    );
    assert!(
        find("steering.ttl").message.contains("above 2147483647 s"),
        "{d:?}"
    );
    assert!(
        find("steering.failover.interval")
            .message
            .contains("above 2592000 s"),
        "{d:?}"
    );
    // A year exactly is accepted (the example's immutable assets).
    assert!(Policy::from_yaml(EXAMPLE, "p.yaml").is_ok());
}

#[test]
fn countries_must_be_iso_codes() {
    let d = invalid(&edit("match: [GB, IE, DE", "match: [UK, IE, DE"));
    assert_eq!(d[0].path, "steering.regions[0].match", "{d:?}");
    assert!(d[0].message.contains("ISO 3166-1"), "{}", d[0].message);
}

#[test]
fn every_problem_gets_its_own_path_and_a_missing_key_is_named_under_its_parent() {
    let src = edit("    edge_host: example.map.fastly.net\n", "")
        .replacen("quorum: 3 ", "quorom: 3 ", 1)
        .replacen("percentile: 75", "percentile: high", 1)
        .replacen("measurement: 10%", "measurement: 200%", 1);
    let d = invalid(&src);
    let paths: Vec<&str> = d.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "providers.fastly.edge_host",
            "health.quorom",
            "steering.rum.percentile",
            "steering.floors"
        ],
        "{d:?}"
    );
    assert_eq!(d[0].message, "missing field `edge_host`");
    assert_eq!(d[0].position.line, line_of(&src, "  fastly:"));
    assert_eq!(d[1].position.line, line_of(&src, "quorom"));
    assert_eq!(d[2].position.line, line_of(&src, "percentile: high"));
}

#[test]
fn required_sections_are_required() {
    let no_site = edit("site:\n  host: www.example.com\n", "");
    let d = invalid(&no_site);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].path, "site");
    assert!(
        d[0].message.contains("missing field `site`"),
        "{}",
        d[0].message
    );
    let start = EXAMPLE.find("\nhealth:").unwrap();
    let end = EXAMPLE.find("\nsteering:").unwrap();
    let neither = format!("{}{}", &EXAMPLE[..start], "\nfoo: 1\n").replacen(
        "site:\n  host: www.example.com\n",
        "",
        1,
    ) + &EXAMPLE[end..EXAMPLE.len()][..0];
    let paths: Vec<String> = invalid(&neither).into_iter().map(|d| d.path).collect();
    assert_eq!(paths, ["foo", "site", "health", "steering"]);
}

// ---- Configured standby, static fallback, drills ----

const STANDBY: &str = include_str!("../../../examples/policy-standby.yaml");

fn standby_edit(from: &str, to: &str) -> String {
    assert!(STANDBY.contains(from), "standby example lacks {from:?}");
    STANDBY.replacen(from, to, 1)
}

#[test]
fn the_shipped_standby_example_validates() {
    let p = Policy::from_yaml(STANDBY, "examples/policy-standby.yaml").unwrap();
    let cf = ProviderId::new("cloudflare").unwrap();
    let fastly = ProviderId::new("fastly").unwrap();
    assert!(p.is_standby(&cf) && !p.is_standby(&fastly));
    assert_eq!(p.floor_of(&cf), Share::default(), "a standby has no floor");
    assert_eq!(p.floor_of(&fastly), Share::percent(10));
    for c in &p.static_plan().cohorts {
        assert_eq!(c.weights.get(&cf), 0, "{}", c.cohort);
    }
    let targets = p.answer_targets();
    assert_eq!(
        targets.get(&Fallback::id()).map(String::as_str),
        Some("catalogue.example-static.net")
    );
    assert_eq!(targets.len(), 3);
    let fb = p.fallback_plan().unwrap();
    assert!(
        fb.cohorts
            .iter()
            .all(|c| c.weights.get(&Fallback::id()) == crate::TOTAL_BP)
    );
    assert_eq!(p.steering.drills.len(), 1);
    let d = &p.steering.drills[0];
    assert_eq!(d.hold, Dur::secs(3600));
    assert_eq!(d.abort.p90_rise, Dur::millis(150));
    // Live steering policies have no fallback plan.
    assert!(
        Policy::from_yaml(EXAMPLE, "p.yaml")
            .unwrap()
            .fallback_plan()
            .is_none()
    );
}

#[test]
fn a_standby_given_traffic_is_refused_at_the_region() {
    let src = standby_edit(
        "      match: [US, CA, MX]\n      weights: { fastly: 100%, cloudflare: 0% }",
        "      match: [US, CA, MX]\n      weights: { fastly: 90%, cloudflare: 10% }",
    );
    let d = invalid(&src);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].path, "steering.regions[1].weights.cloudflare");
    assert!(d[0].message.contains("standby"), "{}", d[0].message);
}

#[test]
fn a_standby_cannot_carry_a_commit_and_one_provider_must_be_live() {
    let d = invalid(&standby_edit(
        "    commits: {}",
        "    commits: { cloudflare: 20% }",
    ));
    assert!(
        d.iter().any(
            |d| d.path == "steering.floors.commits.cloudflare" && d.message.contains("standby")
        ),
        "{d:?}"
    );
    let both = standby_edit(
        "    token_env: FASTLY_API_TOKEN",
        "    token_env: FASTLY_API_TOKEN\n    standby: true",
    );
    let d = invalid(&both);
    assert!(
        d.iter()
            .any(|d| d.path == "providers" && d.message.contains("at least one must be live")),
        "{d:?}"
    );
}

#[test]
fn a_fallback_must_be_a_host_apart_from_every_cdn() {
    let d = invalid(&standby_edit(
        "host: catalogue.example-static.net",
        "host: \"not a host/\"",
    ));
    assert_eq!(d[0].path, "steering.fallback.host", "{d:?}");
    assert_eq!(
        d[0].position.line,
        line_of(
            &standby_edit(
                "host: catalogue.example-static.net",
                "host: \"not a host/\""
            ),
            "not a host"
        )
    );
    let d = invalid(&standby_edit(
        "host: catalogue.example-static.net",
        "host: example.map.fastly.net",
    ));
    assert!(d[0].message.contains("fastly's edge"), "{d:?}");
}

#[test]
fn a_drill_names_a_known_provider_region_and_a_sensible_share_and_hold() {
    let bad = standby_edit(
        "      to: cloudflare\n      share: 100%\n      hold: 1h",
        "      to: akamia\n      share: 0%\n      hold: 0s\n      cohorts: [europe, mars]",
    );
    let d = invalid(&bad);
    let paths: Vec<&str> = d.iter().map(|d| d.path.as_str()).collect();
    for want in [
        "steering.drills[0].to",
        "steering.drills[0].share",
        "steering.drills[0].hold",
        "steering.drills[0].cohorts[1]",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
    let to = d
        .iter()
        .find(|d| d.path == "steering.drills[0].to")
        .unwrap();
    assert_eq!(to.position.line, line_of(&bad, "to: akamia"));
    assert!(to.message.contains("akamia"), "{}", to.message);
    let twice = standby_edit(
        "  drills:\n",
        "  drills:\n    - { name: q1-standby, at: 2027-02-01T10:00:00Z, to: cloudflare, hold: 10m }\n",
    );
    let d = invalid(&twice);
    assert!(
        d.iter()
            .any(|d| d.path.ends_with(".name") && d.message.contains("twice")),
        "{d:?}"
    );
}

/// The example with an Akamai provider added after Cloudflare's entry (`extra` indented as
/// its fields).
fn with_akamai(fields: &str) -> String {
    edit(
        "    token_env: CLOUDFLARE_API_TOKEN\n",
        &format!(
            "    token_env: CLOUDFLARE_API_TOKEN\n  akamai:\n    kind: akamai\n    edge_host: www.example.com.edgekey.net\n{fields}"
        ),
    )
}

const AKAMAI_FIELDS: &str = "    api_host: akab-abcdefghijklmnop-qrstuvwxyz012345.luna.akamaiapis.net\n    network: staging\n    cp_codes: [12345, 67890]\n    client_token_env: AKAMAI_CLIENT_TOKEN\n    client_secret_env: AKAMAI_CLIENT_SECRET\n    access_token_env: AKAMAI_ACCESS_TOKEN\n";

#[test]
fn an_akamai_provider_reads_its_edgegrid_fields() {
    let p = Policy::from_yaml(&with_akamai(AKAMAI_FIELDS), "p.yaml").unwrap();
    let a = &p.providers[&ProviderId::new("akamai").unwrap()];
    assert_eq!(a.kind, ProviderKind::Akamai);
    assert_eq!(a.network, Some(AkamaiNetwork::Staging));
    assert_eq!(a.cp_codes, [12345, 67890]);
    assert_eq!(a.client_secret_env.as_deref(), Some("AKAMAI_CLIENT_SECRET"));
}

#[test]
fn a_bad_akamai_field_is_named_at_its_line() {
    // A host that is not an EdgeGrid API host.
    let src = with_akamai(&AKAMAI_FIELDS.replace(
        "akab-abcdefghijklmnop-qrstuvwxyz012345.luna.akamaiapis.net",
        "https://api.example.com/ccu",
    ));
    let d = invalid(&src);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].path, "providers.akamai.api_host");
    assert_eq!(d[0].position.line, line_of(&src, "api.example.com/ccu"));
    assert!(
        d[0].message.contains("EdgeGrid API host"),
        "{}",
        d[0].message
    );
    // A missing credential variable, named.
    let src =
        with_akamai(&AKAMAI_FIELDS.replace("    access_token_env: AKAMAI_ACCESS_TOKEN\n", ""));
    let d = invalid(&src);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].path, "providers.akamai");
    assert!(
        d[0].message.contains("`access_token_env`"),
        "{}",
        d[0].message
    );
    // A CP code of 0, a network that is not one, and token_env instead of EdgeGrid's three.
    let src = with_akamai(
        &(AKAMAI_FIELDS.replace("[12345, 67890]", "[12345, 0]") + "    token_env: AKAMAI_TOKEN\n"),
    );
    let d = invalid(&src);
    let at: Vec<(&str, usize)> = d
        .iter()
        .map(|d| (d.path.as_str(), d.position.line))
        .collect();
    assert_eq!(
        at,
        [
            (
                "providers.akamai.token_env",
                line_of(&src, "    token_env: AKAMAI_TOKEN")
            ),
            ("providers.akamai.cp_codes[1]", line_of(&src, "[12345, 0]")),
        ]
    );
    let src = with_akamai(&AKAMAI_FIELDS.replace("network: staging", "network: prod"));
    let d = invalid(&src);
    assert_eq!(d[0].path, "providers.akamai.network", "{d:?}");
    assert_eq!(d[0].position.line, line_of(&src, "network: prod"));
}

#[test]
fn akamai_fields_on_another_kind_are_refused() {
    let src = edit(
        "    plan: pro\n",
        "    plan: pro\n    network: staging\n    cp_codes: [1]\n",
    );
    let paths: Vec<String> = invalid(&src).into_iter().map(|d| d.path).collect();
    assert_eq!(
        paths,
        [
            "providers.cloudflare.network",
            "providers.cloudflare.cp_codes"
        ]
    );
}

// ---- The origin shield ----

#[test]
fn the_shield_section_is_read_and_each_bad_field_is_named_at_its_line() {
    let p = Policy::from_yaml(STANDBY, "examples/policy-standby.yaml").unwrap();
    let sh = p.shield.as_ref().unwrap();
    assert_eq!(sh.url, "http://shield.internal.example.com:6081/");
    assert_eq!(
        (sh.origin_host.as_str(), sh.origin_port),
        ("origin.internal.example.com", 8080)
    );
    assert_eq!(sh.purgers.len(), 2);
    assert!(
        Policy::from_yaml(EXAMPLE, "p.yaml")
            .unwrap()
            .shield
            .is_none()
    );

    let src = standby_edit(
        "  url: http://shield.internal.example.com:6081/",
        "  url: shield.internal.example.com",
    );
    let d = invalid(&src);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].path, "shield.url");
    assert_eq!(d[0].position.line, line_of(&src, "url: shield.internal"));

    let d = invalid(&standby_edit(
        "  purgers: [10.20.0.5, 10.20.0.6]",
        "  purgers: []",
    ));
    assert_eq!(d[0].path, "shield.purgers", "{d:?}");
    assert!(
        d[0].message.contains("every purge is missed"),
        "{}",
        d[0].message
    );

    let d = invalid(&standby_edit(
        "  origin_host: origin.internal.example.com",
        "  origin_host: example.map.fastly.net",
    ));
    assert_eq!(d[0].path, "shield.origin_host", "{d:?}");
    assert!(
        d[0].message.contains("never from a CDN"),
        "{}",
        d[0].message
    );

    // An address that is not one is a parse error at its line, naming the field.
    let src = standby_edit(
        "  purgers: [10.20.0.5, 10.20.0.6]",
        "  purgers: [10.20.0.500]",
    );
    let d = invalid(&src);
    assert!(d[0].path.starts_with("shield.purgers"), "{d:?}");
    assert_eq!(d[0].position.line, line_of(&src, "10.20.0.500"));

    // The shield's id is reserved while it is configured.
    let renamed = STANDBY.replace(
        "  cloudflare:\n    kind: cloudflare",
        "  shield:\n    kind: cloudflare",
    );
    let d = invalid(&renamed);
    assert!(
        d.iter()
            .any(|d| d.path == "providers.shield" && d.message.contains("origin shield")),
        "{d:?}"
    );
}

// ---- Video hosts (content-steering pathways and their clones) ----

fn with_video_hosts(hosts: &str) -> String {
    edit(
        "    edge_host: example.map.fastly.net\n",
        &format!("    edge_host: example.map.fastly.net\n    video_hosts: {hosts}\n"),
    )
}

#[test]
fn video_hosts_make_a_pathway_and_its_clones() {
    let src = with_video_hosts("[video-a.fastly.example.net, video-b.fastly.example.net]");
    let p = Policy::from_yaml(&src, "p.yaml").unwrap();
    let fastly = ProviderId::new("fastly").unwrap();
    let spec = &p.providers[&fastly];
    assert_eq!(spec.video_host(), "video-a.fastly.example.net");
    assert_eq!(
        spec.video_pathways(&fastly),
        [(
            "fastly-2".to_owned(),
            "video-b.fastly.example.net".to_owned()
        )]
    );
    let cf = &p.providers[&ProviderId::new("cloudflare").unwrap()];
    assert_eq!(
        cf.video_host(),
        cf.edge_host,
        "no video_hosts: the edge host"
    );
    assert!(
        cf.video_pathways(&ProviderId::new("cloudflare").unwrap())
            .is_empty()
    );
}

#[test]
fn bad_video_hosts_are_refused_field_by_field() {
    let src =
        with_video_hosts("[video-a.fastly.example.net, 'not a host', VIDEO-A.fastly.example.net]");
    let d = invalid(&src);
    let paths: Vec<&str> = d.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "providers.fastly.video_hosts[1]",
            "providers.fastly.video_hosts[2]"
        ],
        "{d:?}"
    );
    assert!(d[0].message.contains("not a hostname"), "{}", d[0].message);
    assert!(d[1].message.contains("listed twice"), "{}", d[1].message);
    let line = src
        .lines()
        .position(|l| l.contains("video_hosts:"))
        .unwrap()
        + 1;
    assert_eq!(
        d[0].position.line, line,
        "the diagnostic names the line: {d:?}"
    );
}

#[test]
fn a_clone_id_that_is_another_providers_id_is_refused() {
    let src = with_video_hosts("[a.fastly.example.net, b.fastly.example.net]").replacen(
        "providers:\n",
        "providers:\n  fastly-2:\n    kind: fastly\n    edge_host: other.map.fastly.net\n    service_id: SU1Z0isxPaozGVKXdv0eZ\n",
        1,
    );
    let d = invalid(&src);
    assert!(
        d.iter().any(|d| d.path == "providers.fastly.video_hosts[1]"
            && d.message.contains("also a provider's id")),
        "{d:?}"
    );
}
