//! How big a request is and how big a lane is: the token estimate the front stage cuts
//! candidates with (context windows, per-request caps, budgets), and the size a context-length
//! failure compares lanes by.

use ai_router_proto::v1::{Model, Provider};

/// Estimated tokens of a text, without a tokenizer: about four characters a token for
/// alphabetic scripts, and one token a character for CJK (Han, kana, Hangul), which tokenizers
/// split far finer. Over-estimating CJK is the safe side: a lane cut for a prompt that would
/// have fitted costs a fallback, a prompt sent past a window costs an attempt.
pub fn estimate_tokens(text: &str) -> u64 {
    let (dense, other) = count_characters(text, |_| 1);
    dense + other.div_ceil(4)
}

/// A text's characters, counted as (dense, other): an ASCII byte as `ascii` says (read byte by
/// byte: text is mostly ASCII, and decoding each character cost about forty instructions a
/// character), any other character one, dense when CJK.
fn count_characters(text: &str, ascii: impl Fn(u8) -> u64) -> (u64, u64) {
    let (mut dense, mut other) = (0u64, 0u64);
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        // Eight plain bytes at once: printable ASCII but `"` and `\`, one character each
        // whatever `ascii` says of the others (most of a prompt is such runs).
        if let Some(word) = bytes.get(i..i + 8) {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(word);
            if plain(u64::from_le_bytes(eight)) {
                other += 8;
                i += 8;
                continue;
            }
        }
        if b.is_ascii() {
            other += ascii(b);
            i += 1;
            continue;
        }
        // `i` is on a character's first byte: ASCII moves it by one, the others by their
        // length.
        let Some(c) = text.get(i..).and_then(|rest| rest.chars().next()) else {
            break;
        };
        if is_cjk(c) {
            dense += 1;
        } else {
            other += 1;
        }
        i += c.len_utf8();
    }
    (dense, other)
}

/// Whether each of the eight bytes of `word` is printable ASCII (0x20 to 0x7e), neither `"`
/// nor `\\`: a byte JSON writes as itself, and one character of a text.
fn plain(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `v` is zero: the classic test (exact once every byte is below 0x80).
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    if word & HIGH != 0 {
        return false;
    }
    // Below 0x20 (a control character), or 0x7f (DEL: `word + 0x01` carries into the high bit).
    let control = word.wrapping_sub(0x20 * ONES) & !word & HIGH != 0;
    let delete = word.wrapping_add(ONES) & HIGH != 0;
    !(control
        || delete
        || has_zero(word ^ (u64::from(b'"') * ONES))
        || has_zero(word ^ (u64::from(b'\\') * ONES)))
}

/// [`estimate_tokens`] of `value` as JSON (compact, as `serde_json` writes it), without writing
/// it: a request's messages are counted where they were parsed, whatever their size. The
/// characters are those of the written text: quotes, escapes, punctuation, keys, numbers.
pub fn estimate_json_tokens(value: &serde_json::Value) -> u64 {
    let mut count = Chars::default();
    count.value(value);
    count.dense + count.other.div_ceil(4)
}

/// The characters of written JSON, counted by density (see [`estimate_json_tokens`]).
#[derive(Default)]
struct Chars {
    dense: u64,
    other: u64,
}

