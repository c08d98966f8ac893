use super::*;
use crate::attempt::testkit::*;

#[test]
fn a_keyless_provider_gets_no_credentials_and_an_empty_secret_elsewhere_is_missing() {
    let plan = plan(false);
    let keyless = |terms: bool| {
        let mut snap = snapshot();
        snap.providers[0].keys[0].secret.clear();
        if terms {
            snap.providers[0].terms = Some(ai_router_proto::v1::ProviderTerms {
                keyless: true,
                ..Default::default()
            });
        }
        snap
    };
    let mut host = host_with(keyless(true), &plan, 1);
    host.add(Side::Request, "authorization", b"Bearer vk-client");
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p1.test:8000")
    );
    assert_eq!(host.text(Side::Request, "authorization"), None);
    assert_eq!(host.text(Side::Request, "x-api-key"), None);
    // Without the keyless terms an empty secret is a key that is missing: the next lane.
    let mut host = host_with(keyless(false), &plan, 1);
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p2.test:8000")
    );
}

#[test]
fn an_attempt_reads_the_lanes_once_and_reserves_from_what_the_pick_read() {
    let plan = plan(false);
    let mut host = host_with(scoped_snapshot(), &plan, 1);
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(host.lane_views, 1);
    // The reservation was checked against the headroom the pick saw.
    assert_eq!(
        host.lanes.sent_since("p1", "org", "m1", NOW - 1_000),
        (1, 10)
    );
}

#[test]
fn sends_reserve_the_scope_s_headroom_across_its_keys_and_a_network_failure_gives_it_back() {
    let plan = plan(false);
    let mut sends = crate::testing::FakeLanes::default().sends;
    let mut sent_to = Vec::new();
    for _ in 0..3 {
        let mut host = host_with(scoped_snapshot(), &plan, 1);
        host.lanes.sends = sends;
        let mut stage = Attempt::default();
        assert_eq!(send(&mut stage, &mut host), Flow::Continue);
        sent_to.push(host.text(Side::Request, ":authority").unwrap_or_default());
        sends = std::mem::take(&mut host.lanes.sends);
    }
    // Two calls spend the scope's two requests, whichever key; the third goes elsewhere.
    assert_eq!(
        sent_to,
        ["p1.test:8000", "p1.test:8000", "p2.test:8000"],
        "{sends:?}"
    );
    assert_eq!(
        sends
            .get(&("p1".to_owned(), "org".to_owned()))
            .map(|s| s.since("org", "m1", NOW - 1_000)),
        Some((2, 20))
    );
    // Each scope has its own record: the third call's reservation is in p2's.
    assert!(
        sends.keys().all(|(p, _)| p == "p1" || p == "p2") && sends.len() == 2,
        "{sends:?}"
    );

    // An attempt that never reached the provider gives its reservation back.
    let mut host = host_with(snapshot(), &plan, 1);
    host.lanes.sends = sends;
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW), (1, 10));
    host.add(Side::Response, ":status", b"503");
    let _ = stage.on_response_headers(&mut host, false);
    host.response_body = b"upstream connect error or disconnect/reset before headers".to_vec();
    let size = host.response_body.len();
    let _ = stage.on_response_body(&mut host, size, true);
    assert_eq!(
        host.attempts.first().map(|a| a.error_class().text()),
        Some("network")
    );
    assert_eq!(host.lanes.sent_since("p1", "a", "m1", NOW), (0, 0));
}

#[test]
fn a_request_the_provider_cannot_be_sent_is_refused_and_gives_its_reservation_back() {
    let plan = plan(false);
    let mut snap = scoped_snapshot();
    snap.providers[0] = provider("p1", ProviderKind::Anthropic, &["a", "b"], "m1");
    for k in &mut snap.providers[0].keys {
        k.scope = "org".into();
    }
    let mut host = host_with(snap, &plan, 1);
    // Anthropic answers one choice per request: `n: 2` cannot be sent there.
    host.request_body =
        br#"{"model":"chat","n":2,"messages":[{"role":"user","content":"hi"}]}"#.to_vec();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Pause);
    assert_eq!(host.answered.as_ref().map(|a| a.status), Some(400));
    assert_eq!(
        host.lanes.sent_since("p1", "org", "m1", NOW - 1_000),
        (0, 0),
        "nothing was sent, so nothing stays reserved"
    );
}

