//! The request a lane's provider gets, as a value: the body in the provider's protocol, its
//! path, authority and cluster, the headers set and removed. [`build`] decides it from the
//! plan, the lane and the caller's request alone (no host); [`ProviderRequest::apply`] writes
//! it over the caller's request in a few host calls.

use ai_router_proto::v1::{Provider, ProviderKey, ProviderKind};
use serde_json::Value;

use crate::host::{Host, Side};
use crate::lanes::embeddings;
use crate::plan::{Operation, Plan, Protocol};
use crate::protocols::anthropic::{self, error::AdapterError, ANTHROPIC_VERSION};
use crate::protocols::messages::request::Fidelity;
use crate::protocols::{self};
use crate::wire::headers;

use super::CLUSTER_HEADER;

/// The body a provider request carries.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Body {
    /// The caller's bytes as they came: Envoy's buffer is left as it is (not read back, not
    /// written again).
    AsItCame,
    /// These bytes, written over the caller's.
    Written(Vec<u8>),
}

/// What the attempt sends its lane's provider in place of the caller's request.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ProviderRequest {
    /// The body in the provider's protocol, its model the lane's.
    pub body: Body,
    pub path: String,
    pub authority: String,
    /// The provider cluster the attempt route picks by [`CLUSTER_HEADER`].
    pub cluster: &'static str,
    /// Headers removed from the caller's request, each once (before those set are written).
    pub remove: Vec<String>,
    /// Headers set, in order (lower-case names), besides the path, authority and cluster.
    pub set: Vec<(String, String)>,
    /// The lane speaks the caller's protocol: its answer goes back as it comes.
    pub native: bool,
    /// Responses: the caller's body, which the translated answer echoes.
    pub echo: Option<Value>,
    /// Embeddings: the vector length the caller asked for.
    pub dimensions: Option<usize>,
}

/// The request for the lane `model` of `provider` with `key`, from the caller's `body` and
/// the names of its request headers; the caller's error when its request cannot be expressed
/// in the provider's protocol.
pub(super) fn build(
    plan: &Plan,
    provider: &Provider,
    key: &ProviderKey,
    model: &str,
    body: &[u8],
    caller_headers: &[(String, impl AsRef<[u8]>)],
) -> Result<ProviderRequest, AdapterError> {
    let gemini = plan.protocol == Protocol::Gemini;
    let native = match gemini {
        true => crate::protocols::gemini::native::serves(provider.kind(), plan.json_array),
        false => protocols::native(plan.protocol, provider.kind()),
    };
    let anthropic = provider.kind() == ProviderKind::Anthropic;
    // A chat body to a chat lane, or a Messages body to an anthropic lane, that names the
    // lane's model goes as it came (no parse into a value, no serialisation).
    let copied = passed_through(plan, provider, model, native, body);
    let (value, echo) = match copied {
        Some(_) => (Value::Null, None),
        None => body_for(plan, provider, model, native, body)?,
    };
    let dimensions = embeddings::requested_dimensions(&value)
        .filter(|_| plan.op == Operation::Embeddings)
        .map(|d| d as usize);
    let api_path = if native && plan.count_tokens {
        "/messages/count_tokens"
    } else if native {
        protocols::native_path(plan.protocol)
    } else if anthropic && plan.op == Operation::Chat {
        "/messages"
    } else {
        plan.op.path()
    };
    let path = match gemini && native {
        true => crate::protocols::gemini::native::path(
            &provider.base_path,
            model,
            crate::protocols::gemini::native::method(
                plan.op == Operation::Embeddings,
                plan.count_tokens,
                plan.stream,
                &value,
            ),
        ),
        false => format!("{}{}", provider.base_path, api_path),
    };
    let cluster = if provider.scheme == "https" {
        ai_router_contract::clusters::PROVIDERS_TLS
    } else {
        ai_router_contract::clusters::PROVIDERS_PLAIN
    };
    // Only the allowlisted client headers go on; the provider's own are added.
    let mut remove: Vec<String> = caller_headers
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !headers::forwarded_to_provider(name) && *name != CLUSTER_HEADER)
        .cloned()
        .collect();
    remove.push("content-length".into());
    let mut set = Vec::new();
    for h in &provider.headers {
        let lower = h.name.to_ascii_lowercase();
        if lower != "authorization" && lower != "x-api-key" && lower != provider.auth_header {
            set.push((lower, h.value.clone()));
        }
    }
    credentials(provider, key, gemini && native, &mut set, &mut remove);
    if anthropic && native {
        // The caller's own version and betas: its body is sent as it wrote it.
        let version = plan
            .anthropic_version
            .as_deref()
            .unwrap_or(ANTHROPIC_VERSION);
        set.push(("anthropic-version".into(), version.to_owned()));
        if let Some(beta) = plan.anthropic_beta.as_deref() {
            set.push(("anthropic-beta".into(), beta.to_owned()));
        }
    } else if anthropic {
        set.push(("anthropic-version".into(), ANTHROPIC_VERSION.to_owned()));
    }
    if !plan.rid.is_empty() {
        set.push(("x-request-id".into(), plan.rid.clone()));
    }
    if !plan.idempotency_key.is_empty() {
        set.push(("idempotency-key".into(), plan.idempotency_key.clone()));
    }
    if plan.stream {
        set.push(("accept".into(), "text/event-stream".into()));
    }
    // Each once: the caller's own credentials may be among those the key replaces.
    remove.sort();
    remove.dedup();
    let body = match copied {
        Some(copied) => copied,
        None => Body::Written(serde_json::to_vec(&value).unwrap_or_else(|_| body.to_vec())),
    };
    Ok(ProviderRequest {
        body,
        authority: provider.authority.clone(),
        path,
        cluster,
        remove,
        set,
        native,
        echo,
        dimensions,
    })
}