impl Chars {
    fn value(&mut self, value: &serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::Null | Value::Bool(true) => self.other += 4,
            Value::Bool(false) => self.other += 5,
            Value::Number(n) => self.number(n),
            Value::String(text) => self.string(text),
            Value::Array(items) => {
                // The brackets and a comma between two items.
                self.other += 2 + items.len().saturating_sub(1) as u64;
                items.iter().for_each(|item| self.value(item));
            }
            Value::Object(fields) => {
                // The braces, a comma between two fields and each field's colon.
                self.other += 2 + fields.len().saturating_sub(1) as u64 + fields.len() as u64;
                for (name, item) in fields {
                    self.string(name);
                    self.value(item);
                }
            }
        }
    }

    /// A number's written length (ASCII), written into a counter, not a string.
    fn number(&mut self, n: &serde_json::Number) {
        struct Len(u64);
        impl std::fmt::Write for Len {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                self.0 += s.len() as u64;
                Ok(())
            }
        }
        let mut len = Len(0);
        let _ = std::fmt::Write::write_fmt(&mut len, format_args!("{n}"));
        self.other += len.0;
    }

    /// A string as `serde_json` writes it: its quotes, `\"`, `\\` and the short escapes of
    /// control characters in two characters, any other control character in six (`\u00XX`).
    /// A string's written characters: its quotes, an ASCII byte as [`ASCII_WRITTEN`] says, any
    /// other character one ([`count_characters`]).
    fn string(&mut self, text: &str) {
        let (dense, other) = count_characters(text, |b| u64::from(ASCII_WRITTEN[usize::from(b)]));
        self.dense += dense;
        self.other += 2 + other;
    }
}

/// How many characters JSON writes for each ASCII byte of a string: two for the escapes of
/// `"`, `\`, backspace, tab, newline, form feed and carriage return, six (`\u00XX`) for the
/// other control characters, one for the rest.
const ASCII_WRITTEN: [u8; 128] = {
    let mut written = [1u8; 128];
    let mut b = 0;
    while b < 0x20 {
        written[b] = 6;
        b += 1;
    }
    written[0x08] = 2;
    written[0x09] = 2;
    written[0x0a] = 2;
    written[0x0c] = 2;
    written[0x0d] = 2;
    written[b'"' as usize] = 2;
    written[b'\\' as usize] = 2;
    written
};

/// The fields of an answer (any protocol, unary or one stream event) whose text the model
/// generated: message and delta `content`, Anthropic's `text` and `partial_json`, Responses'
/// `delta`, tool-call `arguments`, refusals and reasoning.
const ANSWER_TEXT_FIELDS: [&str; 8] = [
    "content",
    "text",
    "partial_json",
    "delta",
    "arguments",
    "refusal",
    "reasoning",
    "reasoning_content",
];

/// Estimated tokens of what a model generated in `answer` (a whole answer or one stream
/// event), by [`estimate_tokens`] over its generated text: what an answer is counted as when
/// its provider reports no usage.
pub fn estimate_answer_tokens(answer: &serde_json::Value) -> u64 {
    use serde_json::Value;
    match answer {
        Value::Object(fields) => fields
            .iter()
            .map(|(name, value)| match value {
                Value::String(text) => answer_text_tokens(name, text),
                other => estimate_answer_tokens(other),
            })
            .sum(),
        Value::Array(items) => items.iter().map(estimate_answer_tokens).sum(),
        _ => 0,
    }
}

/// The estimated tokens a string field `name` of an answer adds: its text's when the model
/// generated it (one of the answer's text fields), none otherwise.
pub fn answer_text_tokens(name: &str, text: &str) -> u64 {
    if ANSWER_TEXT_FIELDS.contains(&name) {
        estimate_tokens(text)
    } else {
        0
    }
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // hiragana, katakana
        | 0x3100..=0x312F    // bopomofo
        | 0x31F0..=0x31FF    // katakana extensions
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFF66..=0xFF9F    // half-width katakana
        | 0x20000..=0x2FA1F  // CJK extensions B-F, compatibility supplement
    )
}

/// The prompt tokens a lane takes: its model's `contextWindow` and its provider's per-request
/// input cap, the smaller of those set; `None` when neither is.
pub fn lane_capacity(provider: &Provider, model: &Model) -> Option<u64> {
    [model.context_window, provider.max_input_tokens]
        .into_iter()
        .filter(|n| *n > 0)
        .min()
}

