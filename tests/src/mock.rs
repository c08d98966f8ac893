//! The mock provider.

use super::*;

/// One request the mock received (`GET /_mock/calls`).
#[derive(Debug, Clone)]
pub struct MockCall {
    pub seq: u64,
    pub path: String,
    /// The key the request authenticated with (the provider's secret).
    pub key: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    /// The request headers, as the mock reported them.
    pub headers: Value,
    pub body: Value,
    /// The whole record.
    pub raw: Value,
}

impl MockCall {
    pub(crate) fn from_value(v: &Value) -> Self {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Self {
            seq: v.get("seq").and_then(Value::as_u64).unwrap_or_default(),
            path: s("path").unwrap_or_default(),
            key: s("key"),
            model: s("model"),
            stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
            headers: v.get("headers").cloned().unwrap_or(Value::Null),
            body: v.get("body").cloned().unwrap_or(Value::Null),
            raw: v.clone(),
        }
    }

    /// Every `(name, value)` header pair, names lowercased. Accepts a map (values strings or
    /// lists) or a list of pairs.
    pub fn header_pairs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        match &self.headers {
            Value::Object(map) => {
                for (k, v) in map {
                    match v {
                        Value::Array(items) => {
                            for item in items {
                                out.push((k.to_lowercase(), value_text(item)));
                            }
                        }
                        other => out.push((k.to_lowercase(), value_text(other))),
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    match item {
                        Value::Array(pair) if pair.len() == 2 => {
                            out.push((value_text(&pair[0]).to_lowercase(), value_text(&pair[1])));
                        }
                        Value::Object(o) => {
                            let name = o.get("name").map(value_text).unwrap_or_default();
                            let value = o.get("value").map(value_text).unwrap_or_default();
                            out.push((name.to_lowercase(), value));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<String> {
        let name = name.to_lowercase();
        self.header_pairs()
            .into_iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `ai-router mock` on an ephemeral port.
#[derive(Debug)]
pub struct Mock {
    process: Process,
    base: String,
    client: reqwest::Client,
}

impl Mock {
    /// Runs `ai-router mock --host 127.0.0.1 --port 0` and reads `{"listening": ...}`.
    pub async fn start(dir: &TestDir, name: &str) -> Result<Self> {
        Self::start_args(dir, name, Vec::new()).await
    }

    /// [`Mock::start`] with `--script` (a whole script: `rules`, `catalog`), written to the
    /// test directory as `<name>-script.json`.
    pub async fn start_with_script(dir: &TestDir, name: &str, script: &Value) -> Result<Self> {
        let path = dir.join(&format!("{name}-script.json"));
        fs::write(&path, script.to_string())
            .with_context(|| format!("writing {}", path.display()))?;
        Self::start_args(
            dir,
            name,
            vec!["--script".into(), path.display().to_string()],
        )
        .await
    }

    async fn start_args(dir: &TestDir, name: &str, extra: Vec<String>) -> Result<Self> {
        let bin = ai_router_bin()?;
        let mut args: Vec<String> = ["mock", "--host", "127.0.0.1", "--port", "0"]
            .map(String::from)
            .to_vec();
        args.extend(extra);
        let mut process = Process::spawn(dir, name, &bin, &args, &[])?;
        let line = process.first_json_line(START_TIMEOUT).await?;
        let listening = json_str(&line, "listening")
            .with_context(|| process.tail())?
            .trim_end_matches('/')
            .to_string();
        let mock = Self {
            process,
            base: listening,
            client: http_client()?,
        };
        let calls_url = format!("{}/_mock/calls", mock.base);
        let client = mock.client.clone();
        poll(
            &format!("{name} to answer /_mock/calls"),
            START_TIMEOUT,
            || {
                let req = client.get(&calls_url).send();
                async move { Ok(req.await?.status().is_success().then_some(())) }
            },
        )
        .await
        .with_context(|| mock.process.tail())?;
        Ok(mock)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The base URL a provider config points at: `http://127.0.0.1:<port>/v1`.
    pub fn api_base(&self) -> String {
        format!("{}/v1", self.base)
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    async fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = self.client.request(method.clone(), &url);
        if let Some(b) = &body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {url}"))
            .with_context(|| self.process.tail())?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(anyhow!(
                "{method} {url} answered {status}: {text}\nbody sent: {body:?}"
            ))
            .with_context(|| self.process.tail());
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `PUT /_mock/script` with `{"rules": rules}`.
    pub async fn script(&self, rules: Value) -> Result<()> {
        self.control(
            reqwest::Method::PUT,
            "/_mock/script",
            Some(json!({ "rules": rules })),
        )
        .await
        .map(|_| ())
    }

    /// `POST /_mock/rules`: appends one rule, keeping the script (and its catalog).
    pub async fn push_rule(&self, rule: Value) -> Result<()> {
        self.control(reqwest::Method::POST, "/_mock/rules", Some(rule))
            .await
            .map(|_| ())
    }

    /// Scripts one reply for every call (`script::text(..)`, `{"latencyMs": .., "text": ..}`...).
    pub async fn always(&self, reply: Value) -> Result<()> {
        self.script(json!([crate::script::always(vec![reply])]))
            .await
    }

    /// Every call received since the last clear, in order.
    pub async fn calls(&self) -> Result<Vec<MockCall>> {
        let v = self
            .control(reqwest::Method::GET, "/_mock/calls", None)
            .await?;
        let list = v
            .get("calls")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("GET /_mock/calls: no \"calls\" list in {v}"))?;
        let mut calls: Vec<MockCall> = list.iter().map(MockCall::from_value).collect();
        calls.sort_by_key(|c| c.seq);
        Ok(calls)
    }

    /// `DELETE /_mock/calls`.
    pub async fn clear_calls(&self) -> Result<()> {
        self.control(reqwest::Method::DELETE, "/_mock/calls", None)
            .await
            .map(|_| ())
    }

    /// `POST /_mock/reset`: no script, no calls.
    pub async fn reset(&self) -> Result<()> {
        self.control(reqwest::Method::POST, "/_mock/reset", None)
            .await
            .map(|_| ())
    }
}
