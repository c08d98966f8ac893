//! The Gemini API's paths: `/v1beta/models/{model}:{method}` and the model list.

/// A Gemini API call on the public listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST …/models/{model}:generateContent` or `:streamGenerateContent`.
    Generate { model: String, stream: bool },
    /// `POST …/models/{model}:countTokens`.
    CountTokens { model: String },
    /// `POST …/models/{model}:embedContent` or `:batchEmbedContents` (`batch`).
    Embed { model: String, batch: bool },
    /// `GET /v1beta/models` (`None`) or `GET /v1beta/models/{model}`.
    Models(Option<String>),
    /// A path of the Gemini API the gateway does not serve (answered 404/405 in its shape).
    Unserved,
}

/// Whether `path` (no query) belongs to the Gemini API: everything under `/v1beta/`, and the
/// model methods under `/v1/models/` (`POST /v1/models/{model}:generateContent`; the rest of
/// `/v1/models` is OpenAI's list).
pub fn is_gemini_path(path: &str) -> bool {
    path.starts_with("/v1beta/")
        || path == "/v1beta"
        || path
            .strip_prefix("/v1/models/")
            .is_some_and(|rest| rest.contains(':'))
}

/// Whether a request on `/v1/models` comes from a Google client (the genai SDKs list models
/// there): its key as `x-goog-api-key` or `?key=`, or its `x-goog-api-client` header.
pub fn google_client(goog_header: bool, query: &str) -> bool {
    goog_header || query.split('&').any(|p| p.starts_with("key="))
}

/// The call `method` and `path` (no query, no trailing slash) make, for a Gemini path (or
/// `/v1/models` asked by a Google client, [`google_client`]).
pub fn route(method: &str, path: &str) -> Route {
    let rest = path
        .strip_prefix("/v1beta/models")
        .or_else(|| path.strip_prefix("/v1/models"));
    let Some(rest) = rest else {
        return Route::Unserved;
    };
    let named = rest.strip_prefix('/').filter(|r| !r.is_empty());
    match (method, named) {
        ("GET", None) if rest.is_empty() => Route::Models(None),
        ("GET", Some(name)) if !name.contains(':') => Route::Models(Some(model_name(name))),
        ("POST", Some(name)) => match name.rsplit_once(':') {
            Some((model, "generateContent")) => Route::Generate {
                model: model_name(model),
                stream: false,
            },
            Some((model, "streamGenerateContent")) => Route::Generate {
                model: model_name(model),
                stream: true,
            },
            Some((model, "countTokens")) => Route::CountTokens {
                model: model_name(model),
            },
            Some((model, method @ ("embedContent" | "batchEmbedContents"))) => Route::Embed {
                model: model_name(model),
                batch: method == "batchEmbedContents",
            },
            _ => Route::Unserved,
        },
        _ => Route::Unserved,
    }
}

/// A model name from the path, percent-decoded (`openai%2Fgpt-4o` is `openai/gpt-4o`).
fn model_name(raw: &str) -> String {
    crate::wire::percent::percent_decode(raw).unwrap_or_else(|| raw.to_string())
}

/// The query without its `key` parameter (the virtual key, which goes no further than the
/// front stage), and that key.
pub fn take_query_key(query: &str) -> (String, Option<String>) {
    let mut key = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some(("key", value)) => {
                key = Some(model_name(value));
                false
            }
            _ => !pair.is_empty() && *pair != "key",
        })
        .collect();
    (kept.join("&"), key)
}

/// Whether the query asks for SSE (`alt=sse`); without it Google streams one JSON array.
pub fn wants_sse(query: &str) -> bool {
    query.split('&').any(|pair| pair == "alt=sse")
}
