//! The whole-run secret scan. Every secret the harness makes (provider keys, virtual keys, the
//! sync and admin tokens) is registered here, and everything the harness sees is observed:
//! each answer a test's client reads (headers, bodies, streamed bytes), each CLI and runner
//! output, and every process's logs when its fixture ends. A fixture that ends while a secret
//! was seen anywhere fails its test, naming the secret and where it was seen, so every e2e test
//! contributes to the scan at no cost to its author.
//!
//! What the operator side shows (the control plane's and Envoy's logs, the admin event streams a
//! test reads) is also checked for prompt text ([`observe_operator`]): the harness's default
//! prompt and every prompt a test registers. Only a test that turns `telemetry.includeContent`
//! on may see them there ([`allow_content`]); client answers are not checked for prompts (a
//! Responses answer echoes its instructions by design).
//!
//! Provider secrets carry [`SECRET_MARK`], so that a partial echo (a provider's "Incorrect API
//! key provided: sk-p1-a-zq9leak…" message) is caught as well as the whole value. The mock's
//! own control API (`/_mock/calls` shows the keys it received, by design) is not observed.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::random_hex;

/// Inside every provider secret the harness makes: letters no real key prefix has.
pub const SECRET_MARK: &str = "zq9leak";

/// The prompt of the harness's chat calls (`chat_body`).
pub const DEFAULT_PROMPT: &str = "Say hello.";

#[derive(Default)]
struct Registry {
    secrets: Vec<(String, String)>,
    prompts: Vec<String>,
    /// `telemetry.includeContent` is on in this test: prompts may be in events and logs.
    content_allowed: bool,
    leaks: Vec<String>,
    observed_bytes: u64,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    secrets: Vec::new(),
    prompts: Vec::new(),
    content_allowed: false,
    leaks: Vec::new(),
    observed_bytes: 0,
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fresh provider secret `sk-<name>-zq9leak<hex>`, registered for the scan.
pub fn provider_secret(name: &str) -> String {
    let secret = format!("sk-{name}-{SECRET_MARK}{}", random_hex(24));
    register(name, &secret);
    secret
}

/// Registers a secret the harness made elsewhere (a virtual key, a token).
pub fn register(name: &str, secret: &str) {
    let mut registry = registry();
    if !registry.secrets.iter().any(|(_, s)| s == secret) {
        registry
            .secrets
            .push((name.to_string(), secret.to_string()));
    }
}

/// Checks bytes the harness saw (`source` says where) for every registered secret and for the
/// mark of a provider secret.
pub fn observe(source: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut registry = registry();
    registry.observed_bytes += bytes.len() as u64;
    let mut found: Vec<String> = registry
        .secrets
        .iter()
        .filter(|(_, secret)| text.contains(secret.as_str()))
        .map(|(name, _)| format!("{name} in {source}"))
        .collect();
    if found.is_empty() && text.contains(SECRET_MARK) {
        found.push(format!(
            "part of a provider secret ({SECRET_MARK}) in {source}"
        ));
    }
    for leak in found {
        if !registry.leaks.contains(&leak) {
            registry.leaks.push(leak);
        }
    }
}

/// Registers prompt text a test sends, for [`observe_operator`].
pub fn register_prompt(text: &str) {
    let mut registry = registry();
    if !registry.prompts.iter().any(|p| p == text) {
        registry.prompts.push(text.to_string());
    }
}

/// This test turns `telemetry.includeContent` on: prompts may show on the operator side.
pub fn allow_content() {
    registry().content_allowed = true;
}

/// [`observe`], and a check for prompt text: for what the operator side shows (logs, events),
/// which holds no prompt unless `telemetry.includeContent` is on.
pub fn observe_operator(source: &str, bytes: &[u8]) {
    observe(source, bytes);
    let text = String::from_utf8_lossy(bytes);
    let mut registry = registry();
    if registry.content_allowed {
        return;
    }
    let found: Vec<String> = std::iter::once(DEFAULT_PROMPT)
        .chain(registry.prompts.iter().map(String::as_str))
        .filter(|p| text.contains(p))
        .map(|p| format!("the prompt {p:?} in {source}"))
        .collect();
    for leak in found {
        if !registry.leaks.contains(&leak) {
            registry.leaks.push(leak);
        }
    }
}

/// Every leak seen so far.
pub fn leaks() -> Vec<String> {
    registry().leaks.clone()
}

/// How much the scan has read so far (for the record of a test).
pub fn observed_bytes() -> u64 {
    registry().observed_bytes
}

/// Fails (panics) when anything observed held a secret; meant for a fixture's drop.
// Failing the test is the point: a fixture's drop has no other way to.
#[allow(clippy::panic)]
pub fn assert_no_leaks(context: &str) {
    let leaks = leaks();
    if !leaks.is_empty() && !std::thread::panicking() {
        panic!(
            "the secret scan found {} leak(s) ({context}):\n{}",
            leaks.len(),
            leaks.join("\n")
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_scan_finds_whole_and_partial_secrets_and_nothing_else() {
        let secret = provider_secret("scan-test");
        register("TOKEN", "admin-0123456789abcdef");
        observe("a clean answer", b"{\"ok\":true,\"key\":\"scan-test\"}");
        assert!(leaks().is_empty(), "{:?}", leaks());
        observe("an error body", format!("bad key {secret}").as_bytes());
        let partial = &secret[..secret.len() - 10];
        observe(
            "a masked echo",
            format!("Incorrect API key provided: {partial}***").as_bytes(),
        );
        observe("a log", b"token=admin-0123456789abcdef");
        let found = leaks();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("scan-test in an error body"));
        assert!(found[1].contains("a masked echo"));
        assert!(found[2].contains("TOKEN in a log"));
        assert!(observed_bytes() > 0);
    }

    #[test]
    fn the_operator_side_is_checked_for_prompts_unless_content_is_on() {
        let prompt_leaks = || -> Vec<String> {
            leaks()
                .into_iter()
                .filter(|l| l.starts_with("the prompt"))
                .collect()
        };
        register_prompt("Tell me about zebras.");
        observe("a client answer", b"Say hello. Tell me about zebras.");
        assert!(prompt_leaks().is_empty(), "answers may hold prompts");
        observe_operator("an event", b"{\"type\":\"attempt\"}");
        assert!(prompt_leaks().is_empty(), "{:?}", prompt_leaks());
        observe_operator("a log", b"prompt: Tell me about zebras.");
        observe_operator("an event", b"Say hello.");
        let found = prompt_leaks();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found
            .iter()
            .any(|l| l.contains("zebras") && l.contains("a log")));
        assert!(found
            .iter()
            .any(|l| l.contains("Say hello.") && l.contains("an event")));
    }
}
