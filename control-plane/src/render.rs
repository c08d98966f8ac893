//! Renders the Envoy bootstrap for a pool: the public listener with the front filter and the
//! retry policy, the internal attempt listener, the provider clusters (dynamic forward proxy,
//! so the bootstrap does not change when the pool does), the control-plane cluster and the
//! singleton that holds the sync stream.

use crate::config::ListenerLimits;

/// Streams one client connection may have open at once over HTTP/2 (RFC 9113 asks for at least
/// 100); Envoy's default is unbounded.
const MAX_CONCURRENT_STREAMS: u32 = 100;
/// HTTP/2 flow-control windows on the public listener. Envoy's defaults (256 MiB per stream)
/// let a client push far more than a stream may buffer before Envoy can push back; a stream's
/// window is kept within its buffer limit (at least 1 MiB, see [`buffer_limit`]) and the
/// connection's to a few streams' worth.
const STREAM_WINDOW_BYTES: u64 = 1024 * 1024;
const CONNECTION_WINDOW_BYTES: u64 = 4 * STREAM_WINDOW_BYTES;

/// Everything the bootstrap depends on. Built from the config by the CLI (`render-envoy`, `up`)
/// and by the tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// Where the gateway listens (`gateway.host` / `gateway.port`); port 0 picks one.
    pub listen_host: String,
    pub listen_port: u16,
    /// Envoy's admin interface; port 0 picks one. Loopback only ([`admin_host_is_loopback`]):
    /// it has no authentication and can stop Envoy or turn on the debug log, which prints every
    /// secret in the headers.
    pub admin_host: String,
    pub admin_port: u16,
    /// The control plane's gRPC address (a host name or an IP).
    pub control_plane_host: String,
    pub control_plane_port: u16,
    /// Other control planes on the same shared stores (`--control-plane a:P,b:P`): listed in
    /// the same cluster, health-checked, so when the filter's sync stream breaks its reconnect
    /// lands on one that answers (see `failover_endpoints`).
    pub more_control_planes: Vec<(String, u16)>,
    /// Path of `ai_router_filter.wasm` as Envoy sees it.
    pub wasm_path: String,
    /// The folder (as Envoy sees it) holding the SDS files `ai-router certs` writes: the
    /// control-plane cluster then speaks mutual TLS (see `sync_tls_socket`). `None`: plaintext.
    pub sync_tls_dir: Option<String>,
    /// `gateway.maxBodyBytes`.
    pub max_body_bytes: u64,
    /// The largest `maxAttempts` of any policy (defaults and profiles): the router's retries.
    pub max_attempts: u32,
    /// `gateway.requestHeadersTimeoutMs`, `requestTimeoutMs`, `connectionIdleTimeoutMs`,
    /// `maxConcurrentRequests`.
    pub limits: ListenerLimits,
    /// `gateway.onePass`: the plain-HTTP providers' `(host, port)`, resolved when Envoy starts
    /// so that a call's first attempt can leave from the public listener (the `one_pass` cluster).
    /// `None`: every attempt goes through the attempt listener.
    pub one_pass: Option<Vec<(String, u16)>>,
}

/// Whether `host` (an IP or `localhost`) is a loopback address: the only kind Envoy's own admin
/// interface may bind (`render-envoy --admin` refuses any other).
pub fn admin_host_is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Envoy's own answers on the public listener (codec errors, timeouts, the router's), as
/// OpenAI error objects: `(status, code, message)`; the type follows the status. Any other status Envoy answers itself
/// gets [`OTHER_LOCAL_REPLY`].
const LOCAL_REPLIES: &[(u16, &str, &str)] = &[
    (400, "invalid_request", "The request is not valid HTTP."),
    (
        408,
        "request_timeout",
        "The request was not received in time.",
    ),
    (413, "request_too_large", "The request is too large."),
    (426, "upgrade_required", "Use HTTP/1.1 or HTTP/2."),
    (
        431,
        "header_too_large",
        "The request headers are too large.",
    ),
    (500, "internal_error", "The gateway failed."),
    (
        502,
        "upstream_error",
        "The gateway could not reach a provider.",
    ),
    (
        503,
        "pool_unavailable",
        "The gateway cannot take this call now.",
    ),
    (504, "pool_timeout", "The call's deadline passed."),
];
const OTHER_LOCAL_REPLY: (&str, &str, &str) = (
    "gateway_error",
    "api_error",
    "The gateway refused the request.",
);

/// Envoy's `local_reply_config` for the public listener. Filters' local replies pass through it
/// too: the front stage's own error objects (sent with an empty response code details string)
/// are left alone by matching only replies whose details Envoy filled in.
fn local_reply_config(indent: usize) -> String {
    let pad = " ".repeat(indent);
    let envoy_only = format!(
        "{pad}          - extension_filter:\n{pad}              name: envoy.access_loggers.extension_filters.cel\n{pad}              typed_config:\n{pad}                \"@type\": type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter\n{pad}                expression: \"response.code_details != ''\"\n"
    );
    let body = |code: &str, kind: &str, message: &str| {
        format!(
            "{pad}    body_format_override:\n{pad}      json_format:\n{pad}        error: {{ message: {}, type: {}, param: null, code: {} }}\n",
            q(message),
            q(kind),
            q(code)
        )
    };
    let mut out = format!("{pad}local_reply_config:\n{pad}  mappers:\n");
    // A WebSocket upgrade (Codex's built-in OpenAI provider tries one on /v1/responses before
    // HTTPS): Envoy refuses it (403, `upgrade_failed`); 426 is what Codex reads as "use
    // HTTPS" at once, where a 403 costs its session seven handshakes (~7 s).
    out.push_str(&format!(
        "{pad}  - filter:\n{pad}      extension_filter:\n{pad}        name: envoy.access_loggers.extension_filters.cel\n{pad}        typed_config:\n{pad}          \"@type\": type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter\n{pad}          expression: \"response.code_details == 'upgrade_failed'\"\n{pad}    status_code: 426\n"
    ));
    out.push_str(&body(
        "upgrade_required",
        ai_router_contract::openai_error_type(426),
        "The gateway serves no WebSocket: send the request over HTTPS (POST).",
    ));
    for (status, code, message) in LOCAL_REPLIES {
        let kind = ai_router_contract::openai_error_type(*status);
        out.push_str(&format!(
            "{pad}  - filter:\n{pad}      and_filter:\n{pad}        filters:\n{pad}          - status_code_filter: {{ comparison: {{ op: EQ, value: {{ default_value: {status}, runtime_key: ai_router.local_reply.{status} }} }} }}\n{envoy_only}"
        ));
        out.push_str(&body(code, kind, message));
    }
    let (code, kind, message) = OTHER_LOCAL_REPLY;
    out.push_str(&format!(
        "{pad}  - filter:\n{pad}      and_filter:\n{pad}        filters:\n{pad}          - status_code_filter: {{ comparison: {{ op: GE, value: {{ default_value: 400, runtime_key: ai_router.local_reply.other }} }} }}\n{envoy_only}"
    ));
    out.push_str(&body(code, kind, message));
    out
}

