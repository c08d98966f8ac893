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
mod call;
mod catalog;
mod control;
mod endpoint;
mod errors;
mod gemini;
mod http;
mod key_info;
mod listing;
mod openai;
mod respond;
mod responses;
mod script;
mod server;
mod sse;
mod state;
mod validate;

pub use catalog::{Catalog, Shape as CatalogShape};
pub use errors::{provider_error, provider_error_names, ERROR_CASES};
pub use key_info::{KeyCredit, KeyInfo};
pub use script::{
    FailWith, Match, Reply, ReplyError, Rule, Script, ScriptError, StreamSpec, ToolCall, Usage,
};
pub use state::Call;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde_json::json;
use tokio::net::TcpListener;

use script::Rules;
use server::accept_loop;
use state::{Shared, State};

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

#[cfg(test)]
mod tests;
