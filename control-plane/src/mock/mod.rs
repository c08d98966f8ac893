//! The scriptable fake LLM provider: `ai-router mock`.
//!
//! A real HTTP server (HTTP/1.1, and HTTP/2 with prior knowledge) that answers like OpenAI,
//! Anthropic and the OpenAI-compatible providers, with replies you script per key, model or
//! path: successes, provider errors, latencies, broken connections and broken streams. Use it
//! to test the router, or your own app behind it.
//!
//! ```text
//! ai-router mock [--host 127.0.0.1] --port 0 [--script mock.yaml]
//! {"listening":"http://127.0.0.1:41234"}
//! ```
//!
//! # Endpoints
//!
//! | request | answered as |
//! |---|---|
//! | `POST` any path ending in `/chat/completions` | OpenAI chat completions, unary or SSE (`stream: true`) |
//! | `POST` any path ending in `/messages` | the Anthropic Messages API, unary or SSE |
//! | `POST` any path ending in `/messages/count_tokens` | Anthropic's token count, `{"input_tokens": N}` (N: the mock's prompt estimate) |
//! | `POST` any path ending in `/embeddings` | OpenAI embeddings |
//! | `GET` any path ending in `/models` | the script's `catalog` for the request's key (`mock::catalog`: OpenAI's list shape, or Anthropic's with `shape: anthropic` or an `anthropic-version` header), recorded in `/_mock/calls`; without a catalog, 404 |
//! | `GET` any path ending in `/key` | OpenRouter's current-key answer from the script's `keyInfo` (`mock::key_info`: the key's credit limit, usage and what is left), recorded in `/_mock/calls`; without `keyInfo`, 404 |
//! | `POST` any path ending in `/responses` | the OpenAI Responses API, unary or SSE (typed events: `response.created`, `response.output_item.added`, `response.output_text.delta`, `response.function_call_arguments.delta`, `response.output_item.done`, `response.completed`; `failWith: error-event` sends `event: error`) |
//! | `POST` any path ending in `/models/{model}:generateContent`, `:streamGenerateContent` (SSE with `?alt=sse`, else one JSON array), `:countTokens`, `:embedContent`, `:batchEmbedContents` | Google's Gemini API (`mock::gemini`): the model is the path's, the key `x-goog-api-key` or `?key=`; thought parts (`thinking`), whole function calls, `usageMetadata`; errors as `{"error":{"code","message","status","details"}}` (a 429 with a `RetryInfo` detail, `retryDelay` from `retry-after`); no key: 403 `PERMISSION_DENIED`; `gemini.*` provider errors as the one object the native API answers |
//! | anything else outside `/_mock/` | 404, an OpenAI error object |
//!
//! The request's key is the bearer token of `authorization`, else `x-api-key`; its model is
//! the body's `model`. A base URL such as `http://127.0.0.1:41234/v1` or
//! `http://127.0.0.1:41234/anthropic/v1` works for any provider kind.
//!
//! Without a matching rule the answer is the default: 200 with the text
//! `Hello from the ai-router mock.`, the request's `model` echoed, ids `chatcmpl-mock-<seq>` /
//! `msg_mock_<seq>` (`seq` is the call's number, from 1), `created` fixed at 1700000000, and
//! usage estimated at four characters a token (prompt: the text of `messages`, `system` and
//! `input`). A stream sends the role chunk (`delta: {role: "assistant", content: ""}`), the text
//! a word per chunk, the chunk with `finish_reason: "stop"`, the usage chunk (empty `choices`)
//! only when the request set `stream_options.include_usage: true`, then `data: [DONE]`. The
//! Anthropic stream is `message_start`, `content_block_start`, `ping`, `content_block_delta`
//! (`text_delta`)..., `content_block_stop`, `message_delta` (stop reason, usage),
//! `message_stop`. Every event is its own flushed chunk. Embeddings answer one deterministic
//! unit vector per input (a string, a list of strings or token lists), 8 long unless the
//! request's `dimensions` or the reply says otherwise, as float lists or base64 as the
//! request's `encoding_format` asks.
//!
//! # Scripts
//!
//! A script is JSON or YAML (`--script FILE`: JSON for `.json`, YAML otherwise; JSON over the
//! control API):
//!
//! ```yaml
//! rules:
//!   - match: { key: sk-test-1 }                 # key, model, path (a suffix); all optional
//!     replies:
//!       - { status: 429, headers: { retry-after: 30 } }
//!       - providerError: openai.quota_exhausted
//!   - match: { model: m-stream }
//!     replies:
//!       - stream: { chunks: [a, b], failAfter: 1 }   # then abort the connection
//!       - { latencyMs: 20, text: hello }             # used for every later call
//!   - match: { path: /embeddings }
//!     replies: [{ dimensions: 1536 }]
//! ```
//!
//! A script may also hold a `catalog` (`mock::catalog`): what `GET …/models` lists, per key:
//!
//! ```yaml
//! catalog:
//!   models: [m1]                       # every key, unless `keys` names it
//!   keys: { sk-test-1: [m1, m-only-1] }
//!   shape: anthropic                   # optional (else by the request's anthropic-version)
//! rules:
//!   - match: { path: /models, key: sk-test-2 }   # only rules with a path answer listings
//!     replies: [{ status: 503 }]
//! ```
//!
//! Listings are recorded in `/_mock/calls` like any call (path `…/models`, no model), so a
//! test counts them per key.
//!
//! The first rule whose `match` fits answers (a field left out matches anything). A rule's
//! replies are used in order, one per call, and the last one repeats; with `cycle: true` they
//! go round instead (a fixed mix of faults and successes under load). Unknown fields are
//! refused, so a typo fails loudly. Reply fields, all optional:
//!
//! | field | meaning |
//! |---|---|
//! | `status` | the HTTP status (default 200); a 4xx/5xx without `body` gets a generic error object in the endpoint's shape |
//! | `headers` | response headers (numbers allowed in YAML); characters U+0080..U+00FF are sent as their single Latin-1 byte, so a script can send raw non-UTF-8 header bytes |
//! | `latencyMs` | delay before the response headers |
//! | `trickleMs` | send a unary body in 8 pieces, this many ms apart (a slow trickle) |
//! | `error: network` | close the TCP connection without any response |
//! | `error: reset-after-headers` | send the status and headers, then close the connection before the first body byte (unary or stream) |
//! | `text` | the message text (default `Hello from the ai-router mock.`, none when `toolCalls` is set) |
//! | `toolCalls` | `[{id?, name, arguments?, argumentChunks?}]`: `message.tool_calls` / Anthropic `tool_use` blocks; streamed as deltas (`argumentChunks` splits them); `arguments` is a JSON string or a JSON value |
//! | `thinking` | the model's thinking before the text (Gemini's `thought: true` parts; other shapes ignore it) |
//! | `usage` | `{prompt_tokens, completion_tokens}` in place of the estimate |
//! | `noUsage` | `true`: no usage at all (no `usage` in a chat completion, no usage chunk in its stream), as some OpenAI-compatible servers |
//! | `embedding` | the vector for every input |
//! | `dimensions` | the length of generated vectors |
//! | `body` | returned verbatim with the status: a JSON value, or a string sent as is (content-type `text/plain` unless `headers` say otherwise) |
//! | `providerError` | `<kind>.<case>` from the provider error table: its status, headers and body (the reply's own `status`, `headers`, `body` win) |
//! | `stream` | how a `stream: true` request is streamed, below |
//!
//! `stream` fields: `chunks` (the text pieces, one per chunk; default the text split at word
//! boundaries), `delayMs` (before each content chunk and the finish chunk), `failAfter` (fail
//! after this many content chunks: text or tool-call deltas; 0 fails right after the role
//! chunk, before the first token), `failWith` (`network`, the default: abort the connection
//! mid-body without the terminating chunk; `error-event`: send a streamed error object,
//! `data: {"error":{...}}` or Anthropic's `event: error`, then end the body; `truncate`: end
//! the body cleanly without the finish chunk and without `[DONE]`; `malformed`: send a `data:`
//! event that is not JSON, then the rest of the stream as usual; without `failAfter` it
//! fails after all content), `stallAfter` + `stallMs` (pause once after that many content
//! chunks), `includeUsage` (true or false forces the usage chunk on or off whatever the
//! request asked), `errorMessage` (the message of the `error-event` failure). A reply without `stream` streams its text a word per chunk; a reply with
//! `stream` used on a unary request answers the joined chunks.
//!
//! # Provider errors
//!
//! [`provider_error`] (`providerError` in a script) holds each provider's real error answers,
//! read from `testdata/provider-errors/<kind>.yaml` (embedded in the binary; the same files
//! state the classifier's expected verdict on each, checked by filter-core's table test).
//! Every kind (`openai`, `anthropic`, `openrouter`, `qwen`, `deepseek`, `gemini`, `groq`,
//! `openai-compatible`) has `rate_limited`, `quota_exhausted`, `invalid_key`, `overloaded` and
//! `bad_request`; second shapes include `openai.billing_hard_limit`,
//! `openai.tokens_rate_limited`, `anthropic.spend_cap`, `anthropic.billing_error`,
//! `openrouter.free_daily`, `openrouter.key_limit`, `qwen.free_tier_exhausted`,
//! `qwen.native_throttling`, `gemini.free_daily`, `gemini.tokens_per_minute`,
//! `groq.tokens_per_day`, `groq.requests_per_minute`, `groq.flex_capacity`
//! ([`provider_error_names`] lists them all; `GET /_mock/errors` shows them).
//!
//! # Control API
//!
//! | route | does |
//! |---|---|
//! | `PUT /_mock/script` | replace the script (JSON body); 400 `{"error":{"message":"bad script: ..."}}` on a bad one; 200 `{"rules":N}` |
//! | `POST /_mock/rules` | append one rule (JSON body); 200 `{"rules":N}` |
//! | `GET /_mock/calls` | `{"calls":[{"seq","path","key","model","stream","headers":{lowercased name: value},"body"}]}`; `body` is the JSON body, or a string when it is not JSON |
//! | `DELETE /_mock/calls` | forget the recorded calls; 200 `{"cleared":N}` |
//! | `POST /_mock/reset` | clear the script, the calls and the call numbering |
//! | `GET /_mock/health` | `{"status":"ok"}` |
//! | `GET /_mock/errors` | the provider error table, `{"<kind>.<case>": {status, headers, body}}` |
//!
//! The mock records the keys your tests send: it is a test double, use test values.