/// Whether a lane may take a call whose lane of `failed_capacity` answered that the prompt is
/// too long: only a lane known to take more.
pub fn larger_than(capacity: Option<u64>, failed_capacity: Option<u64>) -> bool {
    match (capacity, failed_capacity) {
        (Some(c), Some(f)) => c > f,
        // The failed lane declared nothing: any lane with a declared size may be larger; one
        // that declares nothing either is no better known.
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`Chars::string`] counted character by character before it read ASCII by byte.
    fn string_by_character(text: &str) -> (u64, u64) {
        let (mut dense, mut other) = (0, 2);
        for c in text.chars() {
            match c {
                '"' | '\\' | '\u{8}' | '\t' | '\n' | '\u{c}' | '\r' => other += 2,
                c if (c as u32) < 0x20 => other += 6,
                c if is_cjk(c) => dense += 1,
                _ => other += 1,
            }
        }
        (dense, other)
    }

    #[test]
    fn a_string_read_by_byte_counts_what_reading_it_by_character_did() {
        // Each byte next to a plain run, at every offset of a word of eight.
        for special in (0u8..128).map(char::from).chain(['é', '中', '😀']) {
            for offset in 0..17 {
                let text = format!("{}{special}{}", "a".repeat(offset), "b".repeat(9));
                let mut count = Chars::default();
                count.string(&text);
                assert_eq!(
                    (count.dense, count.other),
                    string_by_character(&text),
                    "{text:?}"
                );
            }
        }
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        // Every ASCII byte, the edges of each dense range, and other scripts and emoji.
        let mut pool: Vec<char> = (0u8..128).map(char::from).collect();
        for (start, end) in [
            (0x3040, 0x30FF),
            (0x3100, 0x312F),
            (0x31F0, 0x31FF),
            (0x3400, 0x4DBF),
            (0x4E00, 0x9FFF),
            (0xAC00, 0xD7AF),
            (0xF900, 0xFAFF),
            (0xFF66, 0xFF9F),
            (0x20000, 0x2FA1F),
        ] {
            for code in [start - 1, start, end, end + 1] {
                pool.extend(char::from_u32(code));
            }
        }
        pool.extend([
            'é', 'ß', 'Ж', 'ع', '€', '…', '😀', '\u{7ff}', '\u{800}', '\u{ffff}',
        ]);
        // Plain ASCII (printable, neither `"` nor `\\`), which is read eight bytes at a time.
        let plain: Vec<char> = (0x20u8..0x7f)
            .filter(|b| *b != b'"' && *b != b'\\')
            .map(char::from)
            .collect();
        for round in 0..40_000 {
            // Half the strings drawn from the whole pool, half mostly plain with a rare other
            // character anywhere (every offset of a run of eight).
            let text: String = match round % 2 {
                0 => (0..rng.random_range(0..40))
                    .map(|_| pool[rng.random_range(0..pool.len())])
                    .collect(),
                _ => (0..rng.random_range(0..120))
                    .map(|_| match rng.random_range(0..20) {
                        0 => pool[rng.random_range(0..pool.len())],
                        _ => plain[rng.random_range(0..plain.len())],
                    })
                    .collect(),
            };
            let mut count = Chars::default();
            count.string(&text);
            assert_eq!(
                (count.dense, count.other),
                string_by_character(&text),
                "{text:?}"
            );
            let (dense, other) = text.chars().fold((0, 0), |(d, o), c| match is_cjk(c) {
                true => (d + 1, o),
                false => (d, o + 1),
            });
            assert_eq!(
                estimate_tokens(&text),
                dense + u64::div_ceil(other, 4),
                "{text:?}"
            );
        }
    }

    #[test]
    fn english_is_about_four_characters_a_token() {
        let text = "The quick brown fox jumps over the lazy dog.";
        assert_eq!(text.chars().count(), 44);
        assert_eq!(estimate_tokens(text), 11);
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("a"), 1);
    }

    #[test]
    fn chinese_counts_a_token_a_character() {
        // 16 Han characters and a full stop (punctuation, not dense).
        let text = "请用三句话解释一下量子计算的原理。";
        let han = text.chars().filter(|c| is_cjk(*c)).count() as u64;
        assert_eq!(han, 16);
        assert_eq!(estimate_tokens(text), han + 1);
        // Four times the four-characters-a-token estimate.
        let naive = (text.chars().count() as u64).div_ceil(4);
        assert!(estimate_tokens(text) >= 3 * naive, "{naive}");
    }

    #[test]
    fn japanese_counts_kana_and_kanji_and_leaves_latin_at_four() {
        // Kanji, hiragana and katakana are dense; "GPU" and the spaces are not.
        let text = "東京でGPUを借りたいです";
        let dense = text.chars().filter(|c| is_cjk(*c)).count() as u64;
        assert_eq!(dense, 10);
        assert_eq!(estimate_tokens(text), dense + 1);
        assert_eq!(estimate_tokens("カタカナ"), 4);
        assert_eq!(estimate_tokens("한국어"), 3);
    }

    /// A random JSON value: every kind, escapes and control characters, CJK and astral text,
    /// integers and floats of every size.
    fn random_value(rng: &mut impl rand::Rng, depth: u32) -> serde_json::Value {
        use serde_json::{json, Value};
        let pieces = [
            "a", "Hello", " ", "\"", "\\", "\n", "\t", "\r", "\u{8}", "\u{c}", "\u{1}", "\u{1f}",
            "\u{7f}", "/", "请", "カタ", "한", "😀", "𠀀", "é", "\u{2028}",
        ];
        let text = |rng: &mut dyn rand::RngCore| -> String {
            let n = rand::Rng::random_range(rng, 0..6);
            (0..n)
                .map(|_| pieces[rand::Rng::random_range(rng, 0..pieces.len())])
                .collect()
        };
        match rng.random_range(0..if depth == 0 { 6 } else { 8 }) {
            0 => Value::Null,
            1 => Value::Bool(rng.random()),
            2 => json!(rng.random::<i64>() >> rng.random_range(0..63)),
            3 => json!(rng.random::<u64>()),
            4 => json!(rng.random::<f64>() * 10f64.powi(rng.random_range(-20..20))),
            5 => Value::String(text(rng)),
            6 => Value::Array(
                (0..rng.random_range(0..4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.random_range(0..4))
                    .map(|_| (text(rng), random_value(rng, depth - 1)))
                    .collect(),
            ),
        }
    }

    #[test]
    fn json_is_estimated_as_its_written_text_would_be() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(32);
        for _ in 0..20_000 {
            let value = random_value(&mut rng, 3);
            assert_eq!(
                estimate_json_tokens(&value),
                estimate_tokens(&value.to_string()),
                "{value}"
            );
        }
        let messages = serde_json::json!([{"role": "user", "content": "请用三句话\n解释"}]);
        assert_eq!(
            estimate_json_tokens(&messages),
            estimate_tokens(&messages.to_string())
        );
    }

    #[test]
    fn capacities_compare_only_what_is_known() {
        let provider = |cap: u64| Provider {
            max_input_tokens: cap,
            ..Default::default()
        };
        let model = |window: u64| Model {
            context_window: window,
            ..Default::default()
        };
        assert_eq!(lane_capacity(&provider(0), &model(0)), None);
        assert_eq!(lane_capacity(&provider(0), &model(128_000)), Some(128_000));
        // GitHub Models: the 8K cap, whatever the model's window.
        assert_eq!(
            lane_capacity(&provider(8_000), &model(128_000)),
            Some(8_000)
        );
        assert!(larger_than(Some(32_000), Some(8_000)));
        assert!(!larger_than(Some(8_000), Some(8_000)));
        assert!(!larger_than(Some(4_000), Some(8_000)));
        assert!(larger_than(Some(4_000), None));
        assert!(!larger_than(None, Some(8_000)));
        assert!(!larger_than(None, None));
    }
}
