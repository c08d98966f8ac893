//! The operator's events over gRPC (`airouter.v1.Admin/Events`) through a real Envoy: a
//! subscriber sees a refused key's attempt, its key-disabled event, the failover's attempt and
//! the call, in order, keys by alias only; `types` filters; a caller without the admin token is
//! refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{script, Gateway};
use ai_router_proto::v1 as pb;
use ai_router_proto::v1::admin_client::AdminClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

async fn events(
    gw: &Gateway,
    token: Option<&str>,
    types: &[&str],
) -> Result<tonic::Streaming<pb::AdminEvent>, tonic::Status> {
    let mut client = AdminClient::<Channel>::connect(format!("http://{}", gw.cp.grpc_addr()))
        .await
        .unwrap();
    let mut request = tonic::Request::new(pb::EventsRequest {
        types: types.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    });
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    client
        .events(request)
        .await
        .map(tonic::Response::into_inner)
}

/// The next `n` events of the stream, as (type, JSON); panics after 10 s.
async fn next_events(
    stream: &mut tonic::Streaming<pb::AdminEvent>,
    n: usize,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while out.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} events within 10 s: {out:?}", out.len()))
            .unwrap()
            .expect("the stream ended");
        ai_router_e2e::scan::observe_operator("the gRPC event stream", event.json.as_bytes());
        // The type as a proto enum too, naming the same type.
        assert_eq!(event.event_type().text(), event.r#type, "{event:?}");
        out.push((event.r#type, serde_json::from_str(&event.json).unwrap()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_subscriber_sees_a_failover_in_order_and_types_filter() {
    let gw = Gateway::start("events_grpc").await.expect("fixture");
    // Key a is refused (401), key b answers: one call, a failover inside p1.
    gw.mock1
        .script(json!([
            script::for_key(
                &gw.key_a,
                vec![script::status(
                    401,
                    json!({}),
                    Some(json!({ "error": { "message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key" } }))
                )]
            ),
            script::always(vec![script::text("from b")])
        ]))
        .await
        .unwrap();

    let denied = events(&gw, None, &[]).await;
    assert!(
        matches!(
            denied.as_ref().map_err(tonic::Status::code),
            Err(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied)
        ),
        "no admin token: {:?}",
        denied.map(|_| ())
    );
    let mut all = events(&gw, Some(&gw.admin_token), &[]).await.unwrap();
    let mut calls_only = events(&gw, Some(&gw.admin_token), &["request"])
        .await
        .unwrap();

    // Round robin may start on b: call until a call's first attempt went to a. A call's
    // attempt and request events come with the reports, in either order; its attempts in order.
    let mut seen: Vec<(String, Value)> = Vec::new();
    let mut failover = None;
    for _ in 0..10 {
        let r = gw.chat("m1").await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        let id = r.header("x-request-id").expect("x-request-id");
        let of_call = |seen: &[(String, Value)], t: &str| -> Vec<Value> {
            seen.iter()
                .filter(|(tt, e)| tt == t && e["requestId"] == id.as_str())
                .map(|(_, e)| e.clone())
                .collect()
        };
        while of_call(&seen, "request").is_empty()
            || of_call(&seen, "attempt").len() as u64
                != of_call(&seen, "request")[0]["attempts"]
                    .as_u64()
                    .unwrap_or(0)
        {
            seen.extend(next_events(&mut all, 1).await);
        }
        let call = of_call(&seen, "request").remove(0);
        assert_eq!(call["outcome"], "success", "{call}");
        let attempts = of_call(&seen, "attempt");
        if attempts[0]["key"] == "a" {
            failover = Some(attempts);
            break;
        }
    }
    let attempts = failover.unwrap_or_else(|| panic!("key a never tried: {seen:?}"));
    let keys: Vec<&str> = attempts
        .iter()
        .map(|a| a["key"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(keys, ["a", "b"], "a refused, then b: {attempts:?}");
    assert_eq!(attempts[0]["provider"], "p1");
    assert_eq!(attempts[0]["errorClass"], "auth", "{attempts:?}");
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[1]["outcome"], "success");
    while !seen
        .iter()
        .any(|(t, e)| t == "key-disabled" && e["key"] == "a")
    {
        seen.extend(next_events(&mut all, 1).await);
    }
    let disabled = seen.iter().find(|(t, _)| t == "key-disabled").unwrap();
    assert_eq!(disabled.1["reason"], "auth", "{disabled:?}");
    assert_eq!(disabled.1["provider"], "p1", "{disabled:?}");

    // The filtered stream carries only calls.
    let filtered = next_events(&mut calls_only, 1).await;
    assert!(filtered.iter().all(|(t, _)| t == "request"), "{filtered:?}");

    // Aliases only: no provider or virtual-key secret, no prompt text in what was streamed.
    let streamed = format!("{seen:?}{filtered:?}");
    for (name, secret) in gw.secrets() {
        assert!(!streamed.contains(secret), "{name} in the event stream");
    }
    assert!(!streamed.contains("Say hello"), "prompt text in the events");
    gw.check_no_secrets_in_logs().unwrap();
}
