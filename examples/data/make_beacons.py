"""Writes beacons.ndjson: the scoreboard example's sample input.

300 beacons (navigation beacons, and every seventh a probe beacon) from six networks in six
countries over the 50 minutes to 2026-12-01T09:00Z, split between the providers roughly as
examples/policy.yaml's regions do, plus four deliberately bad lines (not JSON, an unknown
provider, an implausible time, no time). Deterministic: run `python3 make_beacons.py` to
write the same file again.
"""
import json, math, random

rng = random.Random(20261201)
start = 1796112600000  # 2026-12-01T08:10:00Z
nets = [  # asn, country, fastly ms, cloudflare ms, fastly share
    (2856, "GB", 45, 58, 0.9),
    (3320, "DE", 52, 49, 0.9),
    (7922, "US", 38, 61, 0.85),
    (1221, "AU", 118, 72, 0.1),
    (2516, "JP", 92, 66, 0.1),
    (28573, "BR", 112, 104, 0.5),
]
pops = {"GB": "LHR", "DE": "FRA", "US": "IAD", "AU": "SYD", "JP": "NRT", "BR": "GRU"}


def t(base):
    return round(base * math.exp(rng.gauss(0, 0.35)), 1)


def line(obj):
    return json.dumps(obj, separators=(",", ":"))


out = []
for i in range(300):
    at = start + i * 10000 + rng.randrange(0, 10000)
    asn, cc, f, c, share = nets[i % len(nets)]
    if i % 7 == 3:
        times = {"fastly": t(f), "cloudflare": t(c)}
        if rng.random() < 0.05:
            times["cloudflare"] = None
        best = min((k for k in times if times[k] is not None), key=lambda k: times[k])
        out.append(line({"at": at, "asn": asn, "country": cc, "times": times, "best": best}))
    else:
        p = "fastly" if rng.random() < share else "cloudflare"
        out.append(line({
            "at": at, "asn": asn, "country": cc, "path": f"/products/{rng.randrange(1, 40)}",
            "ttfb": t(f if p == "fastly" else c), "provider": p, "pop": pops[cc],
            "cache": "HIT" if rng.random() < 0.85 else "MISS",
        }))
bad = [
    (40, "this line is not JSON"),
    (120, line({"at": start + 1200000, "asn": 7922, "country": "US", "ttfb": 80.0, "provider": "unknown"})),
    (200, line({"at": start + 2000000, "asn": 3320, "country": "DE", "ttfb": -5, "provider": "fastly"})),
    (260, line({"asn": 2856, "country": "GB", "ttfb": 44.0, "provider": "fastly"})),
]
for pos, text in reversed(bad):
    out.insert(pos, text)
with open("beacons.ndjson", "w") as f:
    f.write("\n".join(out) + "\n")
