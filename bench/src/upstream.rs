//! Envoy processes of the benchmark itself: the fake upstream (an Envoy answering every call
//! with a `direct_response`, no upstream of its own) and the plain Envoy hop in front of it.
//!
//! The fake upstream serves, under a path prefix per rate-limit variant (`/static/`,
//! `/constant/`, `/changing/`, see [`Headers`]):
//! - `POST <prefix>.../chat/completions` with `accept: text/event-stream`, or under
//!   `<prefix>stream/`: an OpenAI chat-completion stream (role, three content chunks, finish,
//!   usage, `data: [DONE]`) in one write;
//! - anything else under the prefix: an OpenAI chat completion (JSON);
//! - with [`FAIL_HEADER`], under any path: a 429 (`unary`) or a stream whose first event is an
//!   error (`stream`).
//!
//! Streams go out chunked (no `content-length`), as providers send them.
//! `/probe/` answers a completion too, or `401 invalid_api_key` while the runtime key
//! `bench.probe_fails` is 100 (set through the admin API's `/runtime_modify`): the sync probes
//! use it to have one provider key blacklisted on demand. A buffer filter reads each request
//! whole before the answer, so Envoy keeps the connection alive (an answer sent before the
//! request body would close it).

use std::fmt::Write as _;
use std::path::Path;

use ai_router_e2e::{poll, public_listener, Process, TestDir, ENVOY_READY_TIMEOUT};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The assistant's answer in every completion of the fake upstream.
pub const COMPLETION_TEXT: &str = "Hello from the bench upstream.";
/// A piece of [`COMPLETION_TEXT`] that stays whole in one stream chunk.
pub const STREAM_MARKER: &str = "bench upstream";
/// A request header that makes the fake upstream fail: `unary` answers 429, `stream` a stream
/// whose first event is an error.
pub const FAIL_HEADER: &str = "x-bench-fail";
/// The runtime key that makes `/probe/` answer 401.
pub const PROBE_RUNTIME_KEY: &str = "bench.probe_fails";

/// The rate-limit headers the fake upstream sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Headers {
    /// No rate-limit headers: every answer the same.
    Static,
    /// `x-ratelimit-limit-*` and `-remaining-*` with the same values every time, no reset.
    Constant,
    /// Like a real provider: remaining requests and tokens and both resets change on every
    /// answer (taken from the request's start time, to the microsecond).
    Changing,
    /// Like a real provider counting each key's minute: every answer to a key (its
    /// `authorization`) has one request and the answer's 19 tokens less remaining than the
    /// last, both refilled at the minute's turn, and the resets say how long until it
    /// (counted by a Lua filter on these routes: [`COUNTDOWN_LUA`]).
    Countdown,
}

/// The limits [`Headers::Countdown`] counts down from: a key's requests and tokens a minute.
pub const COUNTDOWN_REQUESTS: u64 = 10_000_000;
pub const COUNTDOWN_TOKENS: u64 = 100_000_000;

/// The Lua filter that counts [`Headers::Countdown`]'s answers, per worker (the fake upstream
/// has one by default) and per key: a request takes a number from its key's minute, the answer
/// says what is left.
pub const COUNTDOWN_LUA: &str = r#"
local minutes = {}
function envoy_on_request(h)
  local key = h:headers():get("authorization") or ""
  local now = os.time()
  local start = now - now % 60
  local m = minutes[key]
  if m == nil or m.start ~= start then
    m = { start = start, sent = 0 }
    minutes[key] = m
  end
  m.sent = m.sent + 1
  local meta = h:streamInfo():dynamicMetadata()
  meta:set("bench.countdown", "sent", m.sent)
  meta:set("bench.countdown", "reset", start + 60 - now)