/// `1.500s`.
fn seconds(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// Envoy's default thresholds (1024 connections, pending and active requests; 3 retries in
/// flight per cluster) would cut a busy pool's failover off with "retry overflow": every cluster
/// a call crosses is sized for `max_concurrent_requests` calls in flight, each of which may be
/// retrying.
fn circuit_breakers(max_concurrent_requests: u32, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let n = max_concurrent_requests;
    format!(
        "{pad}circuit_breakers:\n{pad}  thresholds:\n{pad}    - priority: DEFAULT\n{pad}      max_connections: {n}\n{pad}      max_pending_requests: {n}\n{pad}      max_requests: {n}\n{pad}      max_retries: {n}\n"
    )
}

/// Shared by the listeners and the cluster that carry a request body: Envoy needs the whole
/// body buffered to replay it on a retry.
fn buffer_limit(max_body_bytes: u64) -> u64 {
    // Room for the body twice over (the replay buffer and the body the attempt rewrites) plus
    // headers; never below 1 MiB.
    max_body_bytes
        .saturating_mul(2)
        .saturating_add(64 * 1024)
        .max(1024 * 1024)
}

use ai_router_contract::plugin::{roles, OnePass, PluginConfig, DEFAULT_NODE, DEFAULT_TICK_MS};
use ai_router_contract::{clusters, headers};

fn q(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// The plugin configuration and VM shared by the three roles: one `vm_id`, so the front stage,
/// the attempt stage and the singleton share Envoy's shared data and queues.
fn wasm_config(name: &str, plugin: &PluginConfig, wasm_path: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let config = format!(
        "name: {name}\nroot_id: {name}\nconfiguration:\n  \"@type\": type.googleapis.com/google.protobuf.StringValue\n  value: {role}\nvm_config:\n  vm_id: {vm_id}\n  runtime: envoy.wasm.runtime.v8\n  code: {{ local: {{ filename: {wasm} }} }}\n  environment_variables:\n    host_env_keys: [{token_env}]\n",
        token_env = ai_router_contract::SYNC_TOKEN_ENV,
        vm_id = ai_router_contract::shared::VM_ID,
        role = q(&plugin.to_json()),
        wasm = q(wasm_path),
    );
    config.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// One stage of the filter as an item of an `http_filters` list at `indent`: the wasm filter
/// (pausing on headers allowed, as the stages do) with the plugin `name` and its configuration.
fn wasm_filter(name: &str, plugin: &PluginConfig, wasm_path: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    format!(
        "{pad}- name: envoy.filters.http.wasm\n{pad}  typed_config:\n{pad}    \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n{pad}    config:\n{pad}      allow_on_headers_stop_iteration: true\n{}",
        wasm_config(name, plugin, wasm_path, indent + 6)
    )
}

/// The Envoy bootstrap YAML: the header, Envoy's own settings and the singleton, then the
/// three listeners and the clusters, in that order.
pub fn render_envoy(o: &RenderOptions) -> String {
    [
        bootstrap_head(o),
        public_listener(o),
        attempt_listener(o),
        timer_listener(),
        internal_clusters(o),
        one_pass(o),
        provider_clusters(o),
        control_plane_cluster(o),
    ]
    .concat()
}

/// With one pass, the provider cache's entries resolved at start and kept: the aggregate gives
/// a child with no host no load, and resolves nothing itself (see [`one_pass`]).
fn preresolved_hosts(o: &RenderOptions) -> String {
    let Some(hosts) = &o.one_pass else {
        return String::new();
    };
    let mut out = String::from(
        "                        # One pass: the plain providers resolved at start, and kept.\n                        host_ttl: 86400s\n",
    );
    if hosts.is_empty() {
        return out;
    }
    out.push_str("                        preresolve_hostnames:\n");
    for (host, port) in hosts {
        out.push_str(&format!(
            "                          - {{ address: {}, port_value: {port} }}\n",
            q(host)
        ));
    }
    out
}

/// `gateway.onePass`: the aggregate the front sends a call to when its first lane is a plain
/// provider resolved at start. Its priorities are `providers_plain` (the first attempt, the
/// host in `:authority`) and one attempts cluster per retry: the route's retry priority sends
/// each retry to the next one, so a retry never goes back to the provider straight. The
/// attempt stage runs as its upstream filter (role `first`): it writes the first attempt's
/// request (the lane the front reserved), judges its answer (the retry header on a failure),
/// and puts back on a retry the client's headers it rewrote (an upstream filter's header writes
/// stay in the router's copy). Envoy 1.40 crashes when a dynamic forward proxy cluster under an
/// aggregate resolves a host itself, so it never does (`dfp_cluster_resolves_hosts` off).
fn one_pass(o: &RenderOptions) -> String {
    if o.one_pass.is_none() {
        return String::new();
    }
    let limit = buffer_limit(o.max_body_bytes);
    let breakers = circuit_breakers(o.limits.max_concurrent_requests, 6);
    let retries = o.max_attempts.max(2) - 1;
    let mut children = vec![
        clusters::PROVIDERS_PLAIN.to_owned(),
        clusters::ATTEMPTS.to_owned(),
    ];
    let mut retry_clusters = String::new();
    for n in 2..=retries {
        let name = clusters::attempts_retry(n);
        retry_clusters.push_str(&format!(
            r#"    - name: {name}
      connect_timeout: 1s
      per_connection_buffer_limit_bytes: {limit}
{breakers}      load_assignment:
        cluster_name: {name}
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    envoy_internal_address: {{ server_listener_name: ai_router_attempt }}
"#
        ));
        children.push(name);
    }
    let first = wasm_filter(
        "ai_router_first",
        &PluginConfig::role(roles::FIRST),
        &o.wasm_path,
        12,
    );
    let one_pass = clusters::ONE_PASS;
    let children = children.join(", ");
    format!(
        r#"    - name: {one_pass}
      connect_timeout: 5s
      lb_policy: CLUSTER_PROVIDED
      per_connection_buffer_limit_bytes: {limit}
{breakers}      cluster_type:
        name: envoy.clusters.aggregate
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig
          clusters: [{children}]
      # The router takes a route's upstream filters from the route's cluster (this one), for
      # every attempt, whichever child serves it.
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http_protocol_options: {{}} }}
          http_filters:
{first}            - name: envoy.filters.http.upstream_codec
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec
{retry_clusters}"#
    )
}

/// The header comment, the node (SDS needs it named), the admin interface, the overload and
/// memory settings and the bootstrap extensions with the singleton (role=ctrl).
fn bootstrap_head(o: &RenderOptions) -> String {
    let ctrl = wasm_config(
        "ai_router_ctrl",
        &PluginConfig::ctrl(clusters::CONTROL_PLANE, DEFAULT_NODE, DEFAULT_TICK_MS),
        &o.wasm_path,
        8,
    );
    let admin_host = q(&o.admin_host);
    let admin_port = o.admin_port;
    // SDS (the sync channel's certificates) needs the node named.
    let node = if o.sync_tls_dir.is_some() {
        "node: { id: ai-router-envoy, cluster: ai-router }\n"
    } else {
        ""
    };
    // Every name the filter also uses comes from the contract crate.
    let retry_header = headers::RETRY;
    let (control_plane_cluster, attempts_cluster) = (clusters::CONTROL_PLANE, clusters::ATTEMPTS);
    let (providers_tls, providers_plain) = (clusters::PROVIDERS_TLS, clusters::PROVIDERS_PLAIN);
    // One pass: a provider cluster under the aggregate never resolves a host itself (it
    // crashes Envoy 1.40 there); the hosts are resolved at start instead.
    let runtime = match o.one_pass {
        Some(_) => "layered_runtime:\n  layers:\n    - name: static\n      static_layer: { envoy.reloadable_features.dfp_cluster_resolves_hosts: false }\n",
        None => "",
    };
    format!(
        r#"# Generated by `ai-router render-envoy`; edit the pool config and render again instead.
#
# client -> listener ai_router_public: wasm role=front -> router (retries on {retry_header})
#   -> cluster {attempts_cluster} -> internal listener ai_router_attempt: wasm role=attempt
#   -> dynamic forward proxy -> router -> {providers_tls} | {providers_plain} -> provider
# operator -> /admin/... on the same listener -> cluster {control_plane_cluster} (the admin API)
# The singleton (role=ctrl) holds the control plane's sync stream for this process.
{node}admin:
  address: {{ socket_address: {{ address: {admin_host}, port_value: {admin_port} }} }}
overload_manager:
  resource_monitors:
    - name: envoy.resource_monitors.global_downstream_max_connections
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig
        max_active_downstream_connections: 50000
# Hands tcmalloc's free pages back to the system every second: compiling the filter and
# decoding a snapshot leave freed pages behind (about 5 MB at 10,000 keys, docs/benchmarks.md).
memory_allocator_manager:
  bytes_to_release: 104857600
  memory_release_interval: 1s
{runtime}bootstrap_extensions:
  - name: envoy.bootstrap.internal_listener
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener
  - name: envoy.bootstrap.wasm
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.wasm.v3.WasmService
      singleton: true
      config:
{ctrl}"#
    )
}

/// `static_resources` and its public listener: the listener limits, Envoy's own answers as
/// OpenAI errors, the admin route, the route to the attempts with the retry policy, and the
/// front stage.
fn public_listener(o: &RenderOptions) -> String {
    let limit = buffer_limit(o.max_body_bytes);
    let retries = o.max_attempts.max(1) - 1;
    let front_config = PluginConfig {
        one_pass: o.one_pass.as_ref().map(|hosts| OnePass {
            hosts: hosts
                .iter()
                .map(|(host, port)| ai_router_contract::authority_of(host, *port))
                .collect(),
            retries,
        }),
        ..PluginConfig::role(roles::FRONT)
    };
    let front = wasm_filter("ai_router_front", &front_config, &o.wasm_path, 18);
    // With one pass the front names the route's cluster: the attempts, or the aggregate whose
    // first attempt goes straight to the provider and whose retries go to the next priority.
    let (route_cluster, retry_priority) = match o.one_pass {
        Some(_) => (
            format!("cluster_header: {}", headers::PASS),
            "                              # One pass: each retry to the aggregate's next priority (an attempts\n                              # cluster), never back to the provider the first attempt went to.\n                              retry_priority:\n                                name: envoy.retry_priorities.previous_priorities\n                                typed_config:\n                                  \"@type\": type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig\n                                  update_frequency: 1\n".to_owned(),
        ),
        None => (format!("cluster: {}", clusters::ATTEMPTS), String::new()),
    };
    let listen_host = q(&o.listen_host);
    let listen_port = o.listen_port;
    let request_headers_timeout = seconds(o.limits.request_headers_timeout_ms);
    let request_timeout = seconds(o.limits.request_timeout_ms);
    let connection_idle_timeout = seconds(o.limits.connection_idle_timeout_ms);
    let local_replies = local_reply_config(16);
    let (streams, stream_window, connection_window) = (
        MAX_CONCURRENT_STREAMS,
        STREAM_WINDOW_BYTES,
        CONNECTION_WINDOW_BYTES,
    );
    let retry_header = headers::RETRY;
    let control_plane_cluster = clusters::CONTROL_PLANE;
    format!(
        r#"static_resources:
  listeners:
    - name: ai_router_public
      address: {{ socket_address: {{ address: {listen_host}, port_value: {listen_port} }} }}
      # The only inbound listener: a drain (`POST /drain_listeners?inboundonly`) stops it and
      # leaves the internal hops to the calls in flight.
      traffic_direction: INBOUND
      per_connection_buffer_limit_bytes: {limit}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ai_router_public
                generate_request_id: true
                # After Envoy closes an HTTP/1 connection (a local reply with `Connection: close`,
                # a stream cut after its first token), how long it waits for the client to close
                # first. Envoy's 1 s default made a client see a cut stream end 1 s after the
                # cut; 100 ms still lets a client read a final answer before the socket goes.
                delayed_close_timeout: 0.1s
                # The call's deadline bounds a request (x-envoy-upstream-rq-timeout-ms, set by the
                # front stage), not a silence: a call may wait for a lane.
                stream_idle_timeout: 0s
                # What a client may hold open (gateway.requestHeadersTimeoutMs, requestTimeoutMs,
                # connectionIdleTimeoutMs): slow headers and stalled bodies are answered 408 and
                # closed. request_timeout ends once the request body is in (or the answer has
                # started), so it never cuts a streamed answer.
                request_headers_timeout: {request_headers_timeout}
                request_timeout: {request_timeout}
                common_http_protocol_options:
                  idle_timeout: {connection_idle_timeout}
                  # Some servers read x_a as x-a: an underscore header could pass for an internal one.
                  headers_with_underscores_action: DROP_HEADER
                http2_protocol_options:
                  max_concurrent_streams: {streams}
                  initial_stream_window_size: {stream_window}
                  initial_connection_window_size: {connection_window}
                # Envoy's own answers (timeouts, codec errors, the router's) as OpenAI errors.
{local_replies}                route_config:
                  name: ai_router_public
                  virtual_hosts:
                    - name: ai_router
                      domains: ["*"]
                      include_request_attempt_count: true
                      routes:
                        # The admin API on the gateway's listener: to the control plane (its
                        # gRPC port also serves the /admin/ HTTP routes), admin token checked
                        # there. No retries; no timeout (GET /admin/events is a stream).
                        - match: {{ prefix: "/admin/" }}
                          route:
                            cluster: {control_plane_cluster}
                            timeout: 0s
                        - match: {{ prefix: "/" }}
                          route:
                            {route_cluster}
                            # The call's deadline bounds it (x-envoy-upstream-rq-timeout-ms, set
                            # by the front stage); the route itself never cuts a stream.
                            timeout: 0s
                            retry_policy:
                              # {retry_header}: the attempt stage's verdict. 502/503: the
                              # attempt listener's own answer when a provider broke off while
                              # the attempt stage held its response (before the first token).
                              retry_on: "retriable-headers,retriable-status-codes,reset,connect-failure"
                              retriable_status_codes: [502, 503]
                              num_retries: {retries}
                              retriable_headers:
                                - name: {retry_header}
                                  present_match: true
                              retry_back_off: {{ base_interval: 0.01s, max_interval: 0.25s }}
{retry_priority}                http_filters:
{front}                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// The internal listener of the attempt stage: the route to the cluster the stage chose, then
/// the dynamic forward proxy.
fn attempt_listener(o: &RenderOptions) -> String {
    let limit = buffer_limit(o.max_body_bytes);
    let attempt = wasm_filter(
        "ai_router_attempt",
        &PluginConfig::role(roles::ATTEMPT),
        &o.wasm_path,
        18,
    );
    let concurrency = o.limits.max_concurrent_requests;
    let cluster_header = headers::CLUSTER;
    let preresolved = preresolved_hosts(o);
    format!(
        r#"    - name: ai_router_attempt
      internal_listener: {{}}
      per_connection_buffer_limit_bytes: {limit}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ai_router_attempt
                # An internal connection has no peer to wait for when a stream is cut.
                delayed_close_timeout: 0s
                # An attempt may wait (a backoff, a lane coming back) as long as its call's
                # deadline allows, which the public route bounds; its provider's silence is
                # bounded by the attempt stage (timeoutMs).
                stream_idle_timeout: 0s
                route_config:
                  name: ai_router_attempt
                  virtual_hosts:
                    - name: providers
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          # No route timeout nor idle timeout: the attempt stage bounds each
                          # attempt by its call's timeoutMs (until the first token, then each gap
                          # between chunks), and the public route the call by its deadline. An
                          # idle timeout here would also cut an attempt waiting for a lane.
                          route: {{ cluster_header: {cluster_header}, timeout: 0s }}
                          # Chosen by the attempt stage; the provider never sees it.
                          request_headers_to_remove: [{cluster_header}]
                http_filters:
{attempt}                  - name: envoy.filters.http.dynamic_forward_proxy
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig
                      dns_cache_config: &dns_cache
                        name: ai_router_providers
                        dns_lookup_family: V4_PREFERRED
                        # Calls waiting for a provider's name to resolve (default 1024).
                        dns_cache_circuit_breaker: {{ max_pending_requests: {concurrency} }}
{preresolved}                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// The internal listener the attempt stage waits on (the fault filter's header delay).
fn timer_listener() -> String {
    let timer = clusters::TIMER;
    format!(
        r#"    # The attempt stage waits (backoff, a lane coming back before the deadline) by calling this
    # listener: the fault filter delays the answer by x-envoy-fault-delay-request ms.
    - name: {timer}
      internal_listener: {{}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: {timer}
                # A wait lasts as long as it was asked to (bounded by the attempt stage).
                stream_idle_timeout: 0s
                route_config:
                  name: {timer}
                  virtual_hosts:
                    - name: timer
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          direct_response: {{ status: 204 }}
                http_filters:
                  - name: envoy.filters.http.fault
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
                      delay:
                        header_delay: {{}}
                        percentage: {{ numerator: 100, denominator: HUNDRED }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// `clusters` and the two internal ones: the timer and the attempts.
fn internal_clusters(o: &RenderOptions) -> String {
    let limit = buffer_limit(o.max_body_bytes);
    let breakers = circuit_breakers(o.limits.max_concurrent_requests, 6);
    let timer = clusters::TIMER;
    let attempts_cluster = clusters::ATTEMPTS;
    format!(
        r#"  clusters:
    - name: {timer}
      connect_timeout: 1s
{breakers}      load_assignment:
        cluster_name: {timer}
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    envoy_internal_address: {{ server_listener_name: {timer} }}
    - name: {attempts_cluster}
      connect_timeout: 1s
      per_connection_buffer_limit_bytes: {limit}
      # One connection and one request per attempt in flight; every call may be retrying.
{breakers}      load_assignment:
        cluster_name: {attempts_cluster}
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    envoy_internal_address: {{ server_listener_name: ai_router_attempt }}
"#
    )
}

/// The providers' clusters (dynamic forward proxy): TLS, and plain HTTP.
fn provider_clusters(o: &RenderOptions) -> String {
    let breakers = circuit_breakers(o.limits.max_concurrent_requests, 6);
    let (providers_tls, providers_plain) = (clusters::PROVIDERS_TLS, clusters::PROVIDERS_PLAIN);
    format!(
        r#"    - name: {providers_tls}
      connect_timeout: 10s
      lb_policy: CLUSTER_PROVIDED
{breakers}      cluster_type:
        name: envoy.clusters.dynamic_forward_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig
          dns_cache_config: *dns_cache
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          upstream_http_protocol_options: {{ auto_sni: true, auto_san_validation: true }}
          auto_config:
            http_protocol_options: {{}}
            http2_protocol_options: {{}}
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          common_tls_context:
            alpn_protocols: ["h2", "http/1.1"]
            validation_context:
              trusted_ca: {{ filename: /etc/ssl/certs/ca-certificates.crt }}
    - name: {providers_plain}
      connect_timeout: 5s
      lb_policy: CLUSTER_PROVIDED
{breakers}      cluster_type:
        name: envoy.clusters.dynamic_forward_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig
          dns_cache_config: *dns_cache
          # Plain HTTP endpoints (a local model server, the mock) have no certificate to check.
          allow_insecure_cluster_options: true
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http_protocol_options: {{}} }}
"#
    )
}

/// The control plane's cluster: HTTP/2 with keepalive, mutual TLS when configured, and the
/// other control planes to fail over to.
fn control_plane_cluster(o: &RenderOptions) -> String {
    let cp_host = q(&o.control_plane_host);
    let cp_port = o.control_plane_port;
    let (control_plane_failover, more_control_planes) = failover_endpoints(o);
    let sync_tls = sync_tls_socket(o);
    let control_plane_cluster = clusters::CONTROL_PLANE;
    format!(
        r#"    - name: {control_plane_cluster}
      type: STRICT_DNS
      connect_timeout: 2s
      dns_lookup_family: V4_PREFERRED
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options:
              connection_keepalive: {{ interval: 10s, timeout: 5s }}
{sync_tls}{control_plane_failover}      load_assignment:
        cluster_name: {control_plane_cluster}
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address: {{ socket_address: {{ address: {cp_host}, port_value: {cp_port} }} }}
{more_control_planes}"#
    )
}

/// The control-plane cluster's mutual TLS, when `sync_tls_dir` is set: Envoy presents the
/// client certificate and checks the control plane's against the CA, both read through SDS
/// from the files `ai-router certs` writes (reloaded when a file is moved into the folder, so a
/// rotation needs no restart), and the certificate must name one of the control planes it
/// dials (a DNS or IP subject alternative name).
fn sync_tls_socket(o: &RenderOptions) -> String {
    use crate::tls::{SDS_CA_FILE, SDS_CA_SECRET, SDS_CERTIFICATE_FILE, SDS_CERTIFICATE_SECRET};
    let Some(dir) = o.sync_tls_dir.as_deref() else {
        return String::new();
    };
    let dir = dir.trim_end_matches('/');
    let mut hosts: Vec<&str> = vec![o.control_plane_host.as_str()];
    for (host, _) in &o.more_control_planes {
        if !hosts.contains(&host.as_str()) {
            hosts.push(host);
        }
    }
    let mut sans = String::new();
    for host in &hosts {
        let kind = if host.parse::<std::net::IpAddr>().is_ok() {
            "IP_ADDRESS"
        } else {
            "DNS"
        };
        sans.push_str(&format!(
            "                  - {{ san_type: {kind}, matcher: {{ exact: {} }} }}\n",
            q(host)
        ));
    }
    // SNI only for a name (an IP is not a server name).
    let sni = if o.control_plane_host.parse::<std::net::IpAddr>().is_ok() {
        String::new()
    } else {
        format!("          sni: {}\n", q(&o.control_plane_host))
    };
    let source = |file: &str| {
        format!(
            "{{ resource_api_version: V3, path_config_source: {{ path: {}, watched_directory: {{ path: {} }} }} }}",
            q(&format!("{dir}/{file}")),
            q(dir)
        )
    };
    format!(
        "      # Mutual TLS to the control plane: the sync stream carries every provider key.
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
{sni}          common_tls_context:
            alpn_protocols: [h2]
            tls_certificate_sds_secret_configs:
              - name: {SDS_CERTIFICATE_SECRET}
                sds_config: {}
            combined_validation_context:
              default_validation_context:
                match_typed_subject_alt_names:
{sans}              validation_context_sds_secret_config:
                name: {SDS_CA_SECRET}
                sds_config: {}
",
        source(SDS_CERTIFICATE_FILE),
        source(SDS_CA_FILE)
    )
}

/// The other control planes' endpoints, one priority each after the first's, and the health
/// check that takes one that stopped out within about a second (TCP connect every second; one
/// failure ejects, one success takes it back). Empty with one control plane: that bootstrap
/// stays as it was.
fn failover_endpoints(o: &RenderOptions) -> (String, String) {
    if o.more_control_planes.is_empty() {
        return (String::new(), String::new());
    }
    let checks = "      # Several control planes: a reconnect goes to one that answers.
      health_checks:
        - timeout: 1s
          interval: 1s
          # Envoy checks a cluster it counts as idle once a minute otherwise (the sync stream's
          # reconnects may not count as traffic), so a stopped control plane would stay in.
          no_traffic_interval: 1s
          no_traffic_healthy_interval: 1s
          unhealthy_threshold: 1
          healthy_threshold: 1
          tcp_health_check: {}
      common_lb_config: { healthy_panic_threshold: { value: 0 } }
"
    .to_owned();
    // One priority per control plane, in the order given: the stream goes to the first that
    // passes its health check, to the next one only while those before it are out.
    let mut endpoints = String::new();
    for (priority, (host, port)) in (1..).zip(&o.more_control_planes) {
        endpoints.push_str(&format!(
            "          - priority: {priority}\n            lb_endpoints:\n              - endpoint:\n                  address: {{ socket_address: {{ address: {}, port_value: {port} }} }}\n",
            q(host)
        ));
    }
    (checks, endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> RenderOptions {
        RenderOptions {
            listen_host: "127.0.0.1".into(),
            listen_port: 8080,
            admin_host: "127.0.0.1".into(),
            admin_port: 9901,
            control_plane_host: "control-plane".into(),
            control_plane_port: 8082,
            more_control_planes: Vec::new(),
            wasm_path: "/etc/envoy/wasm/ai_router_filter.wasm".into(),
            sync_tls_dir: None,
            max_body_bytes: 4 * 1024 * 1024,
            max_attempts: 4,
            limits: ListenerLimits::default(),
            one_pass: None,
        }
    }

    #[test]
    fn several_control_planes_are_one_health_checked_cluster_in_priority_order() {
        let one = render_envoy(&options());
        assert!(
            !one.contains("health_checks"),
            "one control plane: as before"
        );
        let mut o = options();
        o.more_control_planes = vec![("cp-b".into(), 9082), ("10.0.0.3".into(), 8082)];
        let yaml = render_envoy(&o);
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        let clusters = doc["static_resources"]["clusters"].as_sequence().unwrap();
        let cp = clusters
            .iter()
            .find(|c| c["name"] == clusters::CONTROL_PLANE)
            .unwrap();
        let group = |i: usize| -> Vec<(String, u64)> {
            cp["load_assignment"]["endpoints"][i]["lb_endpoints"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|e| {
                    let a = &e["endpoint"]["address"]["socket_address"];
                    (
                        a["address"].as_str().unwrap().to_owned(),
                        a["port_value"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        // One priority each, in the order given: the first that answers holds the stream.
        assert_eq!(group(0), [("control-plane".to_owned(), 8082)]);
        assert_eq!(group(1), [("cp-b".to_owned(), 9082)]);
        assert_eq!(group(2), [("10.0.0.3".to_owned(), 8082)]);
        for (i, priority) in [(0, None), (1, Some(1)), (2, Some(2))] {
            assert_eq!(
                cp["load_assignment"]["endpoints"][i]["priority"].as_u64(),
                priority
            );
        }
        assert_eq!(cp["health_checks"][0]["interval"], "1s");
        assert_eq!(cp["health_checks"][0]["no_traffic_interval"], "1s");
        assert_eq!(cp["health_checks"][0]["unhealthy_threshold"], 1);
        assert!(cp["health_checks"][0].get("tcp_health_check").is_some());
    }

    /// The admin address of a rendered bootstrap.
    fn admin_host_of(yaml: &str) -> String {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
        doc["admin"]["address"]["socket_address"]["address"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn envoy_admin_binds_loopback_in_every_rendered_bootstrap() {
        assert_eq!(admin_host_of(&render_envoy(&options())), "127.0.0.1");
        // The checked-in bootstraps (compose mounts them; tests keep them current).
        for (name, yaml) in [
            ("envoy.yaml", include_str!("../../envoy/envoy.yaml")),
            (
                "envoy-cluster-a.yaml",
                include_str!("../../envoy/envoy-cluster-a.yaml"),
            ),
            (
                "envoy-cluster-b.yaml",
                include_str!("../../envoy/envoy-cluster-b.yaml"),
            ),
        ] {
            let host = admin_host_of(yaml);
            assert!(
                admin_host_is_loopback(&host),
                "envoy/{name} binds Envoy's admin to {host}"
            );
        }
        for host in ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"] {
            assert!(admin_host_is_loopback(host), "{host}");
        }
        for host in ["0.0.0.0", "::", "10.0.0.3", "envoy", "localhost.example"] {
            assert!(!admin_host_is_loopback(host), "{host}");
        }
    }

    #[test]
    fn the_control_plane_cluster_speaks_mutual_tls_through_sds_when_asked() {
        let cluster = |o: &RenderOptions| {
            let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&render_envoy(o)).unwrap();
            doc["static_resources"]["clusters"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|c| c["name"] == clusters::CONTROL_PLANE)
                .unwrap()
                .clone()
        };
        assert!(cluster(&options()).get("transport_socket").is_none());
        let mut o = options();
        o.sync_tls_dir = Some("/etc/envoy/sync-tls/".into());
        o.more_control_planes = vec![("10.0.0.3".into(), 8082)];
        let cp = cluster(&o);
        let tls = &cp["transport_socket"]["typed_config"];
        assert_eq!(tls["sni"], "control-plane");
        let common = &tls["common_tls_context"];
        assert_eq!(common["alpn_protocols"][0], "h2");
        let cert = &common["tls_certificate_sds_secret_configs"][0];
        assert_eq!(cert["name"], crate::tls::SDS_CERTIFICATE_SECRET);
        assert_eq!(
            cert["sds_config"]["path_config_source"]["path"],
            "/etc/envoy/sync-tls/sds-certificate.yaml"
        );
        assert_eq!(
            cert["sds_config"]["path_config_source"]["watched_directory"]["path"],
            "/etc/envoy/sync-tls"
        );
        let validation = &common["combined_validation_context"];
        let sans = &validation["default_validation_context"]["match_typed_subject_alt_names"];
        assert_eq!(sans[0]["san_type"], "DNS");
        assert_eq!(sans[0]["matcher"]["exact"], "control-plane");
        assert_eq!(sans[1]["san_type"], "IP_ADDRESS");
        assert_eq!(sans[1]["matcher"]["exact"], "10.0.0.3");
        assert_eq!(
            validation["validation_context_sds_secret_config"]["sds_config"]["path_config_source"]
                ["path"],
            "/etc/envoy/sync-tls/sds-ca.yaml"
        );
    }

    /// Every wasm plugin of a rendered bootstrap (its `root_id` and its mapping), in order.
    fn wasm_plugins(node: &serde_yaml_ng::Value, found: &mut Vec<serde_yaml_ng::Value>) {
        match node {
            serde_yaml_ng::Value::Mapping(map) => {
                if map.contains_key("root_id") {
                    found.push(node.clone());
                }
                map.values().for_each(|v| wasm_plugins(v, found));
            }
            serde_yaml_ng::Value::Sequence(items) => {
                items.iter().for_each(|v| wasm_plugins(v, found))
            }
            _ => {}
        }
    }

    #[test]
    fn the_filter_reads_back_each_rendered_plugin_configuration() {
        use ai_router_filter_core::vm::plugin::{parse, Role};
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&render_envoy(&options())).unwrap();
        let mut plugins = Vec::new();
        wasm_plugins(&doc, &mut plugins);
        let roles: Vec<(String, Role)> = plugins
            .iter()
            .map(|p| {
                let value = p["configuration"]["value"].as_str().unwrap();
                let root = p["root_id"].as_str().unwrap().to_string();
                (root, parse(Some(value.as_bytes())).unwrap())
            })
            .collect();
        assert_eq!(
            roles,
            [
                (
                    "ai_router_ctrl".to_string(),
                    Role::Ctrl {
                        grpc_cluster: clusters::CONTROL_PLANE.into(),
                        node: DEFAULT_NODE.into(),
                        tick_ms: DEFAULT_TICK_MS,
                    }
                ),
                (
                    "ai_router_front".to_string(),
                    Role::Front { one_pass: None }
                ),
                ("ai_router_attempt".to_string(), Role::Attempt),
            ]
        );
    }

    #[test]
    fn one_pass_renders_the_aggregate_its_retry_priorities_and_the_hosts_resolved_at_start() {
        use ai_router_filter_core::vm::plugin::{parse, Role};
        let mut o = options();
        o.one_pass = Some(vec![("127.0.0.1".into(), 9000), ("::1".into(), 80)]);
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&render_envoy(&o)).unwrap();
        let mut plugins = Vec::new();
        wasm_plugins(&doc, &mut plugins);
        let roles: Vec<Role> = plugins
            .iter()
            .map(|p| parse(p["configuration"]["value"].as_str().map(str::as_bytes)).unwrap())
            .collect();
        let front = Role::Front {
            one_pass: Some(OnePass {
                hosts: vec!["127.0.0.1:9000".into(), "[::1]:80".into()],
                retries: 3,
            }),
        };
        assert!(roles.contains(&front), "{roles:?}");
        assert!(roles.contains(&Role::First), "{roles:?}");
        // The public route: the front names the cluster; each retry to the next priority.
        let route = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][1]["route"];
        assert_eq!(route["cluster_header"].as_str(), Some(headers::PASS));
        assert_eq!(
            route["retry_policy"]["retry_priority"]["name"].as_str(),
            Some("envoy.retry_priorities.previous_priorities")
        );
        // The aggregate: the provider first, then one attempts cluster per retry.
        let clusters_list = doc["static_resources"]["clusters"].as_sequence().unwrap();
        let named = |name: &str| {
            clusters_list
                .iter()
                .find(|c| c["name"].as_str() == Some(name))
                .cloned()
        };
        let aggregate = named(clusters::ONE_PASS).unwrap();
        let children: Vec<&str> = aggregate["cluster_type"]["typed_config"]["clusters"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|c| c.as_str())
            .collect();
        assert_eq!(
            children,
            [
                clusters::PROVIDERS_PLAIN,
                clusters::ATTEMPTS,
                "ai_router_attempts_2",
                "ai_router_attempts_3"
            ]
        );
        for child in &children {
            assert!(named(child).is_some(), "{child} is defined");
        }
        // The hosts resolved at start, and the dynamic forward proxy never resolving under
        // the aggregate.
        let yaml = render_envoy(&o);
        assert!(
            yaml.contains("- { address: \"127.0.0.1\", port_value: 9000 }"),
            "{yaml}"
        );
        assert!(yaml.contains("dfp_cluster_resolves_hosts: false"));
        // Without it, none of this.
        let plain = render_envoy(&options());
        assert!(!plain.contains(clusters::ONE_PASS) && !plain.contains("preresolve"));
    }

    #[test]
    fn the_rendered_vm_and_timer_are_the_ones_the_filter_names() {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&render_envoy(&options())).unwrap();
        let mut plugins = Vec::new();
        wasm_plugins(&doc, &mut plugins);
        assert_eq!(plugins.len(), 3);
        for plugin in &plugins {
            assert_eq!(
                plugin["vm_config"]["vm_id"],
                ai_router_contract::shared::VM_ID
            );
        }
        let resources = &doc["static_resources"];
        let timer = resources["clusters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"] == clusters::TIMER)
            .unwrap();
        let listener = &timer["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["envoy_internal_address"]["server_listener_name"];
        assert!(resources["listeners"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|l| l["name"] == *listener && l.get("internal_listener").is_some()));
    }

    #[test]
    fn renders_valid_yaml_with_the_pieces() {
        let yaml = render_envoy(&options());
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        let listeners = &doc["static_resources"]["listeners"];
        assert_eq!(listeners[0]["name"], "ai_router_public");
        assert_eq!(
            listeners[0]["address"]["socket_address"]["port_value"],
            8080
        );
        assert_eq!(listeners[1]["name"], "ai_router_attempt");
        let routes = &listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
            ["route_config"]["virtual_hosts"][0]["routes"];
        // The admin API first, to the control plane, never retried.
        assert_eq!(routes[0]["match"]["prefix"], "/admin/");
        assert_eq!(routes[0]["route"]["cluster"], clusters::CONTROL_PLANE);
        assert!(routes[0]["route"].get("retry_policy").is_none());
        let route = &routes[1]["route"];
        assert_eq!(routes[1]["match"]["prefix"], "/");
        assert_eq!(route["retry_policy"]["num_retries"], 3);
        // Attempts are bounded by the attempt stage (timeoutMs from the moment an attempt
        // reaches its provider), calls by their deadline: no Envoy timer may cut an attempt
        // that waits for a lane.
        assert!(route["retry_policy"].get("per_try_timeout").is_none());
        let attempt_hcm = &listeners[1]["filter_chains"][0]["filters"][0]["typed_config"];
        let attempt_route = &attempt_hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(attempt_route["timeout"], "0s");
        assert!(attempt_route.get("idle_timeout").is_none());
        assert_eq!(attempt_hcm["stream_idle_timeout"], "0s");
        assert!(yaml.contains("allow_on_headers_stop_iteration: true"));
        assert!(yaml.contains(r#"value: "{\"role\":\"attempt\"}""#));
        assert!(yaml.contains("host_env_keys: [AI_ROUTER_SYNC_TOKEN]"));
        let hcm = &listeners[0]["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(hcm["request_headers_timeout"], "10.000s");
        assert_eq!(hcm["request_timeout"], "60.000s");
        // A stream cut after its first token ends for the client within 100 ms of the cut
        // (Envoy's default of 1 s made it end 1 s late).
        assert_eq!(hcm["delayed_close_timeout"], "0.1s");
        assert_eq!(attempt_hcm["delayed_close_timeout"], "0s");
        assert_eq!(
            hcm["common_http_protocol_options"]["idle_timeout"],
            "300.000s"
        );
        assert_eq!(
            hcm["http2_protocol_options"]["max_concurrent_streams"],
            MAX_CONCURRENT_STREAMS
        );
        // A refused WebSocket upgrade first (426: "use HTTPS"), then every status in the
        // table, then a catch-all; each only for Envoy's own answers.
        let mappers = hcm["local_reply_config"]["mappers"].as_sequence().unwrap();
        assert_eq!(mappers.len(), LOCAL_REPLIES.len() + 2);
        let upgrade = &mappers[0];
        assert_eq!(
            upgrade["filter"]["extension_filter"]["typed_config"]["expression"],
            "response.code_details == 'upgrade_failed'"
        );
        assert_eq!(upgrade["status_code"], 426);
        for (mapper, (status, code, _)) in mappers[1..].iter().zip(LOCAL_REPLIES) {
            let filters = &mapper["filter"]["and_filter"]["filters"];
            assert_eq!(
                filters[0]["status_code_filter"]["comparison"]["value"]["default_value"],
                u64::from(*status)
            );
            assert_eq!(
                filters[1]["extension_filter"]["typed_config"]["expression"],
                "response.code_details != ''"
            );
            let error = &mapper["body_format_override"]["json_format"]["error"];
            assert_eq!(error["code"], *code);
            assert!(error["param"].is_null());
        }
        let clusters = doc["static_resources"]["clusters"].as_sequence().unwrap();
        for name in [
            "ai_router_timer",
            "ai_router_attempts",
            "providers_tls",
            "providers_plain",
        ] {
            let cluster = clusters.iter().find(|c| c["name"] == name).unwrap();
            let thresholds = &cluster["circuit_breakers"]["thresholds"][0];
            for field in [
                "max_connections",
                "max_pending_requests",
                "max_requests",
                "max_retries",
            ] {
                assert_eq!(thresholds[field], 10_000, "{name}.{field}");
            }
        }
        // Large bodies must fit the replay buffer.
        assert_eq!(
            listeners[0]["per_connection_buffer_limit_bytes"],
            buffer_limit(4 * 1024 * 1024)
        );
    }
}