#[test]
fn a_messages_block_an_openai_lane_cannot_take_is_the_callers_400() {
    let body = serde_json::json!({ "model": "claude", "max_tokens": 8, "messages": [{ "role": "user",
        "content": [{ "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0=" } }] }] });
    let mut snap = snapshot();
    snap.providers.truncate(1);
    let mut plan = plan(false);
    plan.protocol = Protocol::Messages;
    plan.tiers.truncate(1);
    let mut host = host_with(snap, &plan, 1);
    host.request_body = body.to_string().into_bytes();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Pause);
    let a = host.answered.clone().expect("answered");
    assert_eq!(a.status, 400);
    assert!(a.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("'document'"));
}

/// One attempt's send and answer on a pool whose first provider has `keys` keys, after
/// `before` earlier calls (so the records hold what a busy worker's do): the host calls and
/// the picker's reads of the last one.
fn one_attempt_costs(
    keys: usize,
    before: usize,
) -> (std::collections::BTreeMap<&'static str, u64>, u64) {
    let names: Vec<String> = (0..keys).map(|k| format!("k{k}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut snap = snapshot();
    snap.providers[0] = provider("p1", ProviderKind::OpenaiCompatible, &names, "m1");
    let plan = plan(false);
    let mut host = host_with(snap, &plan, 1);
    let json = [("content-type", "application/json")];
    let body = host.request_body.clone();
    let request = host.request_headers.clone();
    for _ in 0..=before {
        host.reset_tallies();
        host.request_headers = request.clone();
        host.request_body = body.clone();
        host.response_headers.clear();
        host.calls.clear();
        host.hand_plan(&plan);
        host.now += 10;
        let mut stage = Attempt::default();
        send(&mut stage, &mut host);
        answer(&mut stage, &mut host, 200, &json, OK_BODY);
        stage.on_log(&mut host);
    }
    (host.host_calls(), host.lanes.reads.get())
}

#[test]
fn an_attempt_costs_the_same_host_calls_and_reads_whatever_the_pool_s_size() {
    // Pick, reserve and report touch only the lanes they look at: 1,000 keys cost what 10 do.
    let (calls_small, reads_small) = one_attempt_costs(10, 20);
    let (calls_large, reads_large) = one_attempt_costs(1_000, 20);
    assert_eq!(calls_small, calls_large);
    assert_eq!(reads_small, reads_large);
    assert!(reads_small > 0, "the pick read the lanes it looked at");
}

#[test]
fn a_body_that_names_its_lane_s_model_stays_in_envoy_s_buffer() {
    let body = br#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
    let mut plan = plan(false);
    plan.body_top = Some(crate::plan::BodyTop {
        model: Some("m1".into()),
        stream_options: false,
    });
    let mut host = host_with(snapshot(), &plan, 1);
    host.request_body = body.to_vec();
    host.reset_tallies();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(
        host.text(Side::Request, ":authority").as_deref(),
        Some("p1.test:8000")
    );
    assert_eq!(host.request_body, body.to_vec());
    assert_eq!(host.host_calls().get("set_body"), None, "not written again");

    // Another model's lane gets the body written over.
    let mut snap = snapshot();
    snap.providers[0].models[0].id = "m1-other".into();
    plan.tiers[0][0].model = "m1-other".into();
    let mut host = host_with(snap, &plan, 1);
    host.request_body = body.to_vec();
    host.reset_tallies();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(host.host_calls().get("set_body"), Some(&1));
    let sent: serde_json::Value = serde_json::from_slice(&host.request_body).unwrap();
    assert_eq!(sent["model"], "m1-other");
}

#[test]
fn an_attempt_takes_the_body_the_front_read_instead_of_copying_it_again() {
    let plan = plan(false);
    let mut host = host_with(snapshot(), &plan, 1);
    let body = host.request_body.clone();
    host.calls.get_mut(&plan.cid).unwrap().body = Some(Rc::new(body.clone()));
    host.reset_tallies();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(
        host.host_calls().get("body"),
        None,
        "the body was not read from Envoy"
    );
    assert!(Rc::ptr_eq(
        &stage.body,
        host.calls.get(&plan.cid).unwrap().body.as_ref().unwrap()
    ));

    // A buffer that is not what the front read (another length) is read as it is.
    let mut host = host_with(snapshot(), &plan, 1);
    host.calls.get_mut(&plan.cid).unwrap().body = Some(Rc::new(b"{}".to_vec()));
    let buffered = host.request_body.clone();
    host.reset_tallies();
    let mut stage = Attempt::default();
    assert_eq!(send(&mut stage, &mut host), Flow::Continue);
    assert_eq!(host.host_calls().get("body"), Some(&1));
    assert_eq!(*stage.body, buffered);
}