end
function envoy_on_response(h)
  local m = h:streamInfo():dynamicMetadata():get("bench.countdown")
  if m == nil then return end
  local headers = h:headers()
  headers:add("x-ratelimit-limit-requests", "REQUESTS")
  headers:add("x-ratelimit-remaining-requests", string.format("%d", REQUESTS - m.sent))
  headers:add("x-ratelimit-limit-tokens", "TOKENS")
  headers:add("x-ratelimit-remaining-tokens", string.format("%d", TOKENS - 19 * m.sent))
  headers:add("x-ratelimit-reset-requests", string.format("%ds", m.reset))
  headers:add("x-ratelimit-reset-tokens", string.format("%ds", m.reset))
end
"#;

impl Headers {
    pub fn prefix(self) -> &'static str {
        match self {
            Headers::Static => "static",
            Headers::Constant => "constant",
            Headers::Changing => "changing",
            Headers::Countdown => "countdown",
        }
    }

    /// Whether every answer carries new rate-limit figures (what the scale rows measure).
    pub fn change(self) -> bool {
        matches!(self, Headers::Changing | Headers::Countdown)
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "static" => Ok(Headers::Static),
            "constant" => Ok(Headers::Constant),
            "changing" => Ok(Headers::Changing),
            "countdown" => Ok(Headers::Countdown),
            _ => bail!(
                "unknown rate-limit header variant {s:?} (static, constant, changing, countdown)"
            ),
        }
    }

    fn header_pairs(self) -> Vec<(&'static str, &'static str)> {
        match self {
            // Countdown's are the Lua filter's.
            Headers::Static | Headers::Countdown => vec![],
            Headers::Constant => vec![
                ("x-ratelimit-limit-requests", "10000"),
                ("x-ratelimit-remaining-requests", "9999"),
                ("x-ratelimit-limit-tokens", "10000000"),
                ("x-ratelimit-remaining-tokens", "9999000"),
            ],
            Headers::Changing => vec![
                ("x-ratelimit-limit-requests", "10000000"),
                ("x-ratelimit-remaining-requests", "9%START_TIME(%6f)%"),
                ("x-ratelimit-limit-tokens", "100000000"),
                ("x-ratelimit-remaining-tokens", "8%START_TIME(%6f)%"),
                ("x-ratelimit-reset-requests", "1.%START_TIME(%3f)%s"),
                ("x-ratelimit-reset-tokens", "6%START_TIME(%3f)%ms"),
            ],
        }
    }
}

pub const ALL_HEADERS: [Headers; 4] = [
    Headers::Static,
    Headers::Constant,
    Headers::Changing,
    Headers::Countdown,
];

fn completion_json() -> String {
    json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "bench-model",
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": COMPLETION_TEXT },
            "finish_reason": "stop"
        }],
        "usage": { "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19 }
    })
    .to_string()
}

