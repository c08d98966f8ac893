use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::read_plain;
use crate::attempt::stream::has_token;
use crate::protocols::context::estimate_answer_tokens;
use crate::vocab::usage_of;

/// What the stream gate read from a chunk through a `Value`, for a chunk it would keep: the
/// model, the estimated tokens of its choices, a finish, a token. `None` for an event the gate
/// does not keep as it came (malformed, an error, a usage).
fn read_as_value(data: &str) -> Option<(Option<String>, u64, bool, bool)> {
    let value: Value = serde_json::from_str(data).ok()?;
    if value.get("error").is_some() || usage_of(&value).is_some() {
        return None;
    }
    let model = value
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string);
    let tokens = value.get("choices").map_or(0, estimate_answer_tokens);
    let finished = value
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.get("finish_reason").is_some_and(|f| !f.is_null()))
        });
    Some((model, tokens, finished, has_token(&value)))
}

fn pick<'a>(rng: &mut impl Rng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

const VALUES: [&str; 16] = [
    "null",
    "\"\"",
    "\"Hello there\"",
    "\"caf\\u00e9 \\\"quoted\\\" \\n\"",
    "\"日本語のテキスト\"",
    "\"stop\"",
    "0",
    "7",
    "-1",
    "1.5",
    "1e400",
    "true",
    "[]",
    "{}",
    "[{\"content\":\"inner text\"}]",
    "{\"text\":\"nested\",\"arguments\":\"{}\"}",
];

fn object(
    rng: &mut impl Rng,
    keys: &[&str],
    value: &mut dyn FnMut(&mut dyn rand::RngCore, &str) -> String,
) -> String {
    let fields: Vec<String> = (0..rng.random_range(0..5))
        .map(|_| {
            let key = pick(rng, keys);
            format!("\"{key}\":{}", value(rng, key))
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

fn delta(rng: &mut dyn rand::RngCore) -> String {
    let keys = [
        "role",
        "content",
        "content",
        "refusal",
        "tool_calls",
        "reasoning_content",
        "ro\\u006ce",
    ];
    let mut rng = rng;
    object(&mut rng, &keys, &mut |rng, key| {
        let mut rng = rng;
        if key == "role" && rng.random_bool(0.7) {
            "\"assistant\"".to_string()
        } else {
            pick(&mut rng, &VALUES).to_string()
        }
    })
}

fn choice(rng: &mut dyn rand::RngCore) -> String {
    let keys = [
        "index",
        "delta",
        "delta",
        "finish_reason",
        "logprobs",
        "extra",
    ];
    let mut rng = rng;
    object(&mut rng, &keys, &mut |rng, key| {
        let mut rng = rng;
        match key {
            "delta" if rng.random_bool(0.8) => delta(rng),
            "index" if rng.random_bool(0.7) => "0".to_string(),
            _ => pick(&mut rng, &VALUES).to_string(),
        }
    })
}

fn chunk(rng: &mut impl Rng) -> String {
    let keys = [
        "id",
        "object",
        "created",
        "model",
        "model",
        "choices",
        "choices",
        "choices",
        "usage",
        "error",
        "system_fingerprint",
        "x",
    ];
    let text = object(rng, &keys, &mut |rng, key| {
        let mut rng = rng;
        match key {
            "choices" if rng.random_bool(0.8) => {
                let items: Vec<String> = (0..rng.random_range(0..3)).map(|_| choice(rng)).collect();
                format!("[{}]", items.join(","))
            }
            "model" if rng.random_bool(0.6) => "\"gpt-4o-mini\"".to_string(),
            "usage" if rng.random_bool(0.5) => {
                "{\"prompt_tokens\":3,\"completion_tokens\":5}".to_string()
            }
            _ => pick(&mut rng, &VALUES).to_string(),
        }
    });
    match rng.random_range(0..10) {
        0 => {
            let mut cut = rng.random_range(0..=text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text[..cut].to_string()
        }
        1 => format!("{text} x"),
        _ => text,
    }
}

#[test]
fn a_chunk_read_without_a_value_reads_as_the_value_would() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let mut plain = 0;
    for _ in 0..20_000 {
        let data = chunk(&mut rng);
        let Some(read) = read_plain(&data) else {
            // Read whole, through a `Value`, as before.
            continue;
        };
        plain += 1;
        let got = (
            read.model.map(|m| m.into_owned()),
            read.answer_tokens,
            read.finished,
            read.token,
        );
        assert_eq!(Some(got), read_as_value(&data), "{data}");
    }
    assert!(plain > 2_000, "only {plain} chunks read without a value");
}

#[test]
fn the_common_chunks_are_read_without_a_value_and_the_rest_whole() {
    let role = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#;
    let content =
        r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"Hel\"lo"},"finish_reason":null}]}"#;
    let finish = r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
    for data in [role, content, finish] {
        let read = read_plain(data).expect(data);
        let value = read_as_value(data).unwrap();
        assert_eq!(
            (
                read.model.map(|m| m.into_owned()),
                read.answer_tokens,
                read.finished,
                read.token
            ),
            value
        );
    }
    assert!(!read_plain(role).unwrap().token);
    assert!(read_plain(content).unwrap().token);
    for whole in [
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#,
        r#"{"error":{"message":"overloaded"}}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
        r#"{"choices":[{"delta":{"content":"a"}}],"x":1e400}"#,
        r#"{"choices":"#,
    ] {
        assert!(read_plain(whole).is_none(), "{whole}");
    }
}
