use super::error::AdapterError;
use super::request::to_messages_request;
use super::response::from_messages_response;
use super::stream::StreamTranslator;
use serde_json::{json, Value};

use super::request::OPENING_USER_TURN;
use crate::wire::sse::Parser;
use ai_router_contract::failure::ErrorClass;

fn req(body: Value) -> Value {
    to_messages_request(&body, "claude-sonnet-5-5", 4096).unwrap()
}

fn err(body: Value) -> AdapterError {
    to_messages_request(&body, "claude-sonnet-5-5", 4096).unwrap_err()
}

#[test]
fn minimal_request_gets_model_default_max_tokens_and_blocks() {
    let out = req(json!({ "model": "smart", "messages": [{ "role": "user", "content": "Hi" }] }));
    assert_eq!(
        out,
        json!({
            "model": "claude-sonnet-5-5",
            "max_tokens": 4096,
            "messages": [{ "role": "user", "content": [{ "type": "text", "text": "Hi" }] }],
        })
    );
}

#[test]
fn system_and_developer_messages_join_into_system() {
    let out = req(json!({ "messages": [
        { "role": "system", "content": "Be brief." },
        { "role": "developer", "content": [{ "type": "text", "text": "Answer in French." }] },
        { "role": "user", "content": "Hi" },
        { "role": "system", "content": "Never apologise." },
    ]}));
    assert_eq!(
        out["system"],
        "Be brief.\n\nAnswer in French.\n\nNever apologise."
    );
    assert_eq!(out["messages"].as_array().unwrap().len(), 1);
}

#[test]
fn history_is_merged_into_alternating_turns_starting_with_user() {
    let out = req(json!({ "messages": [
        { "role": "assistant", "content": "Hello! How can I help?" },
        { "role": "user", "content": "One" },
        { "role": "user", "content": [{ "type": "text", "text": "Two" }] },
        { "role": "assistant", "content": "A" },
        { "role": "assistant", "content": [{ "type": "text", "text": "B" }] },
        { "role": "user", "content": "Three" },
    ]}));
    let turns = out["messages"].as_array().unwrap();
    let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    assert_eq!(turns[0]["content"][0]["text"], OPENING_USER_TURN);
    assert_eq!(
        turns[2]["content"],
        json!([{ "type": "text", "text": "One" }, { "type": "text", "text": "Two" }])
    );
    assert_eq!(turns[3]["content"].as_array().unwrap().len(), 2);
}

#[test]
fn system_only_request_still_has_a_user_turn() {
    let out = req(json!({ "messages": [{ "role": "system", "content": "Say hi." }] }));
    assert_eq!(out["system"], "Say hi.");
    assert_eq!(out["messages"][0]["role"], "user");
}

#[test]
fn final_assistant_prefill_loses_trailing_whitespace() {
    let out = req(json!({ "messages": [
        { "role": "user", "content": "Give JSON" },
        { "role": "assistant", "content": "{\n  " },
    ]}));
    assert_eq!(out["messages"][1]["content"][0]["text"], "{");
}

