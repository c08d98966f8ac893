//! The front stage's test fixture: a state with one provider and two keys, and a client
//! request on the fake host.

use super::*;
use crate::testing::FakeHost;
use ai_router_proto::v1::{Model, Policy, Provider, ProviderKey, Snapshot};

pub(super) const KEY: &str = "sk-starci-app-0123456789abcdef";

pub(super) fn state() -> State {
    let mut snap = Snapshot::default();
    snap.providers.push(Provider {
        id: "p1".into(),
        keys: vec![ProviderKey {
            alias: "a".into(),
            secret: "sk-provider-a".into(),
            ..Default::default()
        }],
        models: vec![Model {
            id: "m1".into(),
            aliases: vec!["chat".into()],
            ..Default::default()
        }],
        ..Default::default()
    });
    snap.virtual_keys.push(VirtualKey {
        id: "key_app".into(),
        sha256: sha256_hex(KEY.as_bytes()),
        profiles: vec!["*".into()],
        models: vec!["*".into()],
        allow_fallback: true,
        enabled: true,
        ..Default::default()
    });
    snap.virtual_keys.push(VirtualKey {
        id: "key_slow".into(),
        sha256: sha256_hex(b"sk-starci-slow-1"),
        models: vec!["*".into()],
        enabled: true,
        requests_per_minute: 1,
        ..Default::default()
    });
    snap.defaults = Some(Policy {
        max_attempts: Some(3),
        ..Default::default()
    });
    State::new(1, snap)
}

/// A host holding a client request with these headers.
pub(super) fn client(method: &str, path: &str, extra: &[(&str, &[u8])]) -> FakeHost {
    let mut host = FakeHost::with_state(state());
    host.add(Side::Request, ":method", method.as_bytes());
    host.add(Side::Request, ":path", path.as_bytes());
    host.add(Side::Request, "x-request-id", b"rid-1");
    for (k, v) in extra {
        host.add(Side::Request, k, v);
    }
    host
}

pub(super) fn bearer(key: &str) -> Vec<u8> {
    format!("Bearer {key}").into_bytes()
}

/// Runs the request phase with `body`; returns the flow of the body callback.
pub(super) fn send_body(front: &mut Front, host: &mut FakeHost, body: &str) -> Flow {
    host.request_body = body.as_bytes().to_vec();
    front.on_request_body(host, body.len(), true)
}

pub(super) fn answered_code(host: &FakeHost) -> (u16, String) {
    let a = host.answered.as_ref().expect("a local answer");
    let code = a.json()["error"]["code"].as_str().unwrap_or("").to_string();
    (a.status, code)
}
