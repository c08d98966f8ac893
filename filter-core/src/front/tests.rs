//! The front stage through whole calls on the fake host: routing, keys, body checks, quotas,
//! the plan it writes and the answer it dresses.

use super::fixture::*;
use super::*;
use crate::testing::FakeHost;
use ai_router_proto::v1::Policy;

#[test]
fn a_rule_chooses_the_profile_and_the_answer_says_which_and_what_it_cost() {
    let mut s = state().snapshot.clone();
    s.profiles.insert(
        "coding".into(),
        Policy {
            model: Some("m1".into()),
            ..Default::default()
        },
    );
    s.routes.push(ai_router_proto::v1::RouteRule {
        name: "code-tasks".into(),
        enabled: true,
        task_type: Some("code".into()),
        profile: "coding".into(),
        ..Default::default()
    });
    let auth = bearer(KEY);
    let mut host = client(
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", &auth),
            (ai_router_contract::headers::TASK_TYPE, b"code"),
        ],
    );
    host.state = Some(Rc::new(State::new(2, s)));
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    // The metadata header is read, then removed like every internal one.
    assert!(host
        .header(Side::Request, ai_router_contract::headers::TASK_TYPE)
        .is_none());
    let body = r#"{"model":"not-a-profile","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.tiers[0][0].model, "m1");

    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, H_ATTEMPT, b"1");
    host.add(Side::Response, H_LANE_MODEL, b"m1");
    host.add(Side::Response, H_LANE_COST, b"0.0042");
    front.on_response_headers(&mut host, false);
    assert_eq!(host.text(Side::Response, H_COST).as_deref(), Some("0.0042"));
    assert_eq!(
        host.text(Side::Response, H_ROUTE).as_deref(),
        Some("code-tasks")
    );
    assert!(host.header(Side::Response, H_LANE_COST).is_none());
}

#[test]
fn the_plan_carries_a_per_tenant_digest_of_the_clients_idempotency_key() {
    let plan_for = |extra: &[(&str, &[u8])]| {
        let auth = bearer(KEY);
        let mut headers: Vec<(&str, &[u8])> = vec![("authorization", &auth)];
        headers.extend_from_slice(extra);
        let mut host = client("POST", "/v1/chat/completions", &headers);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
        send_body(&mut front, &mut host, body);
        host.planned().expect("a plan")
    };
    // The client's own key, not the request id, and never as the client wrote it.
    let plan = plan_for(&[("idempotency-key", b"order-42")]);
    assert_eq!(
        Some(plan.idempotency_key),
        headers::upstream_idempotency_key("key_app", "order-42")
    );
    // Without one, the request id stands in, again digested.
    let plan = plan_for(&[]);
    assert_eq!(
        Some(plan.idempotency_key),
        headers::upstream_idempotency_key("key_app", "rid-1")
    );
}

#[test]
fn a_unary_call_writes_the_plan_then_dresses_the_answer() {
    let auth = bearer(KEY);
    let mut host = client(
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", &auth),
            ("x-ai-router-plan", b"{\"spoofed\":true}"),
            ("x-envoy-max-retries", b"99"),
            ("traceparent", TRACEPARENT.as_bytes()),
            ("tracestate", TRACESTATE.as_bytes()),
        ],
    );
    let mut front = Front::default();
    assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
    assert!(host.answered.is_none());
    // The client's key and its attempts to steer the router are gone.
    assert!(host.header(Side::Request, "authorization").is_none());
    assert!(host.header(Side::Request, "x-ai-router-plan").is_none());
    let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.vk, "key_app");
    assert_eq!(plan.rid, "rid-1");
    assert_eq!(plan.tiers[0][0].provider, "p1");
    assert_eq!(plan.tiers[0][0].model, "m1");
    assert_eq!(
        host.text(Side::Request, "x-envoy-max-retries").as_deref(),
        Some("2")
    );
    // The router bounds the call by its deadline; an attempt is the attempt stage's to
    // bound (a per-try timeout would count its waits for a lane too).
    assert_eq!(
        host.text(Side::Request, "x-envoy-upstream-rq-timeout-ms")
            .and_then(|v| v.parse::<u64>().ok()),
        Some(plan.deadline_ms)
    );
    assert!(host
        .header(Side::Request, "x-envoy-upstream-rq-per-try-timeout-ms")
        .is_none());

    // The attempt stage answered on its first attempt, from m1.
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, H_ATTEMPT, b"1");
    host.add(Side::Response, H_LANE_MODEL, b"m1");
    host.add(Side::Response, "x-envoy-upstream-service-time", b"3");
    assert_eq!(front.on_response_headers(&mut host, false), Flow::Continue);
    assert_eq!(host.text(Side::Response, H_MODEL).as_deref(), Some("m1"));
    assert_eq!(host.text(Side::Response, H_ATTEMPTS).as_deref(), Some("1"));
    assert_eq!(
        host.text(Side::Response, "x-request-id").as_deref(),
        Some("rid-1")
    );
    for internal in [H_ATTEMPT, H_LANE_MODEL, "x-envoy-upstream-service-time"] {
        assert!(
            host.header(Side::Response, internal).is_none(),
            "{internal}"
        );
    }
    front.on_log(&mut host);
    assert_eq!(host.reports.len(), 1);
    assert_eq!(host.reports[0].outcome_text(), "success");
    assert_eq!(host.reports[0].virtual_key_id, "key_app");
    // What the call's trace needs: the model asked for and the client's trace context.
    assert_eq!(host.reports[0].requested_model, "chat");
    assert_eq!(host.reports[0].traceparent, TRACEPARENT);
    assert_eq!(host.reports[0].tracestate, TRACESTATE);
    assert!(host.calls.is_empty(), "the call's bookkeeping is freed");
}