mod answer;
mod anthropic;
mod catalog;
mod errors;
mod gemini;
mod key_info;
mod openai;
mod responses;
mod script;
mod sse;
mod validate;

pub use catalog::{Catalog, Shape as CatalogShape};
pub use errors::{provider_error, provider_error_names, ERROR_CASES};
pub use key_info::{KeyCredit, KeyInfo};
pub use script::{
    FailWith, Match, Reply, ReplyError, Rule, Script, ScriptError, StreamSpec, ToolCall, Usage,
};

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use answer::{Answer, Turn};
use script::{RequestFacts, Rules};

/// How to start the mock.
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// A script to load at start (JSON for `.json`, YAML otherwise).
    pub script: Option<PathBuf>,
}

impl Default for MockOptions {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: 0,
            script: None,
        }
    }
}

/// Binds, prints ONE JSON line `{"listening":"http://HOST:PORT"}` on stdout (the real port),
/// serves until SIGINT or SIGTERM.
pub async fn run(opts: MockOptions) -> anyhow::Result<()> {
    let handle = start(opts).await?;
    if let Err(err) = crate::stdout::print_line(&json!({ "listening": handle.url() }).to_string()) {
        tracing::warn!(%err, "cannot print the listening line on stdout");
    }
    tracing::info!(addr = %handle.addr(), "mock provider listening");
    shutdown_signal().await?;
    tracing::info!("mock provider stopping");
    drop(handle);
    Ok(())
}