fn stream_body() -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "bench-model",
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }]
        })
    };
    let mut events = vec![
        chunk(json!({ "role": "assistant", "content": "" }), Value::Null),
        chunk(json!({ "content": "Hello" }), Value::Null),
        chunk(json!({ "content": " from the" }), Value::Null),
        chunk(json!({ "content": " bench upstream." }), Value::Null),
        chunk(json!({}), json!("stop")),
    ];
    events.push(json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "bench-model",
        "choices": [],
        "usage": { "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19 }
    }));
    let mut out = String::new();
    for e in events {
        let _ = write!(out, "data: {e}\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// A YAML/JSON string literal.
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn route(matcher: &str, status: u16, content_type: &str, body: &str, headers: Headers) -> String {
    let mut per_filter = String::new();
    // A stream goes out chunked, as providers send it (a direct_response has a content-length).
    if content_type == "text/event-stream" {
        per_filter.push_str(
            "                            envoy.filters.http.header_mutation:\n\
             \x20                             \"@type\": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute\n\
             \x20                             mutations: { response_mutations: [{ remove: content-length }] }\n",
        );
    }
    // The countdown's Lua filter, off on every other route.
    if headers == Headers::Countdown {
        per_filter.push_str(
            "                            envoy.filters.http.lua:\n\
             \x20                             \"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig\n\
             \x20                             config:\n\
             \x20                               \"@type\": type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute\n\
             \x20                               name: countdown\n",
        );
    }
    if !per_filter.is_empty() {
        per_filter.insert_str(0, "                          typed_per_filter_config:\n");
    }
    let mut out = format!(
        "                        - match: {matcher}\n\
         \x20                         direct_response:\n\
         \x20                           status: {status}\n\
         \x20                           body: {{ inline_string: {body} }}\n\
         {per_filter}\
         \x20                         response_headers_to_add:\n\
         \x20                           - header: {{ key: content-type, value: {ct} }}\n\
         \x20                             append_action: OVERWRITE_IF_EXISTS_OR_ADD\n",
        body = lit(body),
        ct = lit(content_type),
    );
    for (k, v) in headers.header_pairs() {
        let _ = writeln!(
            out,
            "                            - header: {{ key: {k}, value: {} }}",
            lit(v)
        );
    }
    out
}

/// The fake upstream's bootstrap.
pub fn fake_upstream_yaml() -> String {
    let json_body = completion_json();
    let sse = stream_body();
    let mut routes = String::new();
    let error = json!({"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}).to_string();
    // Scripted failures (`one-pass-floor`'s failover check): a 429, and a stream whose first
    // event is an error.
    let limited = json!({"error": {"message": "Rate limit reached.", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}).to_string();
    routes.push_str(&route(
        &format!("{{ prefix: /, headers: [{{ name: {FAIL_HEADER}, string_match: {{ exact: unary }} }}] }}"),
        429,
        "application/json",
        &limited,
        Headers::Static,
    ));
    routes.push_str(&route(
        &format!("{{ prefix: /, headers: [{{ name: {FAIL_HEADER}, string_match: {{ exact: stream }} }}] }}"),
        200,
        "text/event-stream",
        &format!("data: {limited}\n\n"),
        Headers::Static,
    ));
    routes.push_str(&route(
        &format!(
            "{{ prefix: /probe/, runtime_fraction: {{ default_value: {{ numerator: 0, denominator: HUNDRED }}, runtime_key: {PROBE_RUNTIME_KEY} }} }}"
        ),
        401,
        "application/json",
        &error,
        Headers::Static,
    ));
    routes.push_str(&route(
        "{ prefix: /probe/ }",
        200,
        "application/json",
        &json_body,
        Headers::Static,
    ));
    for h in ALL_HEADERS {
        let p = h.prefix();
        routes.push_str(&route(
            &format!("{{ prefix: /{p}/stream/ }}"),
            200,
            "text/event-stream",
            &sse,
            h,
        ));
        routes.push_str(&route(
            &format!("{{ prefix: /{p}/, headers: [{{ name: accept, string_match: {{ contains: text/event-stream }} }}] }}"),
            200,
            "text/event-stream",
            &sse,
            h,
        ));
        routes.push_str(&route(
            &format!("{{ prefix: /{p}/ }}"),
            200,
            "application/json",
            &json_body,
            h,
        ));
    }
    one_listener(
        "fake_upstream",
        "# The benchmark's fake upstream: every answer is a direct_response (see bench/src/upstream.rs).\n\
         layered_runtime:\n  layers:\n    - name: admin\n      admin_layer: {}\n",
        "                generate_request_id: false\n",
        &routes,
        &format!(
            "                  - name: envoy.filters.http.header_mutation\n\
             \x20                   typed_config:\n\
             \x20                     \"@type\": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation\n\
             \x20                 - name: envoy.filters.http.lua\n\
             \x20                   disabled: true\n\
             \x20                   typed_config:\n\
             \x20                     \"@type\": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n\
             \x20                     source_codes: {{ countdown: {{ inline_string: {lua} }} }}\n\
             \x20                 - name: envoy.filters.http.buffer\n\
             \x20                   typed_config:\n\
             \x20                     \"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer\n\
             \x20                     max_request_bytes: 1048576\n",
            lua = lit(
                &COUNTDOWN_LUA
                    .replace("REQUESTS", &COUNTDOWN_REQUESTS.to_string())
                    .replace("TOKENS", &COUNTDOWN_TOKENS.to_string())
            ),
        ),
        "",
    )
}

/// The static cluster `upstream` (`127.0.0.1:port`), as a `clusters:` list item.
fn upstream_cluster(upstream_port: u16) -> String {
    static_cluster("upstream", upstream_port, "")
}

/// A static cluster to `127.0.0.1:port`, `options` (YAML at the cluster's level) added.
fn static_cluster(name: &str, upstream_port: u16, options: &str) -> String {
    one_endpoint_cluster(
        name,
        &format!("{options}      type: STATIC\n      connect_timeout: 5s\n"),
        &format!("{{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream_port} }} }} }}"),
    )
}

/// A cluster `name` to the internal listener `second_pass`, as a `clusters:` list item.
fn internal_cluster(name: &str) -> String {
    one_endpoint_cluster(
        name,
        "      connect_timeout: 1s\n",
        "{ address: { envoy_internal_address: { server_listener_name: second_pass } } }",
    )
}

/// A cluster of one `endpoint` (a YAML flow mapping), `options` at the cluster's level.
fn one_endpoint_cluster(name: &str, options: &str, endpoint: &str) -> String {
    format!(
        r#"    - name: {name}
{options}      circuit_breakers:
        thresholds:
          - {{ max_connections: 10000, max_pending_requests: 10000, max_requests: 10000 }}
      load_assignment:
        cluster_name: {name}
        endpoints:
          - lb_endpoints:
              - endpoint: {endpoint}
"#
    )
}

/// One Envoy proxying everything to `upstream` (`127.0.0.1:port`): the cost of one hop.
pub fn plain_envoy_yaml(upstream_port: u16) -> String {
    let cluster = format!("  clusters:\n{}", upstream_cluster(upstream_port));
    one_listener(
        "plain",
        "# The benchmark's plain Envoy hop: one listener, one route, one static cluster.\n",
        "",
        "                        - match: { prefix: / }\n\
         \x20                         route: { cluster: upstream, timeout: 30s }\n",
        "",
        &cluster,
    )
}

/// Two Envoy passes and no filter: the public listener routes to an internal listener, whose
/// router proxies to `upstream`, as ai-router's front and attempt stages do. Against
/// [`plain_envoy_yaml`] it is the cost of the second pass alone (what a design with one pass
/// fewer would save before any filter work).
pub fn internal_hop_envoy_yaml(upstream_port: u16) -> String {
    two_passes(upstream_port, "", "")
}

/// [`internal_hop_envoy_yaml`] with the floor filter (bench/wasm-floor at `wasm`) on both
/// passes, in one VM as ai-router's stages share one: doing nothing (`acting` false, mode
/// `noop`) or the least ai-router's stages do with a call's bytes (modes `front` and
/// `attempt`, each writing `writes` request headers).
pub fn wasm_floor_envoy_yaml(
    upstream_port: u16,
    wasm: &std::path::Path,
    acting: bool,
    writes: usize,
) -> String {
    let filter = |mode: &str| {
        let mode = if acting {
            format!("{mode} {writes}")
        } else {
            "noop".into()
        };
        format!("                  - {}\n", floor_filter(wasm, &mode))
    };
    two_passes(upstream_port, &filter("front"), &filter("attempt"))
}

/// The floor filter (bench/wasm-floor at `wasm`) in `mode` (its plugin configuration), as one
/// YAML flow mapping; every instance in one VM, as ai-router's stages share one.
fn floor_filter(wasm: &std::path::Path, mode: &str) -> String {
    format!(
        r#"{{ name: envoy.filters.http.wasm, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, config: {{ allow_on_headers_stop_iteration: true, name: floor_{name}, root_id: floor, configuration: {{ "@type": type.googleapis.com/google.protobuf.StringValue, value: "{mode}" }}, vm_config: {{ vm_id: floor, runtime: envoy.wasm.runtime.v8, code: {{ local: {{ filename: "{}" }} }} }} }} }} }}"#,
        wasm.display(),
        name = mode.split(' ').next().unwrap_or("noop"),
    )
}

/// A cluster's protocol options (HTTP/1) with the floor filter in `mode` as its upstream HTTP
/// filter.
fn upstream_filter_options(wasm: &std::path::Path, mode: &str) -> String {
    format!(
        r#"      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http_protocol_options: {{}} }}
          http_filters:
            - {}
            - {{ name: envoy.filters.http.upstream_codec, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec }} }}
"#,
        floor_filter(wasm, mode)
    )
}

/// The floor filter in `mode` as an item of a listener's `http_filters`.
fn filter_item(wasm: &std::path::Path, mode: &str) -> String {
    format!("                  - {}\n", floor_filter(wasm, mode))
}

/// A first attempt in one pass (bench/wasm-floor's `onepass` and `upstream` modes; see there):
/// the public listener's filter does the work of both stages, and its route sends the call
/// straight to `upstream` through cluster `first_attempt`, whose upstream filter turns a failure
/// into a `307` that the route's internal redirect policy follows; the continuation goes
/// through the public listener again, then (`x-floor-lane: retry`) through the internal
/// listener, with a retry policy, as today's second pass.
pub fn one_pass_envoy_yaml(upstream_port: u16, wasm: &std::path::Path, writes: usize) -> String {
    let front = filter_item(wasm, &format!("onepass {writes}"));
    let attempt = filter_item(wasm, &format!("attempt {writes}"));
    let routes = "                        - match: { prefix: /, headers: [{ name: x-floor-lane, string_match: { exact: retry } }] }\n\
         \x20                         route: { cluster: second_pass, timeout: 30s, retry_policy: { retry_on: retriable-status-codes, retriable_status_codes: [503], num_retries: 1 } }\n\
         \x20                       - match: { prefix: / }\n\
         \x20                         route: { cluster: first_attempt, timeout: 30s, internal_redirect_policy: { redirect_response_codes: [307], max_internal_redirects: 1 } }\n";
    let options = upstream_filter_options(wasm, "upstream");
    two_passes_routed(
        upstream_port,
        &front,
        &attempt,
        routes,
        &static_cluster("first_attempt", upstream_port, &options),
    )
}

/// The per-try timeout of `one-pass-retry`'s route: how long a first attempt may go without an
/// answer (with an event stream, without its first event: the upstream filter holds the
/// headers until then) before the router retries it through the internal listener.
pub const ONE_PASS_RETRY_PER_TRY: &str = "1s";

/// A first attempt in one pass, failed over by the router's own retry (bench/wasm-floor's
/// `oneretry`, `upstream retry` and `retry` modes; see there): the public route's cluster is an
/// aggregate (`one_pass`) of the direct cluster (`first_attempt`, a dynamic forward proxy to the
/// host the filter writes in `:authority`) and the internal listener (twice, `second_pass` and
/// `second_pass_2`, so that a third attempt does not go back to the direct cluster), and its
/// retry policy (`previous_priorities`) sends each retry to the next one. The upstream filter
/// sits on the aggregate cluster (the router takes a route's upstream filters from the route's
/// cluster, not from the child that serves the attempt), so it sees every attempt's answer; a
/// 429/5xx or a stream's first error event comes back with `x-floor-retry`; a connect failure,
/// a reset before the answer and a per-try timeout are retried as they are. `first_hosts`: the
/// ports on 127.0.0.1 of the check's scripted first hosts, resolved at start with the
/// upstream's.
pub fn one_pass_retry_envoy_yaml(
    upstream_port: u16,
    wasm: &std::path::Path,
    writes: usize,
    first_hosts: &[u16],
) -> String {
    let preresolved: Vec<String> = std::iter::once(upstream_port)
        .chain(first_hosts.iter().copied())
        .map(|port| format!("{{ address: 127.0.0.1, port_value: {port} }}"))
        .collect();
    // The dynamic forward proxy's DNS cache (the filter's and the cluster's), every first host
    // resolved at start: an aggregate cluster gives a child with no host no load, the filter
    // resolves nothing for a route whose cluster is the aggregate, and the cluster's own
    // resolution (`dfp_cluster_resolves_hosts`, an asynchronous host selection) crashes Envoy
    // 1.40 under an aggregate cluster (a segmentation fault at the first unknown host), so it is
    // off, and a host not in the cache gets `no healthy upstream`, not retried.
    let dns_cache = format!(
        "{{ name: first_attempt, dns_lookup_family: V4_ONLY, host_ttl: 86400s, preresolve_hostnames: [{}] }}",
        preresolved.join(", ")
    );
    let front = filter_item(
        wasm,
        &format!("oneretry {writes} 127.0.0.1:{upstream_port}"),
    ) + &format!("                  - {{ name: envoy.filters.http.dynamic_forward_proxy, typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig, dns_cache_config: {dns_cache} }} }}\n");
    let attempt = filter_item(wasm, &format!("retry {writes}"));
    let routes = format!(
        "                        - match: {{ prefix: / }}\n\
         \x20                         route:\n\
         \x20                           cluster: one_pass\n\
         \x20                           timeout: 30s\n\
         \x20                           retry_policy:\n\
         \x20                             retry_on: \"retriable-headers,retriable-status-codes,reset,connect-failure\"\n\
         \x20                             retriable_status_codes: [502, 503]\n\
         \x20                             retriable_headers: [{{ name: x-floor-retry, present_match: true }}]\n\
         \x20                             num_retries: 2\n\
         \x20                             per_try_timeout: {ONE_PASS_RETRY_PER_TRY}\n\
         \x20                             retry_back_off: {{ base_interval: 0.01s, max_interval: 0.25s }}\n\
         \x20                             retry_priority:\n\
         \x20                               name: envoy.retry_priorities.previous_priorities\n\
         \x20                               typed_config:\n\
         \x20                                 \"@type\": type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig\n\
         \x20                                 update_frequency: 1\n"
    );
    let clusters = format!(
        r#"    - name: one_pass
      connect_timeout: 1s
      lb_policy: CLUSTER_PROVIDED
{}      cluster_type:
        name: envoy.clusters.aggregate
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig
          clusters: [first_attempt, second_pass, second_pass_2]
    - name: first_attempt
      connect_timeout: 1s
      lb_policy: CLUSTER_PROVIDED
      circuit_breakers:
        thresholds:
          - {{ max_connections: 10000, max_pending_requests: 10000, max_requests: 10000 }}
      cluster_type:
        name: envoy.clusters.dynamic_forward_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig
          allow_insecure_cluster_options: true
          dns_cache_config: {dns_cache}
"#,
        upstream_filter_options(wasm, "upstream retry")
    ) + &internal_cluster("second_pass_2");
    let yaml = two_passes_routed(upstream_port, &front, &attempt, &routes, &clusters)
        // The attempt count on each attempt's request, as ai-router's public route has it.
        .replacen(
            "                      domains: [\"*\"]\n",
            "                      domains: [\"*\"]\n                      include_request_attempt_count: true\n",
            1,
        );
    format!(
        "layered_runtime:\n  layers:\n    - name: static\n      static_layer: {{ envoy.reloadable_features.dfp_cluster_resolves_hosts: false }}\n{yaml}"
    )
}

/// The two-pass bootstrap, with the HTTP filters `front` (public listener) and `attempt`
/// (internal listener) before each router.
fn two_passes(upstream_port: u16, front: &str, attempt: &str) -> String {
    two_passes_routed(
        upstream_port,
        front,
        attempt,
        "                        - match: { prefix: / }\n\
         \x20                         route: { cluster: second_pass, timeout: 30s }\n",
        "",
    )
}

/// [`two_passes`] with the public listener's `routes` and more `clusters` (list items).
fn two_passes_routed(
    upstream_port: u16,
    front: &str,
    attempt: &str,
    routes: &str,
    clusters: &str,
) -> String {
    let tail = format!(
        r#"    - name: second_pass
      internal_listener: {{}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: second_pass
                route_config:
                  virtual_hosts:
                    - name: second_pass
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: / }}
                          route: {{ cluster: upstream, timeout: 30s }}
                http_filters:
{attempt}                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
"#,
    ) + &internal_cluster("second_pass")
        + &upstream_cluster(upstream_port)
        + clusters;
    let head = String::from(
        "# The benchmark's two-pass Envoy: a listener, an internal listener, one static cluster.\n\
         bootstrap_extensions:\n\
         \x20 - name: envoy.bootstrap.internal_listener\n\
         \x20   typed_config:\n\
         \x20     \"@type\": type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener\n",
    );
    one_listener("internal_hop", &head, "", routes, front, &tail)
}

/// A bootstrap with an admin interface and one HTTP listener, both on ephemeral loopback
/// ports: `head` before `static_resources`, `hcm` options, `routes` of its one virtual host,
/// `filters` before the router, `tail` after the listener (clusters).
fn one_listener(
    name: &str,
    head: &str,
    hcm: &str,
    routes: &str,
    filters: &str,
    tail: &str,
) -> String {
    format!(
        r#"{head}admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  listeners:
    - name: {name}
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: {name}
{hcm}                route_config:
                  virtual_hosts:
                    - name: {name}
                      domains: ["*"]
                      routes:
{routes}                http_filters:
{filters}                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{tail}"#
    )
}

/// An Envoy the benchmark configured itself, on ephemeral ports.
#[derive(Debug)]
pub struct BenchEnvoy {
    pub process: Process,
    pub admin: String,
    pub port: u16,
}

impl BenchEnvoy {
    /// Writes `yaml` as `<name>.yaml` in `dir` and runs it with `concurrency` workers.
    pub async fn start(
        dir: &TestDir,
        envoy: &Path,
        name: &str,
        yaml: &str,
        concurrency: u32,
    ) -> Result<Self> {
        let config = dir.write(&format!("{name}.yaml"), yaml)?;
        let admin_path = dir.join(&format!("{name}-admin.txt"));
        let args = vec![
            "-c".to_string(),
            config.display().to_string(),
            "--concurrency".to_string(),
            concurrency.to_string(),
            "--admin-address-path".to_string(),
            admin_path.display().to_string(),
            "--log-level".to_string(),
            "warn".to_string(),
            "--disable-hot-restart".to_string(),
        ];
        let mut process = Process::spawn(dir, name, envoy, &args, &[])?;
        let admin = {
            let admin_path = admin_path.clone();
            let result = poll(
                &format!("{name}'s admin address"),
                ENVOY_READY_TIMEOUT,
                || {
                    let status = process.try_status();
                    let text = std::fs::read_to_string(&admin_path).unwrap_or_default();
                    async move {
                        if let Some(st) = status? {
                            bail!("Envoy exited ({st})");
                        }
                        let text = text.trim().to_string();
                        Ok((!text.is_empty()).then_some(text))
                    }
                },
            )
            .await;
            result.with_context(|| process.tail())?
        };
        let client = ai_router_e2e::http_client()?;
        let url = format!("http://{admin}/listeners?format=json");
        let listen = poll(&format!("{name}'s listener"), ENVOY_READY_TIMEOUT, || {
            let req = client.get(&url).send();
            async move {
                let v: Value = req.await?.json().await?;
                Ok(public_listener(&v))
            }
        })
        .await
        .with_context(|| process.tail())?;
        Ok(Self {
            process,
            admin,
            port: listen.port(),
        })
    }

    /// Sets a runtime value through the admin API.
    pub async fn set_runtime(&self, key: &str, value: &str) -> Result<()> {
        let client = ai_router_e2e::http_client()?;
        let url = format!("http://{}/runtime_modify?{key}={value}", self.admin);
        let resp = client.post(&url).send().await?;
        if !resp.status().is_success() {
            bail!("{url} answered {}", resp.status());
        }
        Ok(())
    }
}

/// A counter or gauge from an Envoy's `/stats` (0 when absent).
pub async fn envoy_stat(admin: &str, name: &str) -> Result<u64> {
    let client = ai_router_e2e::http_client()?;
    let url = format!("http://{admin}/stats?format=json&filter=^{name}$");
    let v: Value = client.get(&url).send().await?.json().await?;
    Ok(v.get("stats")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|s| s.get("name").and_then(Value::as_str) == Some(name))
        })
        .and_then(|s| s.get("value"))
        .and_then(Value::as_u64)
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake upstream in a real Envoy: each key's answers under `/countdown/` count its
    /// minute down by a request and 19 tokens; another key counts on its own; the other
    /// variants carry no countdown.
    #[tokio::test]
    async fn the_countdown_variant_counts_each_key_s_minute_down_answer_by_answer() -> Result<()> {
        let dir = TestDir::new("bench-countdown")?;
        let envoy = ai_router_e2e::envoy_bin()?;
        let upstream = BenchEnvoy::start(&dir, &envoy, "up", &fake_upstream_yaml(), 1).await?;
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{}", upstream.port);
        let call = |path: &str, key: &str| {
            client
                .post(format!("{base}{path}"))
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body("{}")
                .send()
        };
        let figure = |r: &reqwest::Response, name: &str| -> Result<i64> {
            let v = r.headers().get(name).context(name.to_string())?;
            Ok(v.to_str()?.parse()?)
        };
        let (r, t) = (COUNTDOWN_REQUESTS as i64, COUNTDOWN_TOKENS as i64);
        // Each try with keys of its own; a try across a minute's turn (a reset that grows) is
        // made again, the next cannot be (the calls take milliseconds).
        let mut counted = None;
        for attempt in 0..3 {
            let (a, b) = (format!("a{attempt}"), format!("b{attempt}"));
            let mut seen = Vec::new();
            let mut resets = Vec::new();
            for (key, path) in [
                (&a, "/countdown/v1/chat/completions"),
                (&a, "/countdown/v1/chat/completions"),
                (&b, "/countdown/v1/chat/completions"),
                (&a, "/countdown/stream/v1/chat/completions"),
            ] {
                let r = call(path, key).await?;
                assert_eq!(r.status(), 200);
                let reset = r
                    .headers()
                    .get("x-ratelimit-reset-requests")
                    .context("reset")?
                    .to_str()?
                    .to_string();
                let secs: u64 = reset.trim_end_matches('s').parse()?;
                assert!((1..=60).contains(&secs), "{reset}");
                resets.push(secs);
                seen.push((
                    figure(&r, "x-ratelimit-remaining-requests")?,
                    figure(&r, "x-ratelimit-remaining-tokens")?,
                ));
                assert!(r.text().await?.contains("bench upstream"));
            }
            if resets.windows(2).all(|w| w[1] <= w[0]) {
                counted = Some(seen);
                break;
            }
        }
        let seen = counted.context("a minute turned during each of three tries")?;
        // a's first, a's second, b's own first, a's third (a stream counts as any answer).
        assert_eq!(
            seen,
            [
                (r - 1, t - 19),
                (r - 2, t - 38),
                (r - 1, t - 19),
                (r - 3, t - 57)
            ]
        );

        // The other variants are what they were: no Lua filter on their routes.
        for (prefix, remaining) in [("static", None), ("constant", Some("9999"))] {
            let r = call(&format!("/{prefix}/v1/chat/completions"), "a").await?;
            assert_eq!(r.status(), 200);
            let got = r.headers().get("x-ratelimit-remaining-requests");
            assert_eq!(got.and_then(|v| v.to_str().ok()), remaining, "{prefix}");
            assert!(
                r.headers().get("x-ratelimit-reset-requests").is_none(),
                "{prefix}"
            );
        }
        Ok(())
    }
}