#[test]
fn images_data_and_http_urls() {
    let out = req(json!({ "messages": [{ "role": "user", "content": [
        { "type": "text", "text": "What is in these?" },
        { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBORw0KGgo=" } },
        { "type": "image_url", "image_url": { "url": "https://example.com/cat.jpg", "detail": "high" } },
    ]}]}));
    assert_eq!(
        out["messages"][0]["content"],
        json!([
            { "type": "text", "text": "What is in these?" },
            { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" } },
            { "type": "image", "source": { "type": "url", "url": "https://example.com/cat.jpg" } },
        ])
    );
    let e = err(json!({ "messages": [{ "role": "user", "content": [
        { "type": "image_url", "image_url": { "url": "ftp://example.com/cat.jpg" } },
    ]}]}));
    assert_eq!(e.param, Some("messages"));
    let e = err(json!({ "messages": [{ "role": "user", "content": [
        { "type": "image_url", "image_url": { "url": "data:image/png,rawbytes" } },
    ]}]}));
    assert!(e.message.contains("base64"), "{e}");
    let e = err(json!({ "messages": [{ "role": "user", "content": [
        { "type": "input_audio", "input_audio": { "data": "", "format": "wav" } },
    ]}]}));
    assert!(e.message.contains("input_audio"), "{e}");
}

#[test]
fn tools_and_tool_choice() {
    let tools = json!([
        { "type": "function", "function": {
            "name": "get_weather", "description": "Weather for a city",
            "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }
        }},
        { "type": "function", "function": { "name": "now" } },
    ]);
    let base = |choice: Value, parallel: Value| {
        req(json!({
            "messages": [{ "role": "user", "content": "Weather in Paris?" }],
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
        }))
    };
    let out = base(Value::Null, Value::Null);
    assert_eq!(
        out["tools"],
        json!([
            { "name": "get_weather", "description": "Weather for a city",
              "input_schema": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } },
            { "name": "now", "input_schema": { "type": "object", "properties": {} } },
        ])
    );
    assert_eq!(out["tool_choice"], json!({ "type": "auto" }));
    assert_eq!(
        base(json!("auto"), Value::Null)["tool_choice"],
        json!({ "type": "auto" })
    );
    assert_eq!(
        base(json!("none"), Value::Null)["tool_choice"],
        json!({ "type": "none" })
    );
    assert_eq!(
        base(json!("required"), Value::Null)["tool_choice"],
        json!({ "type": "any" })
    );
    assert_eq!(
        base(
            json!({ "type": "function", "function": { "name": "now" } }),
            json!(false)
        )["tool_choice"],
        json!({ "type": "tool", "name": "now", "disable_parallel_tool_use": true })
    );
    assert_eq!(
        base(Value::Null, json!(false))["tool_choice"],
        json!({ "type": "auto", "disable_parallel_tool_use": true })
    );
    assert_eq!(
        base(json!("none"), json!(false))["tool_choice"],
        json!({ "type": "none" })
    );
    assert_eq!(
        base(Value::Null, json!(true))["tool_choice"],
        json!({ "type": "auto" })
    );
    let e = to_messages_request(
        &json!({ "messages": [], "tools": tools, "tool_choice": "sometimes" }),
        "m",
        1,
    )
    .unwrap_err();
    assert_eq!(e.param, Some("tool_choice"));
    let e = err(json!({ "messages": [], "tools": [{ "type": "retrieval" }] }));
    assert_eq!(e.param, Some("tools"));
    // No tools, no tool_choice.
    let out =
        req(json!({ "messages": [{ "role": "user", "content": "x" }], "tool_choice": "auto" }));
    assert!(out.get("tools").is_none() && out.get("tool_choice").is_none());
}

#[test]
fn tool_calls_and_results_round_trip_the_history() {
    let out = req(json!({ "messages": [
        { "role": "user", "content": "Weather in Paris and Rome?" },
        { "role": "assistant", "content": null, "tool_calls": [
            { "id": "toolu_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
            { "id": "toolu_2", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Rome\"}" } },
        ]},
        { "role": "tool", "tool_call_id": "toolu_1", "content": "18C" },
        { "role": "tool", "tool_call_id": "toolu_2", "content": [{ "type": "text", "text": "24C" }] },
        { "role": "user", "content": "Which is warmer?" },
    ]}));
    assert_eq!(
        out["messages"],
        json!([
            { "role": "user", "content": [{ "type": "text", "text": "Weather in Paris and Rome?" }] },
            { "role": "assistant", "content": [
                { "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "city": "Paris" } },
                { "type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": { "city": "Rome" } },
            ]},
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "toolu_1", "content": "18C" },
                { "type": "tool_result", "tool_use_id": "toolu_2", "content": [{ "type": "text", "text": "24C" }] },
                { "type": "text", "text": "Which is warmer?" },
            ]},
        ])
    );
}