#[cfg(unix)]
async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn shutdown_signal() -> anyhow::Result<()> {
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")
}

/// In-process start: binds and serves in the background.
pub async fn start(opts: MockOptions) -> anyhow::Result<MockHandle> {
    // A table that does not load would make every `providerError` unknown: refuse to start.
    errors::check_table()
        .map_err(|error| anyhow::anyhow!("the embedded provider error table: {error}"))?;
    let script = match &opts.script {
        Some(path) => Script::from_file(path)?,
        None => Script::default(),
    };
    let listener = TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .with_context(|| format!("binding the mock provider to {}:{}", opts.host, opts.port))?;
    let addr = listener
        .local_addr()
        .context("reading the mock provider's bound address")?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            rules: Rules::new(script),
            calls: Vec::new(),
            seq: 0,
        }),
    });
    let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
    Ok(MockHandle { addr, shared, task })
}

/// A running mock; dropping it shuts the server down (open connections included).
#[derive(Debug)]
pub struct MockHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl MockHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the script, as `PUT /_mock/script` does.
    pub fn set_script(&self, script: Script) -> Result<(), ScriptError> {
        script.validate()?;
        self.shared.lock().rules.replace(script);
        Ok(())
    }

    /// Appends a rule, as `POST /_mock/rules` does.
    pub fn push_rule(&self, rule: Rule) -> Result<(), ScriptError> {
        Script {
            rules: vec![rule.clone()],
            ..Script::default()
        }
        .validate()?;
        self.shared.lock().rules.push(rule);
        Ok(())
    }

    /// The calls recorded so far.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// Clears the script, the calls and the call numbering.
    pub fn reset(&self) {
        self.shared.lock().reset();
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        // The accept loop owns the connection tasks: aborting it drops them all.
        self.task.abort();
    }
}

