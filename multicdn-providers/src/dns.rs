//! Rules every DNS actuator shares about the name it steers.
//!
//! Both actuators steer with CNAMEs. DNS (RFC 1034 section 3.6.2) forbids a CNAME beside any
//! other data at the same name, and the zone apex always holds SOA and NS records, so Route 53
//! and NS1 both refuse a CNAME at the apex or beside other record types. These checks run
//! before anything is sent.

/// Refuses a steered record at the zone apex: a CNAME cannot stand beside the apex's SOA and
/// NS records. `record` and `zone` are compared without case or trailing dot.
pub fn check_not_apex(record: &str, zone: &str) -> Result<(), String> {
    let r = record.trim_end_matches('.').to_ascii_lowercase();
    let z = zone.trim_end_matches('.').to_ascii_lowercase();
    if !r.is_empty() && r == z {
        return Err(format!(
            "record {record:?} is the zone apex: a CNAME cannot stand beside the apex's SOA and NS records; steer a name below it (like www.{z})"
        ));
    }
    Ok(())
}

/// Refuses a CNAME at `name` when other record types already stand there (`types`: the types
/// found at the name, any case).
pub fn check_cname_alone<'a>(
    name: &str,
    types: impl IntoIterator<Item = &'a str>,
) -> Result<(), String> {
    let mut others: Vec<String> = types
        .into_iter()
        .filter(|t| !t.eq_ignore_ascii_case("CNAME"))
        .map(str::to_ascii_uppercase)
        .collect();
    others.sort();
    others.dedup();
    if others.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{name} already holds {} records: a CNAME cannot stand beside other record types; remove them or steer another name",
            others.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apex_is_refused_and_names_below_it_pass() {
        assert!(check_not_apex("example.com.", "Example.com").is_err());
        assert!(check_not_apex("www.example.com", "example.com").is_ok());
    }

    #[test]
    fn other_types_beside_a_cname_are_named() {
        let e = check_cname_alone("www.example.com", ["CNAME", "a", "AAAA", "A"]).unwrap_err();
        assert!(e.contains("A, AAAA records"), "{e}");
        assert!(check_cname_alone("www.example.com", ["CNAME"]).is_ok());
    }
}