#[test]
fn tool_results_come_first_in_a_merged_user_turn() {
    let out = req(json!({ "messages": [
        { "role": "user", "content": "Go" },
        { "role": "assistant", "content": "Calling.", "tool_calls": [
            { "id": "t1", "type": "function", "function": { "name": "now", "arguments": "" } },
        ]},
        { "role": "user", "content": "(also, be quick)" },
        { "role": "tool", "tool_call_id": "t1", "content": "noon" },
    ]}));
    let turns = out["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    assert_eq!(
        turns[1]["content"][0],
        json!({ "type": "text", "text": "Calling." })
    );
    assert_eq!(turns[1]["content"][1]["input"], json!({}));
    assert_eq!(turns[2]["content"][0]["type"], "tool_result");
    assert_eq!(turns[2]["content"][1]["type"], "text");
}

#[test]
fn invalid_tool_arguments_are_refused() {
    let bad = |arguments: &str| {
        err(json!({ "messages": [
            { "role": "user", "content": "Go" },
            { "role": "assistant", "tool_calls": [
                { "id": "t1", "type": "function", "function": { "name": "now", "arguments": arguments } },
            ]},
        ]}))
    };
    let e = bad("{\"city\":");
    assert_eq!(e.param, Some("messages"));
    assert!(e.message.contains("not valid JSON"), "{e}");
    assert!(bad("[1,2]").message.contains("JSON object"));
    let e = err(json!({ "messages": [{ "role": "tool", "content": "x" }] }));
    assert!(e.message.contains("tool_call_id"), "{e}");
}

#[test]
fn response_format_becomes_a_system_instruction() {
    let out = req(json!({
        "messages": [{ "role": "system", "content": "You extract data." }, { "role": "user", "content": "x" }],
        "response_format": { "type": "json_object" },
    }));
    let system = out["system"].as_str().unwrap();
    assert!(system.starts_with("You extract data.\n\n"));
    assert!(system.contains("single JSON object"));

    let schema = json!({ "type": "object", "properties": { "name": { "type": "string" } }, "required": ["name"] });
    let out = req(json!({
        "messages": [{ "role": "user", "content": "x" }],
        "response_format": { "type": "json_schema", "json_schema": { "name": "person", "schema": schema, "strict": true } },
    }));
    let system = out["system"].as_str().unwrap();
    assert!(system.contains("single JSON object"));
    assert!(system.contains(&schema.to_string()));

    let out = req(
        json!({ "messages": [{ "role": "user", "content": "x" }], "response_format": { "type": "text" } }),
    );
    assert!(out.get("system").is_none());
    let e = err(json!({ "messages": [], "response_format": { "type": "yaml" } }));
    assert_eq!(e.param, Some("response_format"));
}

#[test]
fn sampling_limits_stream_and_user() {
    let out = req(json!({
        "messages": [{ "role": "user", "content": "x" }],
        "stop": "END", "temperature": 1.7, "top_p": 0.9, "max_tokens": 100,
        "stream": true, "stream_options": { "include_usage": true }, "user": "user-42",
        "seed": 7, "presence_penalty": 0.1,
    }));
    assert_eq!(out["stop_sequences"], json!(["END"]));
    assert_eq!(out["temperature"], json!(1.0));
    assert_eq!(out["top_p"], json!(0.9));
    assert_eq!(out["max_tokens"], json!(100));
    assert_eq!(out["stream"], json!(true));
    assert_eq!(out["metadata"], json!({ "user_id": "user-42" }));
    assert!(out.get("seed").is_none() && out.get("stream_options").is_none());

    let out = req(json!({
        "messages": [{ "role": "user", "content": "x" }],
        "stop": ["a", " ", "b"], "temperature": 0.3, "max_tokens": 100,
        "max_completion_tokens": 50, "stream": false,
    }));
    assert_eq!(out["stop_sequences"], json!(["a", "b"]));
    assert_eq!(out["temperature"], json!(0.3));
    assert_eq!(out["max_tokens"], json!(50));
    assert!(out.get("stream").is_none());
    assert_eq!(
        err(json!({ "messages": [], "max_tokens": 0 })).param,
        Some("max_tokens")
    );
    assert_eq!(
        err(json!({ "messages": [], "temperature": "hot" })).param,
        Some("temperature")
    );
    assert_eq!(
        err(json!({ "messages": [], "stop": 3 })).param,
        Some("stop")
    );
}