/// The caller's body as the bytes its lane gets, when the body already names the lane's
/// model: a chat body to a chat lane (any kind but anthropic) as it came, a stream's with the
/// usage asked for added (when it has no `stream_options` of its own); a Messages body to an
/// anthropic lane (native: nothing but the model is ever written) as it came. What
/// [`body_for`] would send, without parsing the body into a value and writing it again.
/// `None`: [`body_for`] decides.
fn passed_through(
    plan: &Plan,
    provider: &Provider,
    model: &str,
    native: bool,
    body: &[u8],
) -> Option<Body> {
    let anthropic = provider.kind() == ProviderKind::Anthropic;
    let chat = plan.protocol == Protocol::Chat && plan.op == Operation::Chat && !anthropic;
    let messages = plan.protocol == Protocol::Messages && native && anthropic;
    if !chat && !messages {
        return None;
    }
    // The front stage read the body's top (`Plan::body_top`); a plan without it is re-written.
    let top = plan.body_top.as_ref()?;
    as_it_came(
        plan,
        messages,
        top.model.as_deref(),
        top.stream_options,
        model,
        body,
    )
}

/// [`passed_through`] once the body's top is known: its `model` and whether it has
/// `stream_options`.
fn as_it_came(
    plan: &Plan,
    messages: bool,
    body_model: Option<&str>,
    stream_options: bool,
    model: &str,
    body: &[u8],
) -> Option<Body> {
    if body_model != Some(model) {
        return None;
    }
    if messages || !plan.stream {
        return Some(Body::AsItCame);
    }
    if stream_options {
        return None;
    }
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if body[end] != b'}' {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 40);
    out.extend_from_slice(&body[..end]);
    out.extend_from_slice(br#","stream_options":{"include_usage":true}"#);
    out.extend_from_slice(&body[end..]);
    Some(Body::Written(out))
}

/// The body for the provider: the caller's, translated to the lane's protocol, with the lane's
/// model and usage asked for on streams; and, for Responses, the caller's body the answer
/// echoes.
fn body_for(
    plan: &Plan,
    provider: &Provider,
    model: &str,
    native: bool,
    body: &[u8],
) -> Result<(Value, Option<Value>), AdapterError> {
    let mut value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let gemini = plan.protocol == Protocol::Gemini;
    let embed = gemini && plan.op == Operation::Embeddings;
    // Gemini embeddings: the answer's shape (one embedding or a batch) follows the caller's body.
    let caller = embed.then(|| value.clone());
    if gemini && !native {
        // The caller's Gemini body, translated for this lane as the front stage routed it.
        value = match embed {
            true => crate::protocols::gemini::embed::to_openai(model, &value)?,
            false => {
                crate::protocols::gemini::request::to_chat_request(model, plan.stream, &value)?
            }
        };
    }
    let echo = (plan.protocol == Protocol::Responses)
        .then(|| value.clone())
        .or(caller);
    if !native && !protocols::carries_chat(plan.protocol) {
        value = protocols::chat_request(plan.protocol, &value, Fidelity::Strict)?;
    }
    if let Some(obj) = value.as_object_mut() {
        obj.insert("model".into(), Value::String(model.to_owned()));
        if plan.stream && !native {
            let opts = obj
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(o) = opts.as_object_mut() {
                o.insert("include_usage".into(), Value::Bool(true));
            }
        }
    }
    if provider.kind() == ProviderKind::Anthropic && plan.op == Operation::Chat && !native {
        let max_tokens = provider.default_max_tokens;
        let mut v = anthropic::request::to_messages_request(&value, model, max_tokens)?;
        crate::protocols::prompt_cache::mark_translated(&value, &mut v, &plan.prompt_cache);
        value = v;
    }
    if gemini && native {
        value = crate::protocols::gemini::native::request(&value, model);
    }
    Ok((value, echo))
}

/// The key's header: none for a keyless provider (the caller's credentials are removed by the
/// allowlist); Google's own API takes it as `x-goog-api-key`.
fn credentials(
    provider: &Provider,
    key: &ProviderKey,
    gemini_native: bool,
    set: &mut Vec<(String, String)>,
    remove: &mut Vec<String>,
) {
    if key.secret.is_empty() {
        return;
    }
    if gemini_native {
        remove.push("authorization".into());
        if !provider.auth_header.is_empty() {
            remove.push(provider.auth_header.clone());
        }
        set.push(("x-goog-api-key".into(), key.secret.clone()));
    } else if provider.auth_header == "authorization" || provider.auth_header.is_empty() {
        set.push(("authorization".into(), format!("Bearer {}", key.secret)));
    } else {
        set.push((provider.auth_header.clone(), key.secret.clone()));
    }
}

impl ProviderRequest {
    /// The bytes the provider gets, the caller's being `caller`.
    #[cfg(test)]
    pub fn bytes<'a>(&'a self, caller: &'a [u8]) -> &'a [u8] {
        match &self.body {
            Body::AsItCame => caller,
            Body::Written(bytes) => bytes,
        }
    }

    /// The caller's headers [`ProviderRequest::apply`] writes over, as they are now (`None`:
    /// absent): what a later attempt puts back in one pass, when this request was written by the
    /// route's upstream filter (whose header writes the router keeps for its retries). Envoy's
    /// own (`x-envoy-`) are left out: the router writes them again for each attempt.
    pub(super) fn touched(&self, host: &impl Host) -> Vec<(String, Option<Vec<u8>>)> {
        let mut names: Vec<&str> = vec![":authority", ":path", "content-length"];
        names.extend(self.remove.iter().map(String::as_str));
        names.extend(self.set.iter().map(|(name, _)| name.as_str()));
        let mut out: Vec<(String, Option<Vec<u8>>)> = Vec::with_capacity(names.len());
        for name in names {
            if name.starts_with("x-envoy-") || out.iter().any(|(n, _)| n == name) {
                continue;
            }
            out.push((name.to_owned(), host.header(Side::Request, name)));
        }
        out
    }

    /// Writes the request over the caller's (whose body is `caller_len` bytes). `routed`: the
    /// attempt listener's route reads the cluster header (and removes it); the upstream filter
    /// of one pass has its cluster already, so writes none.
    pub(super) fn apply(&self, host: &mut impl Host, caller_len: usize, routed: bool) {
        if let Body::Written(bytes) = &self.body {
            host.set_body(Side::Request, 0, caller_len, bytes);
        }
        host.set_header(Side::Request, ":authority", Some(&self.authority));
        host.set_header(Side::Request, ":path", Some(&self.path));
        if routed {
            host.set_header(Side::Request, CLUSTER_HEADER, Some(self.cluster));
        }
        for name in &self.remove {
            host.set_header(Side::Request, name, None);
        }
        for (name, value) in &self.set {
            host.set_header(Side::Request, name, Some(value));
        }
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