/// One request the mock received.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Call {
    pub seq: u64,
    pub path: String,
    pub key: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct State {
    rules: Rules,
    calls: Vec<Call>,
    seq: u64,
}

impl State {
    fn reset(&mut self) {
        self.rules = Rules::default();
        self.calls.clear();
        self.seq = 0;
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                }
                Err(error) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(%error, "mock provider accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    // Stream chunks leave at once, so their timing is observable.
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |request| {
        let shared = Arc::clone(&shared);
        async move { handle(&shared, request).await }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(error) = builder
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%error, "mock provider connection ended");
    }
}

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// A scripted `error: network`: failing the service makes hyper close the connection without
/// writing a response.
#[derive(Debug, thiserror::Error)]
#[error("scripted network failure: connection closed without a response")]
struct NetworkFailure;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

async fn handle(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Response<Body>, NetworkFailure> {
    let path = request.uri().path().to_owned();
    if path == "/_mock" || path.starts_with("/_mock/") {
        return Ok(control(shared, request).await);
    }
    if request.method() == Method::GET && catalog::is_listing(&path) {
        if let Some(response) = listing(shared, &request, &path).await? {
            return Ok(response);
        }
    }
    if request.method() == Method::GET && key_info::is_key_info(&path) {
        if let Some(response) = listing(shared, &request, &path).await? {
            return Ok(response);
        }
    }
    let query = request.uri().query().unwrap_or_default().to_owned();
    let endpoint = match Endpoint::of(&path, &query) {
        Some(endpoint) if request.method() == Method::POST => endpoint,
        _ => {
            return Ok(json_response(
                StatusCode::NOT_FOUND,
                &openai::error_body(
                    404,
                    &format!("Unknown request URL: {} {path}.", request.method()),
                ),
            ))
        }
    };
    let (parts, body) = request.into_parts();
    // A client that hangs up mid-body gets nothing back either.
    let raw = body.collect().await.map_err(|_| NetworkFailure)?.to_bytes();
    let parsed: Option<Value> = serde_json::from_slice(&raw).ok();
    let gemini_call = match endpoint {
        Endpoint::Gemini { method, .. } => gemini::of(&path).map(|(model, _)| (model, method)),
        _ => None,
    };
    let key = match gemini_call {
        Some(_) => gemini::key(&parts.headers, &query).or_else(|| request_key(&parts.headers)),
        None => request_key(&parts.headers),
    };
    let model = match &gemini_call {
        Some((model, _)) => Some(model.clone()),
        None => parsed
            .as_ref()
            .and_then(|body| body.get("model"))
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let stream = match gemini_call {
        Some((_, method)) => method == gemini::Method::Stream,
        None => {
            endpoint != Endpoint::Embeddings
                && parsed
                    .as_ref()
                    .and_then(|body| body.get("stream"))
                    .and_then(Value::as_bool)
                    == Some(true)
        }
    };
    let headers: BTreeMap<String, String> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();

    let (seq, reply) = {
        let mut state = shared.lock();
        state.seq += 1;
        let seq = state.seq;
        let reply = state.rules.next_reply(&RequestFacts {
            path: &path,
            key: key.as_deref(),
            model: model.as_deref(),
        });
        state.calls.push(Call {
            seq,
            path: path.clone(),
            key: key.clone(),
            model: model.clone(),
            stream,
            headers,
            body: parsed
                .clone()
                .unwrap_or_else(|| Value::String(String::from_utf8_lossy(&raw).into_owned())),
        });
        (seq, reply.unwrap_or_default().resolved())
    };

    if let Some(ms) = reply.latency_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if reply.error == Some(ReplyError::Network) {
        return Err(NetworkFailure);
    }
    let key_for_refusal = key;
    let request_body = parsed.unwrap_or(Value::Null);
    let refusal = match endpoint {
        Endpoint::Chat => validate::chat_refusal(&request_body).map(|body| (400, body)),
        Endpoint::Messages => validate::messages_refusal(&request_body).map(|body| (400, body)),
        // Google refuses a call without a key, or without what its method needs.
        Endpoint::Gemini { method, .. } if reply.status.is_none() && reply.body.is_none() => {
            gemini::refusal(method, key_for_refusal.as_deref(), &request_body)
        }
        Endpoint::Responses
        | Endpoint::Embeddings
        | Endpoint::CountTokens
        | Endpoint::Gemini { .. } => None,
    };
    if let Some((status, body)) = refusal {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        return Ok(json_response(status, &body));
    }
    let turn = Turn {
        seq,
        model: model.unwrap_or_default(),
        prompt_tokens: answer::estimate_tokens(answer::prompt_chars(&request_body)),
        usage_requested: request_body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true),
    };
    let response = respond(
        endpoint,
        &reply,
        &turn,
        &request_body,
        stream,
        !raw.is_empty(),
    );
    if reply.error == Some(ReplyError::ResetAfterHeaders) {
        let (parts, _) = response.into_parts();
        let abort = sse::body(vec![sse::Step::Abort {
            delay: Duration::ZERO,
        }]);
        return Ok(Response::from_parts(parts, abort));
    }
    match reply.trickle_ms {
        Some(ms) if !stream => Ok(trickled(response, Duration::from_millis(ms)).await),
        _ => Ok(response),
    }
}

/// A model listing (`GET …/models`) from the script's catalog, or a key's credit (`GET …/key`)
/// from its `keyInfo`, recorded as a call; a rule matching the path answers it instead.
/// `None`: the script has neither for the path.
async fn listing(
    shared: &Shared,
    request: &Request<Incoming>,
    path: &str,
) -> Result<Option<Response<Body>>, NetworkFailure> {
    let key = request_key(request.headers());
    let anthropic_version = request.headers().contains_key("anthropic-version");
    let query = request.uri().query().unwrap_or_default().to_owned();
    let (reply, body) = {
        let mut state = shared.lock();
        let body = if key_info::is_key_info(path) {
            let Some(info) = state.rules.key_info() else {
                return Ok(None);
            };
            info.answer(key.as_deref())
        } else {
            let Some(catalog) = state.rules.catalog() else {
                return Ok(None);
            };
            catalog.listing(key.as_deref(), anthropic_version, &query)
        };
        state.seq += 1;
        let seq = state.seq;
        let headers = request
            .headers()
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        state.calls.push(Call {
            seq,
            path: path.to_owned(),
            key: key.clone(),
            model: None,
            stream: false,
            headers,
            body: Value::Null,
        });
        let reply = state.rules.next_listing_reply(&RequestFacts {
            path,
            key: key.as_deref(),
            model: None,
        });
        (reply.map(|r| r.resolved()), body)
    };
    let Some(reply) = reply else {
        return Ok(Some(json_response(StatusCode::OK, &body)));
    };
    if let Some(ms) = reply.latency_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if reply.error.is_some() {
        return Err(NetworkFailure);
    }
    let status = reply
        .status
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let answer = match (&reply.body, status.is_success()) {
        (Some(scripted), _) => scripted.clone(),
        (None, true) => body,
        (None, false) => {
            let message = format!(
                "The ai-router mock answered {} as scripted.",
                status.as_u16()
            );
            if anthropic_version {
                anthropic::error_body(status.as_u16(), &message)
            } else {
                openai::error_body(status.as_u16(), &message)
            }
        }
    };
    Ok(Some(json_response(status, &answer)))
}

/// Pieces a unary answer's body takes when trickled.
const TRICKLE_PIECES: usize = 8;

/// The same answer with its body sent in [`TRICKLE_PIECES`] pieces, `gap` apart.
async fn trickled(response: Response<Body>, gap: Duration) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        return Response::from_parts(parts, full(Bytes::new()));
    };
    let bytes = collected.to_bytes();
    let size = bytes.len().div_ceil(TRICKLE_PIECES).max(1);
    let steps = (0..bytes.len())
        .step_by(size)
        .map(|start| sse::Step::Send {
            delay: if start == 0 { Duration::ZERO } else { gap },
            bytes: bytes.slice(start..(start + size).min(bytes.len())),
        })
        .collect();
    let mut parts = parts;
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    Response::from_parts(parts, sse::body(steps))
}