#[test]
fn unsupported_fields_are_refused_with_their_param() {
    let e = err(json!({ "messages": [{ "role": "user", "content": "x" }], "n": 2 }));
    assert_eq!(e.param, Some("n"));
    assert!(e.message.contains("one choice"), "{e}");
    assert!(to_messages_request(&json!({ "messages": [], "n": 1 }), "m", 1).is_ok());
    assert_eq!(
        err(json!({ "messages": [], "logprobs": true })).param,
        Some("logprobs")
    );
    assert!(to_messages_request(&json!({ "messages": [], "logprobs": false }), "m", 1).is_ok());
    assert_eq!(
        err(json!({ "messages": [], "top_logprobs": 3 })).param,
        Some("top_logprobs")
    );
    assert_eq!(err(json!({ "messages": "hi" })).param, Some("messages"));
    assert_eq!(
        err(json!({ "messages": [{ "role": "function", "content": "x" }] })).param,
        Some("messages")
    );
    assert_eq!(err(json!([1])).param, None);
}

#[test]
fn text_response() {
    let resp = json!({
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [
            { "type": "text", "text": "Hello! " },
            { "type": "text", "text": "How can I help?" },
        ],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": { "input_tokens": 12, "cache_creation_input_tokens": 3, "cache_read_input_tokens": 5, "output_tokens": 9 }
    });
    assert_eq!(
        from_messages_response(&resp, 1_700_000_000),
        json!({
            "id": "chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "claude-sonnet-5-5",
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": "Hello! How can I help?" },
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": { "prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
                       "prompt_tokens_details": { "cached_tokens": 5 } },
        })
    );
}

