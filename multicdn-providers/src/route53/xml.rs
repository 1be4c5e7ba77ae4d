//! Route 53's XML: the requests written (members in model order) and the answers read.

use quick_xml::escape::escape;
use serde::Deserialize;

use super::changes::Change;
use super::health::HealthCheckSpec;
use super::layout::{AliasTarget, GeoLocation, RecordSet, normalise_name};

/// Route 53's XML namespace.
pub const NAMESPACE: &str = "https://route53.amazonaws.com/doc/2013-04-01/";

struct Xml(String);

impl Xml {
    fn new(root: &str) -> Xml {
        Xml(format!(
            r#"<?xml version="1.0" encoding="UTF-8"?><{root} xmlns="{NAMESPACE}">"#
        ))
    }
    fn open(&mut self, name: &str) -> &mut Xml {
        self.0.push('<');
        self.0.push_str(name);
        self.0.push('>');
        self
    }
    fn close(&mut self, name: &str) -> &mut Xml {
        self.0.push_str("</");
        self.0.push_str(name);
        self.0.push('>');
        self
    }
    fn text(&mut self, name: &str, value: &str) -> &mut Xml {
        self.open(name);
        self.0.push_str(&escape(value));
        self.close(name)
    }
    fn finish(mut self, root: &str) -> String {
        self.close(root);
        self.0
    }
}

fn write_set(x: &mut Xml, set: &RecordSet) {
    x.open("ResourceRecordSet");
    x.text("Name", &set.name);
    x.text("Type", &set.rtype);
    if let Some(id) = &set.set_identifier {
        x.text("SetIdentifier", id);
    }
    if let Some(w) = set.weight {
        x.text("Weight", &w.to_string());
    }
    if let Some(geo) = &set.geo {
        x.open("GeoLocation");
        match geo {
            GeoLocation::Continent(c) => {
                x.text("ContinentCode", c);
            }
            GeoLocation::Country(c) => {
                x.text("CountryCode", c);
            }
            GeoLocation::Default => {
                x.text("CountryCode", "*");
            }
            GeoLocation::Subdivision(c, s) => {
                x.text("CountryCode", c).text("SubdivisionCode", s);
            }
        }
        x.close("GeoLocation");
    }
    if let Some(ttl) = set.ttl {
        x.text("TTL", &ttl.to_string());
    }
    if !set.values.is_empty() || set.alias.is_none() {
        x.open("ResourceRecords");
        for v in &set.values {
            x.open("ResourceRecord")
                .text("Value", v)
                .close("ResourceRecord");
        }
        x.close("ResourceRecords");
    }
    if let Some(a) = &set.alias {
        x.open("AliasTarget")
            .text("HostedZoneId", a.hosted_zone_id.as_str())
            .text("DNSName", &a.dns_name)
            .text("EvaluateTargetHealth", bool_text(a.evaluate_target_health))
            .close("AliasTarget");
    }
    if let Some(hc) = &set.health_check_id {
        x.text("HealthCheckId", hc);
    }
    x.close("ResourceRecordSet");
}

/// A `ChangeResourceRecordSetsRequest` for one batch.
pub fn change_batch(comment: &str, changes: &[Change]) -> String {
    let root = "ChangeResourceRecordSetsRequest";
    let mut x = Xml::new(root);
    x.open("ChangeBatch")
        .text("Comment", comment)
        .open("Changes");
    for c in changes {
        x.open("Change").text("Action", c.action.as_str());
        write_set(&mut x, &c.set);
        x.close("Change");
    }
    x.close("Changes").close("ChangeBatch");
    x.finish(root)
}

/// A `CreateHealthCheckRequest`.
pub fn create_health_check(spec: &HealthCheckSpec) -> String {
    let root = "CreateHealthCheckRequest";
    let mut x = Xml::new(root);
    x.text("CallerReference", &spec.caller_reference());
    x.open("HealthCheckConfig")
        .text("Port", &spec.port.to_string())
        .text("Type", spec.check_type.as_str())
        .text("ResourcePath", &spec.resource_path)
        .text("FullyQualifiedDomainName", &spec.fqdn)
        .text("SearchString", &spec.search_string)
        .text("RequestInterval", &spec.request_interval.to_string())
        .text("FailureThreshold", &spec.failure_threshold.to_string())
        .text("MeasureLatency", "false");
    flags_and_regions(&mut x, spec);
    x.close("HealthCheckConfig");
    x.finish(root)
}

