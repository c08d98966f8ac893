//! `promptCache` on anthropic providers: a `cache_control` marker on the last system block and
//! on the last tool of the Messages request, so the static head of a prompt bills at the
//! provider's cache-read rate on repeats. It steps aside when the request already carries a
//! `cache_control` anywhere (the client placed its own). Other providers cache prefixes by
//! themselves and get nothing.

use serde_json::{json, Map, Value};

/// The marker for a pushed `prompt_cache` ("5m", "1h"); `None` when off or unset.
pub fn marker(setting: &str) -> Option<Value> {
    match setting {
        "5m" => Some(json!({ "type": "ephemeral" })),
        "1h" => Some(json!({ "type": "ephemeral", "ttl": "1h" })),
        _ => None,
    }
}

fn has_cache_control(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.contains_key("cache_control") || o.values().any(has_cache_control),
        Value::Array(a) => a.iter().any(has_cache_control),
        _ => false,
    }
}

fn mark_last(list: &mut [Value], marker: &Value) -> bool {
    match list.last_mut() {
        Some(Value::Object(o)) => {
            o.insert("cache_control".into(), marker.clone());
            true
        }
        _ => false,
    }
}

/// Marks `request`, the Messages body translated from the client's `client` body, for
/// `setting`; returns how many markers it placed. Nothing when the client placed a
/// `cache_control` anywhere in its own body (system, a message's blocks, a tool): the
/// translation may not carry every one of them, and Anthropic refuses more than four
/// breakpoints, so the client's choice stands alone.
pub fn mark_translated(client: &Value, request: &mut Value, setting: &str) -> usize {
    if has_cache_control(client) {
        return 0;
    }
    mark(request, setting)
}

/// Marks `request` (an Anthropic Messages body) for `setting`; returns how many markers it
/// placed.
pub fn mark(request: &mut Value, setting: &str) -> usize {
    let Some(marker) = marker(setting) else {
        return 0;
    };
    let Value::Object(body) = request else {
        return 0;
    };
    if body.values().any(has_cache_control) {
        return 0;
    }
    let mut placed = 0;
    match body.get_mut("system") {
        Some(Value::String(text)) if !text.is_empty() => {
            let mut block = Map::new();
            block.insert("type".into(), json!("text"));
            block.insert("text".into(), json!(std::mem::take(text)));
            block.insert("cache_control".into(), marker.clone());
            body.insert("system".into(), Value::Array(vec![Value::Object(block)]));
            placed += 1;
        }
        Some(Value::Array(blocks)) => placed += usize::from(mark_last(blocks, &marker)),
        _ => {}
    }
    if let Some(Value::Array(tools)) = body.get_mut("tools") {
        placed += usize::from(mark_last(tools, &marker));
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_system_block_and_the_last_tool_are_marked() {
        let mut req = json!({
            "system": "You are terse.",
            "messages": [{ "role": "user", "content": "hi" }],
            "tools": [{ "name": "a" }, { "name": "b" }],
        });
        assert_eq!(mark(&mut req, "5m"), 2);
        assert_eq!(
            req["system"],
            json!([{ "type": "text", "text": "You are terse.", "cache_control": { "type": "ephemeral" } }])
        );
        assert!(req["tools"][0].get("cache_control").is_none());
        assert_eq!(
            req["tools"][1]["cache_control"],
            json!({ "type": "ephemeral" })
        );
        // Already marked: a second pass steps aside.
        assert_eq!(mark(&mut req, "5m"), 0);

        let mut blocks = json!({
            "system": [{ "type": "text", "text": "a" }, { "type": "text", "text": "b" }],
            "messages": [],
        });
        assert_eq!(mark(&mut blocks, "1h"), 1);
        assert_eq!(
            blocks["system"][1]["cache_control"],
            json!({ "type": "ephemeral", "ttl": "1h" })
        );
        assert!(blocks["system"][0].get("cache_control").is_none());
    }

    #[test]
    fn it_steps_aside_for_the_clients_marker_and_when_off() {
        let client = json!({
            "system": "s",
            "messages": [{ "role": "user", "content": [
                { "type": "text", "text": "hi", "cache_control": { "type": "ephemeral" } }
            ] }],
        });
        let mut req = client.clone();
        assert_eq!(mark(&mut req, "1h"), 0);
        assert_eq!(req, client);
        let mut plain = json!({ "system": "s", "messages": [] });
        for off in ["off", "", "2h"] {
            assert_eq!(mark(&mut plain, off), 0);
        }
        // A marker the translation does not carry (a tool's, a system part's) still counts as
        // the client's own.
        for client in [
            json!({ "messages": [{ "role": "system", "content": [
                { "type": "text", "text": "s", "cache_control": { "type": "ephemeral" } }
            ] }] }),
            json!({ "messages": [], "tools": [{ "type": "function",
                "function": { "name": "a" }, "cache_control": { "type": "ephemeral" } }] }),
        ] {
            let mut translated =
                json!({ "system": "s", "messages": [], "tools": [{ "name": "a" }] });
            let before = translated.clone();
            assert_eq!(mark_translated(&client, &mut translated, "5m"), 0);
            assert_eq!(translated, before);
        }
        let mut translated = json!({ "system": "s", "messages": [] });
        assert_eq!(
            mark_translated(&json!({ "messages": [] }), &mut translated, "5m"),
            1
        );
        // No system and no tools: nothing to mark.
        let mut bare = json!({ "messages": [{ "role": "user", "content": "hi" }] });
        assert_eq!(mark(&mut bare, "5m"), 0);
    }
}
