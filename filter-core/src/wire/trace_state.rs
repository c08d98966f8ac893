//! The W3C trace context's `tracestate` header: vendor entries that travel with `traceparent`.
//! The front stage passes a well-formed one in its request report, so the call's spans carry it
//! as their trace state; the attempt stage forwards the client's header to the provider as it
//! came (`headers::FORWARDED_TO_PROVIDER`).

/// The longest `tracestate` taken: the length W3C asks every vendor to propagate.
pub const MAX_LEN: usize = 512;
/// At most this many list members (W3C's limit).
const MAX_MEMBERS: usize = 32;

/// Whether `value` is a `tracestate` list: up to 32 comma-separated `key=value` members (empty
/// members and spaces around them allowed), a key of lowercase letters, digits and `_-*/`, with
/// at most one `@` (a multi-tenant key), a value of printable ASCII without `,` and `=`, not
/// ending in a space; at most [`MAX_LEN`] bytes in all.
pub fn valid(value: &str) -> bool {
    if value.len() > MAX_LEN || value.trim().is_empty() {
        return false;
    }
    let members: Vec<&str> = value
        .split(',')
        .map(|m| m.trim_matches([' ', '\t']))
        .filter(|m| !m.is_empty())
        .collect();
    if members.is_empty() || members.len() > MAX_MEMBERS {
        return false;
    }
    members.iter().all(|m| member(m))
}

fn member(m: &str) -> bool {
    let Some((key, value)) = m.split_once('=') else {
        return false;
    };
    key_ok(key) && value_ok(value)
}

fn key_ok(key: &str) -> bool {
    let simple = |k: &str, first_digit_ok: bool| {
        let mut bytes = k.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || (first_digit_ok && b.is_ascii_digit()));
        first_ok
            && k.len() <= 256
            && k.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || matches!(b, b'_' | b'-' | b'*' | b'/')
            })
    };
    match key.split_once('@') {
        None => simple(key, false),
        Some((tenant, system)) => {
            tenant.len() <= 241
                && system.len() <= 14
                && simple(tenant, true)
                && simple(system, false)
        }
    }
}

fn value_ok(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 256
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_lists_are_taken() {
        for ok in [
            "congo=t61rcWkgMzE",
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            " rojo=00f067aa0ba902b7 , ,congo=t61rcWkgMzE ",
            "fw529a3039@dt=MzMxMjgyNjQ",
            "0123@vendor=x y",
            "a_b-c*d/e=1",
        ] {
            assert!(valid(ok), "{ok}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        let long = format!("k={}", "v".repeat(MAX_LEN));
        let many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        for bad in [
            "",
            " , ",
            "novalue",
            "Upper=1",
            "1key=1",
            "k=",
            "k=a=b",
            "k=tab\there",
            "k=\u{e9}",
            "a@b@c=1",
            long.as_str(),
            many.as_str(),
        ] {
            assert!(!valid(bad), "{bad:?}");
        }
    }
}