/// The provider API a path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Messages,
    /// Anthropic's `POST /v1/messages/count_tokens`.
    CountTokens,
    Responses,
    Embeddings,
    /// Google's Gemini API (`…/models/{model}:{method}`); `sse`: the query's `alt=sse`.
    Gemini {
        method: gemini::Method,
        sse: bool,
    },
}

impl Endpoint {
    fn of(path: &str, query: &str) -> Option<Self> {
        let path = path.trim_end_matches('/');
        if let Some((_, method)) = gemini::of(path) {
            return Some(Self::Gemini {
                method,
                sse: gemini::wants_sse(query),
            });
        }
        if path.ends_with("/chat/completions") {
            Some(Self::Chat)
        } else if path.ends_with("/messages/count_tokens") {
            Some(Self::CountTokens)
        } else if path.ends_with("/messages") {
            Some(Self::Messages)
        } else if path.ends_with("/embeddings") {
            Some(Self::Embeddings)
        } else if path.ends_with("/responses") {
            Some(Self::Responses)
        } else {
            None
        }
    }

    /// The endpoint's error object; `retry_s`: a 429's delay (Gemini states it in the body).
    fn error_body(self, status: u16, message: &str, retry_s: Option<u64>) -> Value {
        match self {
            Self::Gemini { .. } => gemini::error_body(status, message, retry_s),
            Self::Messages | Self::CountTokens => anthropic::error_body(status, message),
            Self::Chat | Self::Responses | Self::Embeddings => openai::error_body(status, message),
        }
    }
}

