#!/usr/bin/env python3
"""Reads a steered record back from Route 53 (or moto) with boto3, independently of the Rust
client, and checks the layout `steer apply --vendor route53` promises:

- every set at the record name is a geolocation alias (type CNAME) to a pool in the same
  hosted zone, with EvaluateTargetHealth;
- every pool holds weighted CNAMEs, one per provider, weights summing to 255;
- every weighted set carries a HealthCheckId that exists, and that check is a string match on
  the set's own edge host with the expected path, search string, regions, interval and
  threshold.

Usage (the test in steer_route53.rs runs it):
  route53_readback.py --endpoint URL --zone-id ID --record www.example.com \
      --path /_health/v3.txt --search healthy-v3 --regions eu-west-1,us-east-1,... \
      --interval 30 --threshold 2 --edge fastly=f.example.net --edge cloudflare=c.example.net

Exit 0 with a one-line JSON summary on stdout when everything holds; exit 1 naming the first
thing that does not.
"""

import argparse
import json
import sys

import boto3


class Mismatch(Exception):
    pass


def expect(cond, message):
    if not cond:
        raise Mismatch(message)


def bare(name):
    return name.rstrip(".").lower()


def all_sets(client, zone_id):
    sets = []
    kwargs = {"HostedZoneId": zone_id, "MaxItems": "300"}
    for _ in range(1000):
        page = client.list_resource_record_sets(**kwargs)
        sets.extend(page["ResourceRecordSets"])
        if not page.get("IsTruncated"):
            return sets
        kwargs["StartRecordName"] = page["NextRecordName"]
        kwargs["StartRecordType"] = page["NextRecordType"]
        if "NextRecordIdentifier" in page:
            kwargs["StartRecordIdentifier"] = page["NextRecordIdentifier"]
    raise Mismatch("the record listing never ended")


def check(args):
    client = boto3.client(
        "route53",
        endpoint_url=args.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    zone_id = args.zone_id.split("/")[-1]
    record = bare(args.record)
    edges = dict(e.split("=", 1) for e in args.edge)
    providers_by_edge = {bare(host): provider for provider, host in edges.items()}
    regions = sorted(args.regions.split(","))
    sets = all_sets(client, zone_id)

    at_name = [s for s in sets if bare(s["Name"]) == record]
    expect(at_name, f"no record sets at {record}")
    pools = {}
    for s in at_name:
        where = f"{record} [{s.get('SetIdentifier')}]"
        expect(s["Type"] == "CNAME", f"{where} is {s['Type']}, not an alias of type CNAME")
        expect("GeoLocation" in s, f"{where} has no GeoLocation")
        alias = s.get("AliasTarget")
        expect(alias is not None, f"{where} is not an alias: {s}")
        expect("ResourceRecords" not in s or not s["ResourceRecords"], f"{where} has values beside its alias")
        expect(alias["HostedZoneId"].split("/")[-1] == zone_id,
               f"{where} aliases into zone {alias['HostedZoneId']}, not {zone_id}")
        expect(alias["EvaluateTargetHealth"] is True, f"{where} does not evaluate target health")
        pool = bare(alias["DNSName"])
        expect(pool.endswith("._steer." + record), f"{where} aliases {pool}, not a pool of {record}")
        pools.setdefault(pool, 0)
        pools[pool] += 1

    checks = {}
    weighted_count = 0
    for pool in pools:
        members = [s for s in sets if bare(s["Name"]) == pool]
        expect(len(members) == len(edges),
               f"pool {pool} holds {len(members)} sets, want one per provider ({len(edges)})")
        total = 0
        seen = set()
        for s in members:
            where = f"{pool} [{s.get('SetIdentifier')}]"
            expect(s["Type"] == "CNAME" and "AliasTarget" not in s, f"{where} is not a plain CNAME")
            expect("Weight" in s, f"{where} is not weighted")
            expect(0 <= s["Weight"] <= 255, f"{where} weight {s['Weight']} is outside 0-255")
            total += s["Weight"]
            values = [bare(r["Value"]) for r in s["ResourceRecords"]]
            expect(len(values) == 1 and values[0] in providers_by_edge,
                   f"{where} points at {values}, not one provider's edge")
            provider = providers_by_edge[values[0]]
            expect(provider not in seen, f"{pool} names {provider} twice")
            seen.add(provider)
            hc = s.get("HealthCheckId")
            expect(hc, f"{where} carries no HealthCheckId")
            if hc not in checks:
                checks[hc] = client.get_health_check(HealthCheckId=hc)["HealthCheck"]
            config = checks[hc]["HealthCheckConfig"]
            want = {
                "Type": "HTTPS_STR_MATCH",
                "Port": 443,
                "FullyQualifiedDomainName": values[0],
                "ResourcePath": args.path,
                "SearchString": args.search,
                "RequestInterval": args.interval,
                "FailureThreshold": args.threshold,
            }
            for key, value in want.items():
                have = config.get(key)
                if key == "FullyQualifiedDomainName" and have is not None:
                    have = bare(have)
                expect(have == value, f"health check {hc} of {where}: {key} is {have!r}, want {value!r}")
            expect(sorted(config.get("Regions", [])) == regions,
                   f"health check {hc} of {where}: regions {config.get('Regions')}, want {regions}")
            expect(not config.get("Disabled", False) and not config.get("Inverted", False),
                   f"health check {hc} of {where} is disabled or inverted")
            weighted_count += 1
        expect(total == 255, f"pool {pool} weights sum to {total}, not 255")

    return {
        "geolocation_aliases": len(at_name),
        "pools": len(pools),
        "weighted": weighted_count,
        "health_checks": sorted(checks),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--zone-id", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--search", required=True)
    parser.add_argument("--regions", required=True)
    parser.add_argument("--interval", type=int, required=True)
    parser.add_argument("--threshold", type=int, required=True)
    parser.add_argument("--edge", action="append", required=True)
    args = parser.parse_args()
    try:
        summary = check(args)
    except Mismatch as e:
        print(f"read-back mismatch: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