fn bool_text(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// `Inverted`, `Disabled`, `EnableSNI` and `Regions`: the members a check's create and update
/// both end with.
fn flags_and_regions(x: &mut Xml, spec: &HealthCheckSpec) {
    x.text("Inverted", "false")
        .text("Disabled", "false")
        .text("EnableSNI", bool_text(spec.enable_sni()))
        .open("Regions");
    for r in &spec.regions {
        x.text("Region", r);
    }
    x.close("Regions");
}

/// An `UpdateHealthCheckRequest` putting a check edited since it was made back to `spec`
/// (members in model order; `Type` and `RequestInterval` cannot change, and the caller
/// reference covers them). `version` is the `HealthCheckVersion` read, so an edit made in
/// between is refused rather than overwritten.
pub fn update_health_check(spec: &HealthCheckSpec, version: u64) -> String {
    let root = "UpdateHealthCheckRequest";
    let mut x = Xml::new(root);
    x.text("HealthCheckVersion", &version.to_string())
        .text("Port", &spec.port.to_string())
        .text("ResourcePath", &spec.resource_path)
        .text("FullyQualifiedDomainName", &spec.fqdn)
        .text("SearchString", &spec.search_string)
        .text("FailureThreshold", &spec.failure_threshold.to_string());
    flags_and_regions(&mut x, spec);
    x.finish(root)
}

/// A `CreateHostedZoneRequest`.
pub fn create_hosted_zone(name: &str, caller_reference: &str) -> String {
    let root = "CreateHostedZoneRequest";
    let mut x = Xml::new(root);
    x.text("Name", name)
        .text("CallerReference", caller_reference);
    x.finish(root)
}

/// Reads `body` as `T`, naming what was being read on failure.
pub fn parse<'de, T: Deserialize<'de>>(body: &'de str, what: &str) -> Result<T, String> {
    quick_xml::de::from_str(body).map_err(|e| format!("cannot read {what}: {e}"))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ListRecordSetsResponse {
    #[serde(default)]
    pub(crate) resource_record_sets: RawSets,
    #[serde(default)]
    pub(crate) is_truncated: bool,
    pub(crate) next_record_name: Option<String>,
    pub(crate) next_record_type: Option<String>,
    pub(crate) next_record_identifier: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawSets {
    #[serde(rename = "ResourceRecordSet", default)]
    pub(crate) items: Vec<RawSet>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RawSet {
    name: String,
    #[serde(rename = "Type")]
    rtype: String,
    set_identifier: Option<String>,
    weight: Option<u32>,
    region: Option<String>,
    geo_location: Option<RawGeo>,
    failover: Option<String>,
    multi_value_answer: Option<String>,
    #[serde(rename = "TTL")]
    ttl: Option<u64>,
    resource_records: Option<RawRecords>,
    alias_target: Option<RawAlias>,
    health_check_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawGeo {
    continent_code: Option<String>,
    country_code: Option<String>,
    subdivision_code: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawAlias {
    hosted_zone_id: String,
    #[serde(rename = "DNSName")]
    dns_name: String,
    #[serde(default)]
    evaluate_target_health: bool,
}

#[derive(Debug, Deserialize, Default)]
struct RawRecords {
    #[serde(rename = "ResourceRecord", default)]
    items: Vec<RawRecord>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawRecord {
    value: String,
}

impl RawSet {
    /// The set in this crate's terms.
    pub(crate) fn into_set(self) -> RecordSet {
        let geo = self.geo_location.and_then(|g| {
            match (g.continent_code, g.country_code, g.subdivision_code) {
                (Some(c), _, _) => Some(GeoLocation::Continent(c)),
                (None, Some(c), Some(s)) => Some(GeoLocation::Subdivision(c, s)),
                (None, Some(c), None) if c == "*" => Some(GeoLocation::Default),
                (None, Some(c), None) => Some(GeoLocation::Country(c)),
                _ => None,
            }
        });
        let foreign = if self.region.is_some() {
            Some("latency (Region)".to_owned())
        } else if self.failover.is_some() {
            Some("Failover".to_owned())
        } else if self.multi_value_answer.as_deref() == Some("true") {
            Some("MultiValueAnswer".to_owned())
        } else {
            None
        };
        RecordSet {
            name: normalise_name(&self.name),
            rtype: self.rtype,
            set_identifier: self.set_identifier,
            weight: self.weight,
            geo,
            ttl: self.ttl,
            values: self
                .resource_records
                .map(|r| r.items.into_iter().map(|v| v.value).collect())
                .unwrap_or_default(),
            alias: self.alias_target.map(|a| AliasTarget {
                hosted_zone_id: super::client::bare_zone_id(&a.hosted_zone_id).to_owned(),
                dns_name: normalise_name(&a.dns_name),
                evaluate_target_health: a.evaluate_target_health,
            }),
            health_check_id: self.health_check_id,
            foreign,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ChangeInfoResponse {
    pub(crate) change_info: ChangeInfo,
}

/// A change's id and status.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChangeInfo {
    /// `/change/C2682N5HXP0BZ4` (or without the prefix).
    pub id: String,
    /// `PENDING` or `INSYNC`.
    pub status: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct HealthCheckResponse {
    pub(crate) health_check: RawHealthCheck,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RawHealthCheck {
    pub(crate) id: String,
    pub(crate) caller_reference: String,
    #[serde(default)]
    pub(crate) health_check_config: Option<RawHealthCheckConfig>,
    #[serde(default)]
    pub(crate) health_check_version: Option<u64>,
}

/// A health check's configuration as Route 53 reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct RawHealthCheckConfig {
    /// The port.
    pub port: Option<u16>,
    /// `HTTPS_STR_MATCH`, `HTTP_STR_MATCH`, ...
    #[serde(rename = "Type")]
    pub check_type: String,
    /// The path requested.
    pub resource_path: Option<String>,
    /// The host checked.
    pub fully_qualified_domain_name: Option<String>,
    /// The string the body must contain.
    pub search_string: Option<String>,
    /// Seconds between checks.
    pub request_interval: Option<u32>,
    /// Consecutive failures before unhealthy.
    pub failure_threshold: Option<u32>,
    /// Checker regions.
    #[serde(default)]
    pub regions: RawRegions,
    /// Inverted.
    #[serde(default)]
    pub inverted: bool,
    /// Disabled (a disabled check counts as healthy).
    #[serde(default)]
    pub disabled: bool,
}

/// `<Regions><Region/>...</Regions>`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
pub struct RawRegions {
    /// The regions, in the order given.
    #[serde(rename = "Region", default)]
    pub items: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ListHealthChecksResponse {
    #[serde(default)]
    pub(crate) health_checks: RawHealthChecks,
    #[serde(default)]
    pub(crate) is_truncated: bool,
    pub(crate) next_marker: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawHealthChecks {
    #[serde(rename = "HealthCheck", default)]
    pub(crate) items: Vec<RawHealthCheck>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct HealthCheckStatusResponse {
    #[serde(default)]
    pub(crate) health_check_observations: RawObservations,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RawObservations {
    #[serde(rename = "HealthCheckObservation", default)]
    pub(crate) items: Vec<RawObservation>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RawObservation {
    pub(crate) region: Option<String>,
    #[serde(rename = "IPAddress")]
    pub(crate) ip_address: Option<String>,
    pub(crate) status_report: Option<RawStatusReport>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RawStatusReport {
    pub(crate) status: Option<String>,
    pub(crate) checked_time: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct CreateHostedZoneResponse {
    pub(crate) hosted_zone: RawHostedZone,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RawHostedZone {
    pub(crate) id: String,
}

/// Route 53's error answer: `Code`, every `Message`, and the root element's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorBody {
    /// `Throttling`, `InvalidChangeBatch`, `NoSuchHostedZone`.
    pub code: Option<String>,
    /// The messages, in order (an `InvalidChangeBatch` may carry several).
    pub messages: Vec<String>,
}

/// Reads `<ErrorResponse><Error><Code/><Message/></Error></ErrorResponse>` or
/// `<InvalidChangeBatch><Messages><Message/>...</Messages></InvalidChangeBatch>`; anything
/// else reads as empty.
pub fn parse_error(body: &str) -> ErrorBody {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(body);
    let mut out = ErrorBody::default();
    let mut path: Vec<String> = Vec::new();
    let mut text = String::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => {
                let name = e.local_name().into_inner().to_owned();
                if path.is_empty() && name == "InvalidChangeBatch" {
                    out.code = Some(name.clone());
                }
                path.push(name);
                text.clear();
            }
            Ok(Event::End(_)) => {
                let value = text.trim().to_owned();
                match path.last().map(String::as_str) {
                    Some("Code") if out.code.is_none() && !value.is_empty() => {
                        out.code = Some(value)
                    }
                    Some("Message") if !value.is_empty() => out.messages.push(value),
                    _ => {}
                }
                text.clear();
                path.pop();
            }
            Ok(Event::Text(t)) => text.push_str(&t.xml10_content()),
            Ok(Event::CData(t)) => text.push_str(&t.xml10_content()),
            Ok(Event::GeneralRef(r)) => {
                if let Ok(Some(c)) = r.resolve_char_ref() {
                    text.push(c);
                } else if let Some(s) =
                    quick_xml::escape::resolve_predefined_entity(&r.xml10_content())
                {
                    text.push_str(s);
                }
            }
            Ok(Event::Eof) | Err(_) => break,
            Ok(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route53::changes::Action;

    #[test]
    fn writes_record_set_members_in_model_order() {
        let set = RecordSet {
            name: "europe._steer.www.example.com".into(),
            rtype: "CNAME".into(),
            set_identifier: Some("europe-fastly".into()),
            weight: Some(229),
            geo: None,
            ttl: Some(30),
            values: vec!["example.map.fastly.net".into()],
            alias: None,
            health_check_id: Some("hc-1".into()),
            foreign: None,
        };
        let xml = change_batch(
            "c & d",
            &[Change {
                action: Action::Create,
                set,
                before: None,
            }],
        );
        assert!(xml.contains("<Comment>c &amp; d</Comment>"));
        assert!(xml.contains("<Change><Action>CREATE</Action><ResourceRecordSet><Name>europe._steer.www.example.com</Name><Type>CNAME</Type><SetIdentifier>europe-fastly</SetIdentifier><Weight>229</Weight><TTL>30</TTL><ResourceRecords><ResourceRecord><Value>example.map.fastly.net</Value></ResourceRecord></ResourceRecords><HealthCheckId>hc-1</HealthCheckId></ResourceRecordSet></Change>"), "{xml}");
    }

    #[test]
    fn writes_a_geolocation_alias_without_ttl_or_values() {
        let set = RecordSet {
            name: "www.example.com".into(),
            rtype: "CNAME".into(),
            set_identifier: Some("geo-DE".into()),
            weight: None,
            geo: Some(GeoLocation::Country("DE".into())),
            ttl: None,
            values: vec![],
            alias: Some(AliasTarget {
                hosted_zone_id: "Z0EXAMPLE".into(),
                dns_name: "europe._steer.www.example.com".into(),
                evaluate_target_health: true,
            }),
            health_check_id: None,
            foreign: None,
        };
        let xml = change_batch(
            "c",
            &[Change {
                action: Action::Create,
                set,
                before: None,
            }],
        );
        assert!(xml.contains("<ResourceRecordSet><Name>www.example.com</Name><Type>CNAME</Type><SetIdentifier>geo-DE</SetIdentifier><GeoLocation><CountryCode>DE</CountryCode></GeoLocation><AliasTarget><HostedZoneId>Z0EXAMPLE</HostedZoneId><DNSName>europe._steer.www.example.com</DNSName><EvaluateTargetHealth>true</EvaluateTargetHealth></AliasTarget></ResourceRecordSet>"), "{xml}");
        assert!(
            !xml.contains("<TTL>") && !xml.contains("ResourceRecords"),
            "{xml}"
        );
    }

    #[test]
    fn reads_an_alias_back_as_ours_not_foreign() {
        let body = r#"<ListResourceRecordSetsResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><ResourceRecordSets><ResourceRecordSet><Name>www.example.com.</Name><Type>CNAME</Type><SetIdentifier>geo-DE</SetIdentifier><GeoLocation><CountryCode>DE</CountryCode></GeoLocation><AliasTarget><HostedZoneId>/hostedzone/Z0EXAMPLE</HostedZoneId><DNSName>Europe._steer.www.example.com.</DNSName><EvaluateTargetHealth>true</EvaluateTargetHealth></AliasTarget></ResourceRecordSet></ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>300</MaxItems></ListResourceRecordSetsResponse>"#;
        let list: ListRecordSetsResponse = parse(body, "a listing").unwrap();
        let set = list
            .resource_record_sets
            .items
            .into_iter()
            .next()
            .unwrap()
            .into_set();
        assert_eq!(set.foreign, None);
        assert_eq!(
            set.alias,
            Some(AliasTarget {
                hosted_zone_id: "Z0EXAMPLE".into(),
                dns_name: "europe._steer.www.example.com".into(),
                evaluate_target_health: true,
            })
        );
        assert_eq!(set.target(), Some("europe._steer.www.example.com"));
    }

    #[test]
    fn reads_a_health_check_listing_with_its_configuration() {
        let body = r#"<ListHealthChecksResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><HealthChecks><HealthCheck><Id>abc</Id><CallerReference>multicdn-1</CallerReference><HealthCheckConfig><Port>443</Port><Type>HTTPS_STR_MATCH</Type><ResourcePath>/_health/v3.txt</ResourcePath><FullyQualifiedDomainName>e.example.net</FullyQualifiedDomainName><SearchString>healthy-v3</SearchString><RequestInterval>30</RequestInterval><FailureThreshold>2</FailureThreshold><Regions><Region>us-east-1</Region><Region>eu-west-1</Region><Region>sa-east-1</Region></Regions></HealthCheckConfig><HealthCheckVersion>3</HealthCheckVersion></HealthCheck></HealthChecks><IsTruncated>false</IsTruncated><MaxItems>100</MaxItems></ListHealthChecksResponse>"#;
        let list: ListHealthChecksResponse = parse(body, "a listing").unwrap();
        let check = &list.health_checks.items[0];
        assert_eq!(check.health_check_version, Some(3));
        let config = check.health_check_config.as_ref().unwrap();
        assert_eq!(config.check_type, "HTTPS_STR_MATCH");
        assert_eq!(config.search_string.as_deref(), Some("healthy-v3"));
        assert_eq!(
            config.regions.items,
            ["us-east-1", "eu-west-1", "sa-east-1"]
        );
    }

    #[test]
    fn reads_both_error_shapes() {
        let e = parse_error(
            r#"<?xml version="1.0"?><ErrorResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>r</RequestId></ErrorResponse>"#,
        );
        assert_eq!(e.code.as_deref(), Some("Throttling"));
        assert_eq!(e.messages, vec!["Rate exceeded".to_owned()]);
        let e = parse_error(
            r#"<?xml version="1.0"?><InvalidChangeBatch xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><Messages><Message>Tried to create resource record set [name='www.example.com.', type='CNAME', set-identifier='geo-DE'] but it already exists</Message><Message>second &amp; last</Message></Messages><RequestId>r</RequestId></InvalidChangeBatch>"#,
        );
        assert_eq!(e.code.as_deref(), Some("InvalidChangeBatch"));
        assert_eq!(e.messages.len(), 2);
        assert_eq!(e.messages[1], "second & last");
        assert_eq!(parse_error("not xml at all <"), ErrorBody::default());
    }

    #[test]
    fn reads_a_listing_with_geolocation_and_weights() {
        let body = r#"<ListResourceRecordSetsResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/"><ResourceRecordSets><ResourceRecordSet><Name>www.example.com.</Name><Type>CNAME</Type><SetIdentifier>geo-default</SetIdentifier><GeoLocation><CountryCode>*</CountryCode></GeoLocation><TTL>30</TTL><ResourceRecords><ResourceRecord><Value>default._steer.www.example.com</Value></ResourceRecord></ResourceRecords></ResourceRecordSet><ResourceRecordSet><Name>default._steer.www.example.com.</Name><Type>CNAME</Type><SetIdentifier>default-fastly</SetIdentifier><Weight>128</Weight><TTL>30</TTL><ResourceRecords><ResourceRecord><Value>f.example.net</Value></ResourceRecord></ResourceRecords><HealthCheckId>abc</HealthCheckId></ResourceRecordSet></ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>300</MaxItems></ListResourceRecordSetsResponse>"#;
        let list: ListRecordSetsResponse = parse(body, "a listing").unwrap();
        let sets: Vec<RecordSet> = list
            .resource_record_sets
            .items
            .into_iter()
            .map(RawSet::into_set)
            .collect();
        assert_eq!(sets[0].geo, Some(GeoLocation::Default));
        assert_eq!(sets[0].name, "www.example.com");
        assert_eq!(sets[1].weight, Some(128));
        assert_eq!(sets[1].health_check_id.as_deref(), Some("abc"));
        assert!(!list.is_truncated);
    }
}