/// The bearer token of `authorization`, else `x-api-key`.
fn request_key(headers: &hyper::HeaderMap) -> Option<String> {
    let bearer = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        })
        .filter(|token| !token.is_empty());
    bearer.or_else(|| {
        headers
            .get("x-api-key")
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    })
}

/// Renders a (resolved) reply for the endpoint.
fn respond(
    endpoint: Endpoint,
    reply: &Reply,
    turn: &Turn,
    request: &Value,
    stream: bool,
    had_body: bool,
) -> Response<Body> {
    let status = reply
        .status
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let gemini_body = match (endpoint, &reply.body) {
        (Endpoint::Gemini { .. }, Some(body)) => Some(gemini::native_body(body.clone())),
        _ => None,
    };
    let mut response = if let Some(body) = gemini_body.as_ref().or(reply.body.as_ref()) {
        let (bytes, content_type) = match body {
            Value::String(text) => (Bytes::from(text.clone()), "text/plain; charset=utf-8"),
            other => (Bytes::from(other.to_string()), "application/json"),
        };
        let mut response = Response::new(full(bytes));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    } else if !status.is_success() {
        let message = format!(
            "The ai-router mock answered {} as scripted.",
            status.as_u16()
        );
        let retry_s = reply
            .headers
            .get("retry-after")
            .and_then(|value| value.trim().parse().ok());
        json_response(
            status,
            &endpoint.error_body(status.as_u16(), &message, retry_s),
        )
    } else if request.is_null() && reply == &Reply::default() {
        // No script for it and nothing to read: answer like the provider would.
        let message = if had_body {
            "We could not parse the JSON body of your request."
        } else {
            "The request body is empty; it must be a JSON object."
        };
        json_response(
            StatusCode::BAD_REQUEST,
            &endpoint.error_body(400, message, None),
        )
    } else {
        let mut response = success(endpoint, reply, turn, request, stream);
        *response.status_mut() = status;
        response
    };
    for (name, value) in &reply.headers {
        // Checked when the script was loaded.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&script::header_bytes(value)),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn success(
    endpoint: Endpoint,
    reply: &Reply,
    turn: &Turn,
    request: &Value,
    stream: bool,
) -> Response<Body> {
    if endpoint == Endpoint::Embeddings {
        return json_response(StatusCode::OK, &openai::embeddings(turn, reply, request));
    }
    if let Endpoint::Gemini { method, sse } = endpoint {
        return gemini_success(method, sse, reply, turn, request);
    }
    if endpoint == Endpoint::CountTokens {
        // The mock's own estimate of the prompt (the same it reports as usage).
        return json_response(
            StatusCode::OK,
            &serde_json::json!({ "input_tokens": turn.prompt_tokens }),
        );
    }
    let answer = Answer::new(reply, turn.prompt_tokens);
    if !stream {
        let body = match endpoint {
            Endpoint::Messages | Endpoint::CountTokens => anthropic::message(turn, &answer),
            Endpoint::Responses => responses::unary(turn, &answer),
            Endpoint::Chat | Endpoint::Embeddings | Endpoint::Gemini { .. } => {
                openai::chat_completion(turn, &answer)
            }
        };
        return json_response(StatusCode::OK, &body);
    }
    let spec = reply.stream.clone().unwrap_or_default();
    let mut plan = match endpoint {
        Endpoint::Messages | Endpoint::CountTokens => anthropic::message_stream(turn, &answer),
        Endpoint::Responses => responses::stream(turn, &answer),
        Endpoint::Chat | Endpoint::Embeddings | Endpoint::Gemini { .. } => {
            let include_usage =
                answer.reports_usage && spec.include_usage.unwrap_or(turn.usage_requested);
            openai::chat_stream(turn, &answer, include_usage)
        }
    };
    if let Some(message) = &spec.error_message {
        plan.error_event = match endpoint {
            Endpoint::Messages | Endpoint::CountTokens => anthropic::stream_error_event(message),
            Endpoint::Responses => responses::stream_error_event(message),
            Endpoint::Chat | Endpoint::Embeddings | Endpoint::Gemini { .. } => {
                openai::stream_error_event(message)
            }
        };
    }
    let mut response = Response::new(sse::body(sse::schedule(plan, &spec)));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

/// A Gemini call's success: a generation (unary or streamed), a count or embeddings.
fn gemini_success(
    method: gemini::Method,
    sse: bool,
    reply: &Reply,
    turn: &Turn,
    request: &Value,
) -> Response<Body> {
    let answer = Answer::new(reply, turn.prompt_tokens);
    let thinking = reply.thinking.as_deref();
    match method {
        gemini::Method::Generate => {
            json_response(StatusCode::OK, &gemini::unary(turn, &answer, thinking))
        }
        gemini::Method::CountTokens => json_response(StatusCode::OK, &gemini::count_tokens(turn)),
        gemini::Method::Embed | gemini::Method::BatchEmbed => {
            json_response(StatusCode::OK, &gemini::embed(method, reply, request))
        }
        gemini::Method::Stream => {
            let spec = reply.stream.clone().unwrap_or_default();
            let mut plan = gemini::stream(turn, &answer, thinking, sse);
            if let Some(message) = &spec.error_message {
                plan.error_event = gemini::stream_error_event(message, sse);
            }
            let mut response = Response::new(sse::body(sse::schedule(plan, &spec)));
            let content_type = if sse {
                "text/event-stream"
            } else {
                "application/json; charset=UTF-8"
            };
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        }
    }
}

async fn control(shared: &Shared, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().trim_end_matches('/').to_owned();
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return control_error(
                StatusCode::BAD_REQUEST,
                &format!("reading the body: {error}"),
            )
        }
    };
    let text = String::from_utf8_lossy(&body);
    match (method, path.as_str()) {
        (Method::GET, "/_mock/health") => json_response(StatusCode::OK, &json!({"status": "ok"})),
        (Method::PUT, "/_mock/script") => match Script::from_json(&text) {
            Ok(script) => {
                let mut state = shared.lock();
                state.rules.replace(script);
                json_response(StatusCode::OK, &json!({"rules": state.rules.len()}))
            }
            Err(error) => control_error(StatusCode::BAD_REQUEST, &error.to_string()),
        },
        (Method::POST, "/_mock/rules") => match Rule::from_json(&text) {
            Ok(rule) => {
                let mut state = shared.lock();
                state.rules.push(rule);
                json_response(StatusCode::OK, &json!({"rules": state.rules.len()}))
            }
            Err(error) => control_error(StatusCode::BAD_REQUEST, &error.to_string()),
        },
        (Method::GET, "/_mock/calls") => {
            let calls = shared.lock().calls.clone();
            json_response(StatusCode::OK, &json!({ "calls": calls }))
        }
        (Method::DELETE, "/_mock/calls") => {
            let mut state = shared.lock();
            let cleared = state.calls.len();
            state.calls.clear();
            json_response(StatusCode::OK, &json!({ "cleared": cleared }))
        }
        (Method::POST, "/_mock/reset") => {
            shared.lock().reset();
            json_response(StatusCode::OK, &json!({"status": "reset"}))
        }
        (Method::GET, "/_mock/errors") => {
            let table: serde_json::Map<String, Value> = provider_error_names()
                .into_iter()
                .filter_map(|name| {
                    let reply = errors::provider_error_by_name(&name)?;
                    Some((
                        name,
                        json!({"status": reply.status, "headers": reply.headers, "body": reply.body}),
                    ))
                })
                .collect();
            json_response(StatusCode::OK, &Value::Object(table))
        }
        (method, path) => control_error(
            StatusCode::NOT_FOUND,
            &format!("no mock control route {method} {path}"),
        ),
    }
}

fn control_error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &json!({"error": {"message": message}}))
}

#[cfg(test)]
mod tests;
