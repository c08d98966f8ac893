//! The one client of the control plane's admin API (and of any other page it serves with a
//! token, `/metrics` included), as the tests call it.

use std::sync::{Arc, Mutex, PoisonError};

use reqwest::Method;

use super::*;

/// The admin API at one address with one token (or none). Every call answers a [`Reply`]
/// (status, headers, JSON, text) whatever its status; the `*_json` calls and
/// [`Admin::create_key`] fail, naming the call and quoting the body, on an unexpected status.
/// Every body is read by the secret scan and kept (see [`Admin::bodies`]).
#[derive(Debug, Clone)]
pub struct Admin {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Admin {
    /// The admin API at `base` (`http://host:port`, the control plane's or the gateway's).
    pub fn new(base: &str, token: Option<&str>) -> Result<Self> {
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            token: token.map(str::to_string),
            http: http_client()?,
            seen: Arc::default(),
        })
    }

    /// The control plane's admin API at `addr` with `token`.
    pub fn at(addr: SocketAddr, token: &str) -> Result<Self> {
        Self::new(&format!("http://{addr}"), Some(token))
    }

    /// The same API with another token (or none); the bodies seen are shared.
    pub fn with_token(&self, token: Option<&str>) -> Self {
        Self {
            token: token.map(str::to_string),
            ..self.clone()
        }
    }

    /// The same API (token, bodies seen) at another `base`.
    pub fn at_base(&self, base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            ..self.clone()
        }
    }

    /// `http://host:port` of the API.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Any call; `body` is sent as JSON. Fails only when no answer came.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Reply> {
        let body = body.map(|b| b.to_string().into_bytes());
        self.call_raw(method, path, body).await
    }

    /// Any call with a body sent as is (`content-type: application/json`), so that a test can
    /// send what is not JSON. Fails only when no answer came.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Reply> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method.clone(), &url);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        let reply = Reply::fetch(req, &format!("{method} {url}")).await?;
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(reply.text.clone());
        Ok(reply)
    }

    pub async fn get(&self, path: &str) -> Result<Reply> {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Reply> {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Reply> {
        self.call(Method::DELETE, path, None).await
    }

    /// [`Admin::call`], failing unless the status is a success; the answer's JSON.
    pub async fn call_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value> {
        let reply = self.call(method.clone(), path, body).await?;
        ensure!(
            (200..300).contains(&reply.status),
            "{method} {path} answered {}: {}",
            reply.status,
            reply.text
        );
        Ok(reply.json)
    }

    /// `GET path`, failing unless the status is a success; the answer's JSON.
    pub async fn get_json(&self, path: &str) -> Result<Value> {
        self.call_json(Method::GET, path, None).await
    }

    /// `POST path` with `body`, failing unless the status is a success; the answer's JSON.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        self.call_json(Method::POST, path, Some(body)).await
    }

    /// Creates a virtual key from `spec` (`POST /admin/keys`, which must answer 201); returns
    /// its id and secret, the secret registered with the secret scan.
    pub async fn create_key(&self, spec: &Value) -> Result<(String, String)> {
        let reply = self.post("/admin/keys", spec).await?;
        ensure!(reply.status == 201, "POST /admin/keys: {reply}");
        let field = |path: &str| {
            reply
                .json
                .pointer(path)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("no {path} in POST /admin/keys: {reply}"))
        };
        let (id, secret) = (field("/key/id")?, field("/secret")?);
        scan::register("a virtual key", &secret);
        Ok((id, secret))
    }

    /// Every body this API (and its copies with another token) answered, in order.
    pub fn bodies(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