const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

#[test]
fn a_tracestate_is_reported_only_with_a_valid_traceparent_and_well_formed() {
    let auth = bearer(KEY);
    for (traceparent, tracestate, reported) in [
        (TRACEPARENT, TRACESTATE, TRACESTATE),
        ("garbage", TRACESTATE, ""),
        (TRACEPARENT, "Not A List", ""),
    ] {
        let mut host = client(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &auth),
                ("traceparent", traceparent.as_bytes()),
                ("tracestate", tracestate.as_bytes()),
            ],
        );
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
        let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, H_ATTEMPT, b"1");
        host.add(Side::Response, H_LANE_MODEL, b"m1");
        front.on_response_headers(&mut host, false);
        front.on_log(&mut host);
        assert_eq!(
            host.reports[0].tracestate, reported,
            "{traceparent} {tracestate}"
        );
    }
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn routes_methods_health_and_models() {
    let mut host = client("GET", "/v1/nothing", &[]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(answered_code(&host).0, 404);

    let mut host = client("GET", "/v1/chat/completions", &[]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(answered_code(&host).0, 405);

    // A header value that is not UTF-8 is opaque, never a failure.
    let mut host = client("GET", "/health", &[("x-foo", b"caf\xe9")]);
    Front::default().on_request_headers(&mut host, true);
    let a = host.answered.clone().expect("answered");
    assert_eq!((a.status, a.json()["status"].clone()), (200, "ok".into()));

    let auth = bearer(KEY);
    let mut host = client("GET", "/v1/models/chat", &[("authorization", &auth)]);
    Front::default().on_request_headers(&mut host, true);
    let a = host.answered.clone().expect("answered");
    assert_eq!((a.status, a.json()["id"].clone()), (200, "chat".into()));

    let mut host = client("GET", "/health", &[]);
    host.state = None;
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(host.answered.map(|a| a.status), Some(503));
}

#[test]
fn body_checks() {
    let auth = bearer(KEY);
    // Too large by its content-length: refused before the body arrives.
    let mut host = client(
        "POST",
        "/v1/chat/completions",
        &[("authorization", &auth), ("content-length", b"99999999")],
    );
    Front::default().on_request_headers(&mut host, false);
    assert_eq!(answered_code(&host), (413, "request_too_large".into()));

    for (body, code) in [
        ("{not json", "invalid_json"),
        ("[1,2]", "invalid_json"),
        (r#"{"messages":[]}"#, "missing_model"),
        (r#"{"model":"m1","messages":"hi"}"#, "invalid_request"),
        (r#"{"model":"nope","messages":[]}"#, "model_not_found"),
    ] {
        let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        assert_eq!(
            send_body(&mut front, &mut host, body),
            Flow::Pause,
            "{body}"
        );
        assert_eq!(answered_code(&host).1, code, "{body}");
        assert!(host.header(Side::Request, PLAN_HEADER).is_none());
    }

    // No body at all.
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(answered_code(&host), (400, "invalid_json".into()));
}

#[test]
fn messages_take_x_api_key_and_answer_errors_in_the_anthropic_shape() {
    let key = KEY.as_bytes().to_vec();
    // Authenticated by x-api-key; the key goes no further; the plan names the protocol.
    let mut host = client(
        "POST",
        "/v1/messages",
        &[("x-api-key", &key), ("anthropic-beta", b"tools-2024")],
    );
    let mut front = Front::default();
    assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
    assert!(host.answered.is_none());
    assert!(host.header(Side::Request, "x-api-key").is_none());
    let body = r#"{"model":"m1","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.protocol, Protocol::Messages);
    assert!(plan.stream && plan.include_usage);
    assert_eq!(plan.anthropic_version.as_deref(), Some("2023-06-01"));
    assert_eq!(plan.anthropic_beta.as_deref(), Some("tools-2024"));

    // The final error of the call, re-dressed.
    host.add(Side::Response, ":status", b"503");
    host.add(Side::Response, H_FINAL_STATUS, b"503");
    host.add(Side::Response, H_ATTEMPT, b"3");
    front.on_response_headers(&mut host, false);
    host.response_body = GatewayError::of(ErrorCode::PoolUnavailable).body();
    let size = host.response_body.len();
    assert_eq!(
        front.on_response_body(&mut host, size, true),
        Flow::Continue
    );
    let v: Value = serde_json::from_slice(&host.response_body).unwrap_or(Value::Null);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(v["error"]["code"], "pool_unavailable");

    // The stage's own refusals: a wrong key, a bad version, a body without max_tokens.
    for (headers, body, status, kind) in [
        (
            vec![("x-api-key", b"sk-nope".to_vec())],
            None,
            401,
            "authentication_error",
        ),
        (
            vec![
                ("x-api-key", key.clone()),
                ("anthropic-version", b"latest".to_vec()),
            ],
            None,
            400,
            "invalid_request_error",
        ),
        (
            vec![("authorization", bearer(KEY))],
            Some(r#"{"model":"m1","messages":[]}"#),
            400,
            "invalid_request_error",
        ),
    ] {
        let extra: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let mut host = client("POST", "/v1/messages", &extra);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        if let Some(body) = body {
            send_body(&mut front, &mut host, body);
        }
        let a = host.answered.clone().expect("answered");
        assert_eq!(
            (a.status, a.json()["error"]["type"].clone()),
            (status, kind.into())
        );
        assert_eq!(a.json()["type"], "error");
    }
}

/// Claude Code's first request, cut down: `?beta=true`, a system turn inside `messages`,
/// the fields it sends that chat completions has no counterpart for.
const CLAUDE_CODE_BODY: &str = r#"{"model":"m1","max_tokens":32000,"stream":true,
    "system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
    "messages":[{"role":"user","content":[{"type":"text","text":"Say hi"}]},
                {"role":"system","content":[{"type":"text","text":"Environment: linux"}]}],
    "tools":[{"name":"Bash","input_schema":{"type":"object"}},{"name":"Later","defer_loading":true,"input_schema":{"type":"object"}}],
    "thinking":{"type":"adaptive"},"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
    "output_config":{"effort":"high"},"metadata":{"user_id":"u"},"temperature":null}"#;

fn messages_call(state: State, path: &str, body: &str) -> (FakeHost, Flow) {
    let key = KEY.as_bytes().to_vec();
    let mut host = FakeHost::with_state(state);
    host.add(Side::Request, ":method", b"POST");
    host.add(Side::Request, ":path", path.as_bytes());
    host.add(Side::Request, "x-api-key", &key);
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let flow = send_body(&mut front, &mut host, body);
    (host, flow)
}

/// The plan the front stage wrote, and its lanes' providers in order.
fn planned_lanes(host: &FakeHost) -> (Plan, Vec<String>) {
    let plan = host.planned().expect("a plan");
    let lanes = plan
        .tiers
        .iter()
        .flatten()
        .map(|c| c.provider.clone())
        .collect();
    (plan, lanes)
}

fn with_kinds(kinds: &[ai_router_proto::v1::ProviderKind]) -> State {
    let mut snap = state().snapshot;
    let first = snap.providers[0].clone();
    snap.providers.clear();
    for (i, kind) in kinds.iter().enumerate() {
        let mut p = first.clone();
        p.id = format!("p{}", i + 1);
        p.kind = (*kind).into();
        snap.providers.push(p);
    }
    State::new(1, snap)
}

#[test]
fn claude_codes_request_goes_to_either_lane_kind() {
    use ai_router_proto::v1::ProviderKind::{Anthropic, OpenaiCompatible};
    for kind in [Anthropic, OpenaiCompatible] {
        let (host, flow) = messages_call(
            with_kinds(&[kind]),
            "/v1/messages?beta=true",
            CLAUDE_CODE_BODY,
        );
        assert_eq!(flow, Flow::Continue, "{kind:?}: {:?}", host.answered);
    }
}

#[test]
fn a_request_a_translated_lane_cannot_take_goes_to_the_native_one_or_is_refused_naming_the_field() {
    use ai_router_proto::v1::ProviderKind::{Anthropic, OpenaiCompatible};
    let body = CLAUDE_CODE_BODY.replace(
        r#""temperature":null"#,
        r#""mcp_servers":[{"type":"url","url":"https://mcp.test","name":"x"}]"#,
    );
    let (host, flow) = messages_call(
        with_kinds(&[OpenaiCompatible, Anthropic]),
        "/v1/messages",
        &body,
    );
    assert_eq!(flow, Flow::Continue, "{:?}", host.answered);
    let (_, lanes) = planned_lanes(&host);
    assert_eq!(lanes, ["p2"]);

    let (host, flow) = messages_call(with_kinds(&[OpenaiCompatible]), "/v1/messages", &body);
    assert_eq!(flow, Flow::Pause);
    let a = host.answered.clone().expect("answered");
    let v = a.json();
    assert_eq!((a.status, v["type"].clone()), (400, json!("error")), "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("mcp_servers"),
        "{v}"
    );
    assert_eq!(
        v["error"]["trail"]["skipped"][0]["reason"], "adapter",
        "{v}"
    );
}

#[test]
fn count_tokens_goes_to_an_anthropic_lane_when_the_model_has_one() {
    use ai_router_proto::v1::ProviderKind::{Anthropic, OpenaiCompatible};
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"Hello"}]}"#;
    let (host, flow) = messages_call(
        with_kinds(&[OpenaiCompatible, Anthropic]),
        "/v1/messages/count_tokens",
        body,
    );
    assert_eq!(flow, Flow::Continue, "{:?}", host.answered);
    let (plan, lanes) = planned_lanes(&host);
    assert!(plan.count_tokens);
    assert_eq!(lanes, ["p2"]);
}

#[test]
fn count_tokens_is_answered_by_the_gateway_and_unknown_messages_paths_in_anthropic_shape() {
    let (host, flow) = messages_call(
        state(),
        "/v1/messages/count_tokens?beta=true",
        r#"{"model":"m1","system":"Be brief.","messages":[{"role":"user","content":"Hello there, how are you?"}]}"#,
    );
    assert_eq!(flow, Flow::Pause);
    let a = host.answered.clone().expect("answered");
    assert_eq!(a.status, 200);
    let n = a.json()["input_tokens"].as_u64().unwrap_or(0);
    assert!(n > 5, "{:?}", a.json());

    let mut host = client("POST", "/v1/messages/batches", &[]);
    Front::default().on_request_headers(&mut host, false);
    let a = host.answered.clone().expect("answered");
    assert_eq!(
        (a.status, a.json()["error"]["type"].clone()),
        (404, json!("not_found_error"))
    );
    let mut host = client("GET", "/v1/messages/count_tokens", &[]);
    Front::default().on_request_headers(&mut host, true);
    let a = host.answered.clone().expect("answered");
    assert_eq!((a.status, a.json()["type"].clone()), (405, json!("error")));
}

#[test]
fn anthropic_clients_list_models_in_their_shape() {
    let key = KEY.as_bytes().to_vec();
    let mut host = client("GET", "/v1/models", &[("x-api-key", &key)]);
    Front::default().on_request_headers(&mut host, true);
    let a = host.answered.clone().expect("answered");
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["data"][0]["type"], "model");
    assert!(a.json()["first_id"].is_string());
    let mut host = client("GET", "/v1/models", &[("anthropic-version", b"2023-06-01")]);
    Front::default().on_request_headers(&mut host, true);
    let a = host.answered.clone().expect("answered");
    assert_eq!((a.status, a.json()["type"].clone()), (401, json!("error")));
}

#[test]
fn responses_are_routed_like_chat_and_state_is_refused_without_an_openai_lane() {
    let auth = bearer(KEY);
    let mut host = client("POST", "/v1/responses", &[("authorization", &auth)]);
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"chat","input":"hi","instructions":"brief"}"#;
    assert_eq!(send_body(&mut front, &mut host, body), Flow::Continue);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.protocol, Protocol::Responses);
    assert_eq!(plan.tiers[0][0].model, "m1");

    for body in [
        r#"{"model":"chat","input":"hi","previous_response_id":"resp_1"}"#,
        r#"{"model":"chat","input":"hi","store":true}"#,
        r#"{"model":"chat"}"#,
    ] {
        let mut host = client("POST", "/v1/responses", &[("authorization", &auth)]);
        let mut front = Front::default();
        front.on_request_headers(&mut host, false);
        assert_eq!(
            send_body(&mut front, &mut host, body),
            Flow::Pause,
            "{body}"
        );
        assert_eq!(
            answered_code(&host),
            (400, "invalid_request".into()),
            "{body}"
        );
    }
    let mut host = client("GET", "/v1/responses", &[]);
    Front::default().on_request_headers(&mut host, true);
    assert_eq!(answered_code(&host).0, 405);
}

