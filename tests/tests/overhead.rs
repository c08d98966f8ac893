//! What the gateway adds to a call, as users see it: the `x-ai-router-overhead-ms` header a
//! client asks for with `x-ai-router-overhead: 1`, and the `ai_router_overhead_seconds`
//! histogram on the control plane's `/metrics`, through a real Envoy whose providers (the
//! mock) take a known time to answer. The overhead is the gateway's time less the providers':
//! far below that time, never negative, and labelled by the client's protocol.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{get_text, poll, script, standard_pool, Gateway, Reply};
use serde_json::json;

/// How long the mock providers take before their answer's headers, and (streams) before each
/// content chunk: a stream's first token comes `2 × DELAY_MS` after its send.
const DELAY_MS: u64 = 300;
/// An overhead this large would mean the providers' time was not taken out (or only part of
/// it): it is half the delay.
const FAR_BELOW_MS: f64 = DELAY_MS as f64 / 2.0;

const ASK: (&str, &str) = ("x-ai-router-overhead", "1");
const HEADER: &str = "x-ai-router-overhead-ms";

/// The standard pool with p1 of kind anthropic (`chat` is translated to Anthropic's Messages
/// API); p2 (`backup`) stays openai-compatible.
fn pool(p1: &str, p2: &str) -> String {
    standard_pool(p1, p2).replacen("kind: openai-compatible", "kind: anthropic", 1)
}

/// The overhead header's value (ms), checked plausible: three decimals, at least 0, far below
/// the providers' time.
fn overhead_ms(r: &Reply) -> f64 {
    let value = r
        .header(HEADER)
        .unwrap_or_else(|| panic!("no {HEADER} on an answer that asked for it: {r}"));
    let (_, decimals) = value.split_once('.').unwrap_or(("", ""));
    assert_eq!(decimals.len(), 3, "{HEADER}: {value}");
    let ms: f64 = value
        .parse()
        .unwrap_or_else(|_| panic!("{HEADER}: {value}"));
    assert!(
        (0.0..FAR_BELOW_MS).contains(&ms),
        "{HEADER}: {ms} ms, the providers took {DELAY_MS} ms or more: {r}"
    );
    eprintln!("{HEADER}: {value}");
    ms
}

/// A sample of the control plane's `/metrics` text (0 when the series is absent).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overhead_is_in_a_header_on_request_and_in_the_histogram() {
    let gw = Gateway::start_with("overhead", pool)
        .await
        .expect("fixture");
    let reply = json!({
        "text": "ok then",
        "latencyMs": DELAY_MS,
        "stream": { "chunks": ["ok", " then"], "delayMs": DELAY_MS },
    });
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![reply.clone()])]))
            .await
            .unwrap();
    }
    let key = Some(gw.virtual_key.as_str());
    let post = reqwest::Method::POST;
    let chat = "/v1/chat/completions";
    let unary = json!({ "model": "backup", "messages": [{ "role": "user", "content": "hi" }] });

    // Not asked for: no header, and nothing else of it.
    let r = gw.client.chat_with(&unary, key).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(r.header(HEADER).is_none(), "not asked for: {r}");
    assert!(
        !r.headers.keys().any(|k| k.as_str().contains("overhead")),
        "{r}"
    );

    // Asked for, unary.
    let r = gw
        .client
        .request_with_headers(post.clone(), chat, key, Some(unary.to_string()), &[ASK])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    overhead_ms(&r);

    // Asked for, streamed: the provider held it until its first token (two delays).
    let streamed = json!({ "model": "backup", "stream": true, "messages": [{ "role": "user", "content": "hi" }] });
    let r = gw
        .client
        .request_with_headers(post.clone(), chat, key, Some(streamed.to_string()), &[ASK])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(
        r.header("content-type")
            .unwrap_or_default()
            .starts_with("text/event-stream"),
        "{r}"
    );
    assert!(r.text.contains("then"), "the whole stream: {r}");
    overhead_ms(&r);

    // An Anthropic client's call (Messages) on an OpenAI lane, translated both ways.
    let messages = json!({ "model": "backup", "max_tokens": 16, "messages": [{ "role": "user", "content": "hi" }] });
    let r = gw
        .client
        .request_with_headers(
            post.clone(),
            "/v1/messages",
            key,
            Some(messages.to_string()),
            &[ASK],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json["type"], "message", "{r}");
    overhead_ms(&r);

    // A chat call on the anthropic lane, translated to Messages and back.
    let translated = json!({ "model": "chat", "messages": [{ "role": "user", "content": "hi" }] });
    let r = gw
        .client
        .request_with_headers(post, chat, key, Some(translated.to_string()), &[ASK])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.header("x-ai-router-model").as_deref(), Some("m1"), "{r}");
    overhead_ms(&r);

    // The histogram, by the client's protocol: four chat calls (whether asked for or not,
    // translated or not) and one Messages call, each far below the providers' time.
    let url = format!("http://{}/metrics", gw.cp.http_addr());
    let chat_count = "ai_router_overhead_seconds_count{protocol=\"chat\",outcome=\"success\"}";
    let messages_count =
        "ai_router_overhead_seconds_count{protocol=\"messages\",outcome=\"success\"}";
    let text = poll(
        "the overhead histogram",
        Duration::from_secs(30),
        || async {
            let text = get_text(&url).await?;
            Ok(
                (sample(&text, chat_count) == 4.0 && sample(&text, messages_count) == 1.0)
                    .then_some(text),
            )
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gw.tails()));
    let under =
        "ai_router_overhead_seconds_bucket{protocol=\"chat\",outcome=\"success\",le=\"0.25\"}";
    assert_eq!(
        sample(&text, under),
        4.0,
        "every chat call under 250 ms:\n{text}"
    );
    let sum = sample(
        &text,
        "ai_router_overhead_seconds_sum{protocol=\"messages\",outcome=\"success\"}",
    );
    assert!(
        (0.0..FAR_BELOW_MS / 1000.0).contains(&sum),
        "seconds, far below the providers': {sum}"
    );
    gw.check_no_secrets_in_logs().unwrap();
}
