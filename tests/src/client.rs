//! The client side: requests, replies, server-sent events.

use super::*;

/// A unary answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    /// The body parsed as JSON, `Null` if it is not JSON.
    pub json: Value,
    pub text: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// The `error.code` of an OpenAI error object.
    pub fn error_code(&self) -> Option<&str> {
        self.json.pointer("/error/code").and_then(Value::as_str)
    }

    /// `choices[0].message.content`.
    pub fn content(&self) -> Option<&str> {
        self.json
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
    }
}

impl Reply {
    /// Sends `req` (`what` names it: method and URL) and reads the whole answer, which the
    /// secret scan reads too.
    pub async fn fetch(req: reqwest::RequestBuilder, what: &str) -> Result<Reply> {
        let resp = req.send().await.with_context(|| what.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .text()
            .await
            .with_context(|| format!("reading the body of {what}"))?;
        scan::observe(
            &format!("the answer to {what}"),
            &answer_bytes(&headers, text.as_bytes()),
        );
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            headers,
            json,
            text,
        })
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (k, v) in &self.headers {
            writeln!(f, "{k}: {}", v.to_str().unwrap_or("<binary>"))?;
        }
        write!(f, "\n{}", self.text)
    }
}

/// A streamed answer: the `data:` payloads of its server-sent events, in order.
#[derive(Debug, Clone)]
pub struct StreamReply {
    pub status: u16,
    pub headers: HeaderMap,
    /// Each event's data (multi-line data joined with `\n`), `[DONE]` included.
    pub events: Vec<String>,
    /// The raw body as received.
    pub body: String,
    /// Set when the connection failed before the body ended.
    pub transport_error: Option<String>,
}

impl StreamReply {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// A 200 whose body arrived whole and ended with `[DONE]`.
    pub fn is_whole(&self) -> bool {
        self.status == 200
            && self.transport_error.is_none()
            && self.events.last().map(String::as_str) == Some("[DONE]")
    }

    /// The events that parse as JSON (everything but `[DONE]`).
    pub fn json_events(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter_map(|e| serde_json::from_str(e).ok())
            .collect()
    }

    /// The chunks whose first choice's delta carries a role.
    pub fn role_chunks(&self) -> usize {
        self.json_events()
            .iter()
            .filter(|e| {
                e.pointer("/choices/0/delta/role")
                    .is_some_and(|r| !r.is_null())
            })
            .count()
    }

    /// Every `delta.content`, in order.
    pub fn contents(&self) -> Vec<String> {
        self.json_events()
            .iter()
            .filter_map(|e| {
                e.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
            })
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The concatenated content.
    pub fn text(&self) -> String {
        self.contents().concat()
    }
}

impl fmt::Display for StreamReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (k, v) in &self.headers {
            writeln!(f, "{k}: {}", v.to_str().unwrap_or("<binary>"))?;
        }
        write!(f, "\n{}", self.body)?;
        if let Some(e) = &self.transport_error {
            write!(f, "\n<transport error: {e}>")?;
        }
        Ok(())
    }
}