#[test]
fn a_stateful_response_goes_to_the_openai_lanes_only() {
    let mut snap = state().snapshot.clone();
    snap.providers[0].kind = ai_router_proto::v1::ProviderKind::Openai.into();
    let state = State::new(2, snap);
    let cut = crate::protocols::stateful_tiers(
        &state,
        &[vec![
            crate::plan::Candidate {
                when: Vec::new(),
                provider: "p1".into(),
                model: "m1".into(),
                weight: 1.0,
            },
            crate::plan::Candidate {
                when: Vec::new(),
                provider: "gone".into(),
                model: "m1".into(),
                weight: 1.0,
            },
        ]],
    );
    assert_eq!(cut.map(|t| t[0].len()), Some(1));
}

/// The app's key with budgets pushed: a spent hard one, a soft one past warnAt.
fn a_budgeted_call(states: Vec<ai_router_proto::v1::BudgetState>) -> (Front, FakeHost, Flow) {
    use ai_router_proto::v1::{Budget, BudgetScope, BudgetWindow, Budgets};
    let mut snap = state().snapshot;
    let policy = |name: &str, scope: BudgetScope, hard| Budget {
        name: name.into(),
        scope: scope.into(),
        window: BudgetWindow::Day.into(),
        max_tokens: 100,
        hard,
        warn_at: 0.5,
        ..Default::default()
    };
    snap.budgets = Some(Budgets {
        policies: vec![
            policy("key-day", BudgetScope::Key, true),
            policy("pool-day", BudgetScope::Pool, false),
        ],
        states,
    });
    let auth = bearer(KEY);
    let mut host = FakeHost::with_state(State::new(1, snap));
    for (k, v) in [
        (":method", b"POST".as_slice()),
        (":path", b"/v1/chat/completions"),
        ("authorization", &auth),
    ] {
        host.add(Side::Request, k, v);
    }
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    let body = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
    let flow = send_body(&mut front, &mut host, body);
    (front, host, flow)
}