#[test]
fn tool_use_response() {
    let resp = json!({
        "id": "msg_02",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-5",
        "content": [
            { "type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather",
              "input": { "city": "Paris", "unit": "celsius" } },
        ],
        "stop_reason": "tool_use",
        "usage": { "input_tokens": 300, "output_tokens": 40 }
    });
    let out = from_messages_response(&resp, 1);
    let message = &out["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
    let call = &message["tool_calls"][0];
    assert_eq!(call["id"], "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({ "city": "Paris", "unit": "celsius" }));
    assert_eq!(out["usage"]["total_tokens"], 340);

    // Text plus a tool call keeps the text.
    let mut with_text = resp.clone();
    with_text["content"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({ "type": "text", "text": "Let me check." }));
    let out = from_messages_response(&with_text, 1);
    assert_eq!(out["choices"][0]["message"]["content"], "Let me check.");
    assert_eq!(
        out["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // The history built from the answer translates back to the same tool_use block.
    let history = json!({ "messages": [{ "role": "user", "content": "Weather?" }, out["choices"][0]["message"]] });
    let back = req(history);
    assert_eq!(back["messages"][1]["content"][1], resp["content"][0]);
}

#[test]
fn stop_reasons() {
    for (anthropic, openai) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ] {
        let out = from_messages_response(
            &json!({ "id": "m", "content": [], "stop_reason": anthropic }),
            0,
        );
        assert_eq!(out["choices"][0]["finish_reason"], openai, "{anthropic}");
        assert_eq!(out["choices"][0]["message"]["content"], "");
    }
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// A realistic Messages stream: text, then a tool call whose input arrives in pieces.
fn anthropic_stream() -> String {
    let mut s = String::new();
    s += &event(
        "message_start",
        json!({ "type": "message_start", "message": {
        "id": "msg_01ABC", "type": "message", "role": "assistant", "model": "claude-sonnet-5-5",
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": { "input_tokens": 472, "cache_read_input_tokens": 100, "output_tokens": 2 } } }),
    );
    s += &event(
        "content_block_start",
        json!({ "type": "content_block_start", "index": 0,
        "content_block": { "type": "text", "text": "" } }),
    );
    s += &event("ping", json!({ "type": "ping" }));
    for piece in ["Okay", ", let's check the weather ", "in Zürich — ☀️?"] {
        s += &event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0,
            "delta": { "type": "text_delta", "text": piece } }),
        );
    }
    s += &event(
        "content_block_stop",
        json!({ "type": "content_block_stop", "index": 0 }),
    );
    s += &event(
        "content_block_start",
        json!({ "type": "content_block_start", "index": 1,
        "content_block": { "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {} } }),
    );
    for piece in [
        "",
        "{\"location\":",
        " \"Zürich, CH\"",
        ", \"unit\": \"cel",
        "sius\"}",
    ] {
        s += &event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 1,
            "delta": { "type": "input_json_delta", "partial_json": piece } }),
        );
    }
    s += &event(
        "content_block_stop",
        json!({ "type": "content_block_stop", "index": 1 }),
    );
    s += &event(
        "message_delta",
        json!({ "type": "message_delta",
        "delta": { "stop_reason": "tool_use", "stop_sequence": null }, "usage": { "output_tokens": 89 } }),
    );
    s += &event("message_stop", json!({ "type": "message_stop" }));
    s
}

fn translate(input: &[u8], split: usize) -> (Vec<u8>, StreamTranslator) {
    let mut parser = Parser::new();
    let mut t = StreamTranslator::new(1_700_000_000, None);
    let mut out = Vec::new();
    for part in [&input[..split], &input[split..]] {
        for e in parser.feed(part) {
            out.extend(t.feed(&e, 0).unwrap());
        }
    }
    assert!(parser.pending().is_empty());
    (out, t)
}

#[test]
fn stream_translation_is_the_same_at_every_split() {
    let input = anthropic_stream();
    let (whole, t) = translate(input.as_bytes(), input.len());
    assert!(t.finished());
    for split in 0..=input.len() {
        let (out, t) = translate(input.as_bytes(), split);
        assert_eq!(out, whole, "split {split}");
        assert!(t.finished());
    }
}

#[test]
fn stream_output_is_valid_openai_chunks() {
    let input = anthropic_stream();
    let (out, _) = translate(input.as_bytes(), 0);
    let events = Parser::new().feed(&out);
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    let mut content = String::new();
    let mut arguments = String::new();
    let mut tool_ids = Vec::new();
    let mut finish = Vec::new();
    for c in &chunks {
        assert_eq!(c["id"], "chatcmpl-msg_01ABC");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["created"], 1_700_000_000);
        assert_eq!(c["model"], "claude-sonnet-5-5");
        for choice in c["choices"].as_array().unwrap() {
            assert_eq!(choice["index"], 0);
            let delta = &choice["delta"];
            content.push_str(delta["content"].as_str().unwrap_or(""));
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0);
                if let Some(id) = call["id"].as_str() {
                    tool_ids.push(id.to_string());
                    assert_eq!(call["type"], "function");
                    assert_eq!(call["function"]["name"], "get_weather");
                }
                arguments.push_str(call["function"]["arguments"].as_str().unwrap());
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish.push(f.to_string());
            }
        }
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({ "role": "assistant", "content": "" })
    );
    assert_eq!(content, "Okay, let's check the weather in Zürich — ☀️?");
    assert_eq!(tool_ids, ["toolu_01T1x1fJ34qAmk2tNTrN7Up6"]);
    assert_eq!(
        arguments,
        "{\"location\": \"Zürich, CH\", \"unit\": \"celsius\"}"
    );
    let args: Value = serde_json::from_str(&arguments).unwrap();
    assert_eq!(args["unit"], "celsius");
    assert_eq!(finish, ["tool_calls"]);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 572);
    assert_eq!(usage["usage"]["completion_tokens"], 89);
    assert_eq!(usage["usage"]["total_tokens"], 661);
}