/// Parses a server-sent-event body into its events' data. Events end at a blank line; lines
/// may end in `\n`, `\r\n` or `\r`; `data:` lines of one event are joined with `\n`; comments
/// and other fields are ignored. A final event without its blank line still counts.
pub fn parse_sse(body: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    let normalized = body.replace("\r\n", "\n").replace('\r', "\n");
    for line in normalized.split('\n') {
        if line.is_empty() {
            if let Some(d) = data.take() {
                events.push(d);
            }
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
    if let Some(d) = data {
        events.push(d);
    }
    events
}

/// A chat request body with one user message.
pub fn chat_body(model: &str, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{ "role": "user", "content": "Say hello." }],
    });
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// An HTTP client of the gateway.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// `base` is `http://host:port` (no `/v1`).
    pub fn new(base: &str) -> Result<Self> {
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            http: http_client()?,
        })
    }

    /// The same over HTTP/2 without TLS (prior knowledge), as `curl --http2-prior-knowledge`.
    pub fn new_h2(base: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .http2_prior_knowledge()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building the HTTP/2 client")?;
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// Any request; `body` is sent as is (so invalid JSON can be sent).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<String>,
    ) -> Result<Reply> {
        self.request_with_headers(method, path, key, body, &[])
            .await
    }

    /// `POST /v1/chat/completions` with `body` and extra request headers.
    pub async fn chat_with_headers(
        &self,
        body: &Value,
        key: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Reply> {
        let body = Some(body.to_string());
        let path = "/v1/chat/completions";
        self.request_with_headers(reqwest::Method::POST, path, key, body, headers)
            .await
    }

    /// [`Client::request`] with extra request headers.
    pub async fn request_with_headers(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> Result<Reply> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        Reply::fetch(req, &format!("{method} {url}")).await
    }

    /// `POST /v1/chat/completions` with `body`.
    pub async fn chat_with(&self, body: &Value, key: Option<&str>) -> Result<Reply> {
        self.request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            key,
            Some(body.to_string()),
        )
        .await
    }

    /// A unary chat completion of `model`.
    pub async fn chat(&self, model: &str, key: Option<&str>) -> Result<Reply> {
        self.chat_with(&chat_body(model, false), key).await
    }

    /// A streamed chat completion of `model`.
    pub async fn stream(&self, model: &str, key: Option<&str>) -> Result<StreamReply> {
        self.stream_with(&chat_body(model, true), key).await
    }

    /// Sends `POST /v1/chat/completions` with `body` asking for server-sent events; returns once
    /// the response headers came.
    async fn send_stream_request(
        &self,
        body: &Value,
        key: Option<&str>,
    ) -> Result<reqwest::Response> {
        let url = format!("{}/v1/chat/completions", self.base);
        let mut req = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body.to_string());
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        req.send().await.with_context(|| format!("POST {url}"))
    }

    /// `POST /v1/chat/completions` with `body` (which should say `stream: true`), reading the
    /// body to its end or to the connection's failure.
    pub async fn stream_with(&self, body: &Value, key: Option<&str>) -> Result<StreamReply> {
        let resp = self.send_stream_request(body, key).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut bytes = Vec::new();
        let mut transport_error = None;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(b) => bytes.extend_from_slice(&b),
                Err(e) => {
                    transport_error = Some(format!("{e:#}"));
                    break;
                }
            }
        }
        scan::observe("a streamed answer", &answer_bytes(&headers, &bytes));
        let body = String::from_utf8_lossy(&bytes).into_owned();
        Ok(StreamReply {
            status,
            headers,
            events: parse_sse(&body),
            body,
            transport_error,
        })
    }
}

impl Client {
    /// A streamed call the client gives up on: it reads the answer until `after` bytes of
    /// the body came, then drops the connection mid-stream (an abort, as a closed browser tab
    /// does). Returns the status and the bytes read (the answer may have ended before).
    pub async fn stream_abandoned(
        &self,
        body: &Value,
        key: Option<&str>,
        after: usize,
    ) -> Result<(u16, Vec<u8>)> {
        let resp = self.send_stream_request(body, key).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut bytes = Vec::new();
        let mut stream = resp.bytes_stream();
        while bytes.len() < after {
            match stream.next().await {
                Some(Ok(b)) => bytes.extend_from_slice(&b),
                Some(Err(_)) | None => break,
            }
        }
        // Dropping the unread body closes the connection: it never goes back to the pool.
        drop(stream);
        scan::observe("an abandoned stream", &answer_bytes(&headers, &bytes));
        Ok((status, bytes))
    }
}

/// An answer's headers and body as one blob for the secret scan.
fn answer_bytes(headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 512);
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(body);
    out
}

/// Sends one raw HTTP/1.1 request (it should ask to close) and reads the whole answer, which
/// the secret scan reads too: no client library between the test and the bytes, so nothing
/// normalises the path or refuses a header value.
pub async fn raw_http1(addr: SocketAddr, request: &[u8]) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.write_all(request).await?;
    let mut out = Vec::new();
    tokio::time::timeout(REQUEST_TIMEOUT, stream.read_to_end(&mut out))
        .await
        .with_context(|| format!("no whole answer from {addr} in time"))??;
    scan::observe("a raw HTTP/1.1 answer", &out);
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The status of a raw HTTP/1.1 answer (0 when there is none).
pub fn status_of(raw: &str) -> u16 {
    raw.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