#[test]
fn budgets_refuse_or_warn_from_the_pushed_states() {
    use ai_router_proto::v1::{BudgetLevel, BudgetState};
    let until = 1_700_000_000_000 + 30_000;
    let st = |name: &str, subject: &str, level: BudgetLevel| BudgetState {
        name: name.into(),
        subject: subject.into(),
        level: level.into(),
        until_ms: until,
    };
    // The key's hard budget is spent: 429 before any plan, with Retry-After.
    let (mut front, mut host, flow) =
        a_budgeted_call(vec![st("key-day", "key_app", BudgetLevel::Over)]);
    assert_eq!(flow, Flow::Pause);
    assert_eq!(answered_code(&host), (429, "budget_exceeded".to_string()));
    let answer = host.answered.as_ref().expect("answered");
    assert_eq!(answer.header("retry-after"), Some("30"));
    assert!(host.header(Side::Request, PLAN_HEADER).is_none());
    front.on_log(&mut host);
    assert_eq!(host.reports[0].outcome_text(), "rejected:budget_exceeded");

    // Another key's spent budget is not this call's; the pool's warning is.
    let (mut front, mut host, flow) = a_budgeted_call(vec![
        st("key-day", "key_other", BudgetLevel::Over),
        st("pool-day", "", BudgetLevel::Warn),
    ]);
    assert_eq!(flow, Flow::Continue);
    let plan = host.planned().expect("a plan");
    assert_eq!(plan.profile, "", "a direct model call has no profile");
    host.add(Side::Response, ":status", b"200");
    host.add(Side::Response, H_ATTEMPT, b"1");
    front.on_response_headers(&mut host, false);
    assert_eq!(
        host.text(Side::Response, H_BUDGET_WARNING).as_deref(),
        Some("pool-day=warn")
    );
    front.on_log(&mut host);
    assert_eq!(host.reports[0].budget_warnings, ["pool-day=warn"]);
}
