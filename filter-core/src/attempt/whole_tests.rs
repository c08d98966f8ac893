use rand::{Rng, RngCore, SeedableRng};
use serde_json::Value;

use super::{read, Facts};
use crate::protocols::context::estimate_answer_tokens;
use crate::vocab::usage_of;

/// The facts as the verdict found them in a `Value`: the reference this pass must agree with.
fn from_value(body: &[u8]) -> Facts {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    Facts {
        object: parsed.is_object(),
        error: parsed.get("error").is_some_and(|e| !e.is_null()),
        answer_tokens: estimate_answer_tokens(&parsed),
        usage: usage_of(&parsed),
    }
}

#[test]
fn a_chat_answer_is_read_without_a_value_as_the_value_reads_it() {
    let body = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
        "choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you?",
        "refusal":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f",
        "arguments":"{\"a\":1}"}}]},"logprobs":null,"finish_reason":"stop"}],
        "usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19,
        "prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0}},"system_fingerprint":"fp"}"#;
    let facts = read(body).expect("a plain chat answer is read here");
    assert_eq!(facts, from_value(body));
    assert!(facts.object && !facts.error);
    assert_eq!(facts.answer_tokens, 7 + 2);
    let usage = facts.usage.expect("usage");
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens
        ),
        (12, 7, 4)
    );
}

#[test]
fn an_error_a_null_usage_and_odd_shapes_are_read_as_the_value_reads_them() {
    for body in [
        &br#"{"error":{"message":"slow down","type":"rate_limit"}}"#[..],
        br#"{"error":null,"usage":null,"choices":[]}"#,
        br#"{"usage":5}"#,
        br#"{"usage":"many","content":"x"}"#,
        br#"{"usage":{"prompt_tokens":-3,"completion_tokens":2.0,"prompt_tokens_details":[1]}}"#,
        br#"{"usage":{"prompt_tokens":18446744073709551615,"prompt_tokens_details":{"cached_tokens":"4"}}}"#,
        br#"[{"content":"a list"},"text"]"#,
        br#""content""#,
        br#"42"#,
        br#"null"#,
    ] {
        let facts = read(body).expect("read here");
        assert_eq!(facts, from_value(body), "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn what_a_value_would_read_otherwise_is_left_to_the_value() {
    for body in [
        // A repeated key: the `Value` keeps the last.
        &br#"{"usage":{"prompt_tokens":1},"usage":null}"#[..],
        br#"{"choices":[{"message":{"content":"a","content":"bb"}}]}"#,
        // A key with an escape.
        br#"{"con\u0074ent":"x"}"#,
        // Not JSON, or more than one value.
        b"<html>bad gateway</html>",
        b"",
        br#"{"a":1} {"b":2}"#,
        br#"{"a":1"#,
    ] {
        assert_eq!(read(body), None, "{}", String::from_utf8_lossy(body));
    }
}

const NAMES: [&str; 16] = [
    "content",
    "text",
    "delta",
    "arguments",
    "refusal",
    "reasoning",
    "reasoning_content",
    "partial_json",
    "usage",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "message",
    "choices",
];

fn string(rng: &mut dyn RngCore) -> String {
    const PIECES: [&str; 9] = [
        "a", "hello ", "日本", "\\n", "\\\"", "\\u00e9", "é", "xyz", " ",
    ];
    let n = rng.random_range(0..6);
    let text: String = (0..n)
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect();
    format!("\"{text}\"")
}

fn number(rng: &mut dyn RngCore) -> String {
    match rng.random_range(0..6) {
        0 => "-7".into(),
        1 => "2.5".into(),
        2 => "1e3".into(),
        3 => "18446744073709551616".into(),
        _ => rng.random_range(0..100_000u64).to_string(),
    }
}

fn value(rng: &mut dyn RngCore, depth: u32) -> String {
    let pick = if depth > 3 {
        rng.random_range(0..5)
    } else {
        rng.random_range(0..7)
    };
    match pick {
        0 => "null".into(),
        1 => "true".into(),
        2 => number(rng),
        3 | 4 => string(rng),
        5 => {
            let n = rng.random_range(0..4);
            let items: Vec<String> = (0..n).map(|_| value(rng, depth + 1)).collect();
            format!("[{}]", items.join(","))
        }
        _ => object(rng, depth + 1),
    }
}

fn object(rng: &mut dyn RngCore, depth: u32) -> String {
    let n = rng.random_range(0..6);
    let mut fields = Vec::new();
    for _ in 0..n {
        // Now and then a key with an escape, or the same key twice.
        let name = match rng.random_range(0..40) {
            0 => "con\\u0074ent".to_string(),
            _ => NAMES[rng.random_range(0..NAMES.len())].to_string(),
        };
        fields.push(format!("\"{name}\":{}", value(rng, depth)));
    }
    format!("{{{}}}", fields.join(","))
}

#[test]
fn random_answers_are_read_without_a_value_exactly_as_the_value_reads_them() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    let (mut read_here, mut left) = (0, 0);
    for i in 0..20_000 {
        let mut body = if i % 3 == 0 {
            value(&mut rng, 0)
        } else {
            object(&mut rng, 0)
        }
        .into_bytes();
        // Now and then a body cut short (in a character, too), or with something after it.
        match rng.random_range(0..30) {
            0 => body.truncate(body.len() / 2),
            1 => body.extend_from_slice(b" x"),
            2 => body.extend_from_slice(b"  \n"),
            _ => {}
        }
        match read(&body) {
            Some(facts) => {
                read_here += 1;
                let text = String::from_utf8_lossy(&body);
                assert_eq!(facts, from_value(&body), "{text}");
            }
            None => left += 1,
        }
    }
    // Most are read here: the repeats and escapes the generator makes are the exception.
    assert!(read_here > 12_000, "read here {read_here}, left {left}");
    assert!(left > 500, "the generator made no answer to leave: {left}");
}