#[test]
fn translated_stream_passes_the_gate() {
    use crate::attempt::stream::{Gate, Step};
    let input = anthropic_stream();
    let (out, _) = translate(input.as_bytes(), 0);
    let mut gate = Gate::new("anthropic", false);
    let forwarded = match gate.feed(&out, 0) {
        Step::Release(b) => b,
        other => panic!("{other:?}"),
    };
    assert!(gate.completed());
    assert_eq!(gate.usage.unwrap().completion_tokens, 89);
    assert_eq!(gate.model.as_deref(), Some("claude-sonnet-5-5"));
    let text = String::from_utf8(forwarded.into_bytes()).unwrap();
    assert!(!text.contains("\"usage\""));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[test]
fn several_tool_calls_get_their_own_indexes() {
    let mut t = StreamTranslator::new(0, None);
    let mut parser = Parser::new();
    let mut s = String::new();
    for (block, id) in [(0, "toolu_a"), (1, "toolu_b")] {
        s += &event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": block,
            "content_block": { "type": "tool_use", "id": id, "name": "now", "input": {} } }),
        );
    }
    s += &event(
        "content_block_delta",
        json!({ "type": "content_block_delta", "index": 1,
        "delta": { "type": "input_json_delta", "partial_json": "{}" } }),
    );
    let mut calls = Vec::new();
    for e in parser.feed(s.as_bytes()) {
        let out = t.feed(&e, 0).unwrap();
        for c in Parser::new().feed(&out) {
            let v: Value = serde_json::from_str(&c.data).unwrap();
            calls.push(v["choices"][0]["delta"]["tool_calls"][0].clone());
        }
    }
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[1]["index"], 1);
    assert_eq!(
        calls[2],
        json!({ "index": 1, "function": { "arguments": "{}" } })
    );
    assert!(!t.finished());
}

#[test]
fn quiet_events_produce_nothing() {
    let mut t = StreamTranslator::new(0, None);
    for raw in [
        event("ping", json!({ "type": "ping" })),
        event(
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        ),
        event("something_new", json!({ "type": "something_new" })),
        ": keep-alive\n\n".to_string(),
    ] {
        for e in Parser::new().feed(raw.as_bytes()) {
            assert!(t.feed(&e, 0).unwrap().is_empty(), "{raw}");
        }
    }
}

#[test]
fn error_event_mid_stream_is_a_classified_failure() {
    let mut s = anthropic_stream();
    let cut = s.find("event: content_block_stop").unwrap();
    s.truncate(cut);
    s += "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let mut t = StreamTranslator::new(0, None);
    let mut produced = 0;
    let mut failure = None;
    for e in Parser::new().feed(s.as_bytes()) {
        match t.feed(&e, 1_000) {
            Ok(b) => produced += b.len(),
            Err(f) => failure = Some(f),
        }
    }
    assert!(produced > 0);
    let failure = failure.unwrap();
    assert_eq!(failure.class, ErrorClass::Transient);
    assert_eq!(failure.provider_code.as_deref(), Some("overloaded_error"));
    assert_eq!(failure.message, "Overloaded");
    assert!(!t.finished());

    let rate = Parser::new().feed(
        b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"slow\"}}\n\n",
    );
    assert_eq!(
        StreamTranslator::new(0, None)
            .feed(&rate[0], 0)
            .unwrap_err()
            .class,
        ErrorClass::RateLimit
    );
    let garbage = Parser::new().feed(b"event: content_block_delta\ndata: {oops\n\n");
    assert_eq!(
        StreamTranslator::new(0, None)
            .feed(&garbage[0], 0)
            .unwrap_err()
            .class,
        ErrorClass::Stream
    );
}

#[test]
fn adapter_error_displays_its_param() {
    let e = AdapterError::new("n", "one choice only");
    assert_eq!(e.to_string(), "one choice only (param: n)");
}
