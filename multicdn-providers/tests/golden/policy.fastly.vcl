# Fastly VCL snippets rendered by multicdn from the policy's cache section.
# Each is a regular (versioned) snippet; do not edit on the console.
# warnings: none

# ---- snippet multicdn-recv-routes: type recv, priority 10 ----
# cache.routes[0] match ^/checkout: never cached
if (req.url.path ~ "^/checkout") {
  return(pass);
}
# cache.routes[1] match ^/customer|^/cart|^/admin: never cached
if (req.url.path ~ "^/customer|^/cart|^/admin") {
  return(pass);
}

# ---- snippet multicdn-recv-cache-key: type recv, priority 20 ----
# cache.cache_key.query_allowlist: only these parameters reach the cache key and the origin
set req.url = querystring.filter_except(req.url, "page" querystring.filtersep() "sort" querystring.filtersep() "colour" querystring.filtersep() "size");
# cache.cache_key.cookie_allowlist: only these cookies reach the cache key and the origin
if (req.http.Cookie) {
  set req.http.Cookie = ";" req.http.Cookie;
  set req.http.Cookie = regsuball(req.http.Cookie, "; +", ";");
  set req.http.Cookie = regsuball(req.http.Cookie, ";(currency|trade)=", "; \1=");
  set req.http.Cookie = regsuball(req.http.Cookie, ";[^ ][^;]*", "");
  set req.http.Cookie = regsuball(req.http.Cookie, "^[; ]+|[; ]+$", "");
  if (req.http.Cookie == "") {
    unset req.http.Cookie;
  }
}
# cache.cache_key.normalise_accept_encoding: br, gzip or nothing
if (req.http.Accept-Encoding) {
  if (req.http.Accept-Encoding ~ "\bbr\b") {
    set req.http.Accept-Encoding = "br";
  } elsif (req.http.Accept-Encoding ~ "\bgzip\b") {
    set req.http.Accept-Encoding = "gzip";
  } else {
    unset req.http.Accept-Encoding;
  }
}

# ---- snippet multicdn-hash-cache-key: type hash, priority 10 ----
# cache.cache_key.cookie_allowlist: the allowlisted cookies vary the cache
set req.hash += "cookie:currency=" req.http.Cookie:currency;
set req.hash += "cookie:trade=" req.http.Cookie:trade;

# ---- snippet multicdn-fetch-ttl: type fetch, priority 10 ----
if (req.url.path ~ "^/checkout") {
  # cache.routes[0] match ^/checkout: never cached
  set beresp.cacheable = false;
  set beresp.ttl = 0s;
} elsif (req.url.path ~ "^/customer|^/cart|^/admin") {
  # cache.routes[1] match ^/customer|^/cart|^/admin: never cached
  set beresp.cacheable = false;
  set beresp.ttl = 0s;
} elsif (req.url.path ~ "^/products/") {
  # cache.routes[2] match ^/products/
  if (!beresp.http.Set-Cookie && (beresp.status == 200 || beresp.status == 203 || beresp.status == 300 || beresp.status == 301 || beresp.status == 302 || beresp.status == 404 || beresp.status == 410)) {
    set beresp.ttl = 3600s;
    set beresp.stale_while_revalidate = 86400s;
    set beresp.stale_if_error = 604800s;
    set beresp.http.Cache-Control = "public, max-age=60, stale-while-revalidate=86400, stale-if-error=604800";
  }
  # surrogate_keys_from_origin: Fastly reads the origin's Surrogate-Key natively
} elsif (req.url.path ~ "\.(js|css|woff2)$") {
  # cache.routes[3] match \.(js|css|woff2)$
  if (!beresp.http.Set-Cookie && (beresp.status == 200 || beresp.status == 203 || beresp.status == 300 || beresp.status == 301 || beresp.status == 302 || beresp.status == 404 || beresp.status == 410)) {
    set beresp.ttl = 31536000s;
    set beresp.stale_while_revalidate = 86400s;
    set beresp.stale_if_error = 604800s;
    set beresp.http.Cache-Control = "public, max-age=31536000, stale-while-revalidate=86400, stale-if-error=604800, immutable";
  }
  unset beresp.http.Surrogate-Key;
} else {
  # cache.defaults
  if (!beresp.http.Set-Cookie && (beresp.status == 200 || beresp.status == 203 || beresp.status == 300 || beresp.status == 301 || beresp.status == 302 || beresp.status == 404 || beresp.status == 410)) {
    set beresp.ttl = 3600s;
    set beresp.stale_while_revalidate = 86400s;
    set beresp.stale_if_error = 604800s;
    set beresp.http.Cache-Control = "public, max-age=60, stale-while-revalidate=86400, stale-if-error=604800";
  }
  unset beresp.http.Surrogate-Key;
}

# ---- snippet multicdn-deliver-headers: type deliver, priority 10 ----
# identity (seed 000 section 14): which CDN, which PoP, which cache verdict;
# added once, at the edge node that answers the client (not at a shield);
# Timing-Allow-Origin lets the site's pages read it, and Resource Timing, cross-origin
declare local var.multicdn_cache STRING;
if (fastly.ff.visits_this_service == 0) {
  if (fastly_info.state ~ "PASS") {
    set var.multicdn_cache = "PASS";
  } elsif (fastly_info.state ~ "^HIT-STALE") {
    set var.multicdn_cache = "STALE";
  } elsif (fastly_info.state ~ "^HIT") {
    set var.multicdn_cache = "HIT";
  } elsif (fastly_info.state ~ "^MISS") {
    set var.multicdn_cache = "MISS";
  } else {
    set var.multicdn_cache = fastly_info.state;
  }
  add resp.http.Server-Timing = {"cdn;desc="fastly", pop;desc=""} server.datacenter {"", cache;desc=""} var.multicdn_cache {"""};
  set resp.http.Timing-Allow-Origin = "https://www.example.com";
}
if (resp.http.CMSD-Dynamic) {
  add resp.http.Access-Control-Expose-Headers = "CMSD-Dynamic";
}
# cache.routes[0] match ^/checkout: headers
if (req.url.path ~ "^/checkout") {
  set resp.http.Cache-Control = "private, no-store";
}
