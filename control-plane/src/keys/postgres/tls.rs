//! The URL's TLS parameters (`sslmode`, `sslrootcert`), which tokio-postgres does not parse.

use std::path::{Path, PathBuf};

/// How a connection is secured: the URL's `sslmode` and `sslrootcert`, or the store's `caFile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgTls {
    /// `disable`, `allow`, `prefer` or no `sslmode`: plaintext.
    Off { disable: bool },
    /// `require`, `verify-ca`, `verify-full`: the server's chain and name are verified against
    /// the CA file, or the system's CAs when it is `None`.
    Verify { ca_file: Option<PathBuf> },
}

/// Takes `sslmode` and `sslrootcert` out of `url` (a `postgres://` URL or `key=value` words)
/// and says how to connect; `ca_file` is the store's `caFile`. Errors name the parameter, never
/// the URL.
pub fn split_tls(url: &str, ca_file: Option<&Path>) -> Result<(String, PgTls), String> {
    let mut mode = None;
    let mut root = None;
    let mut take = |key: &str, value: String| -> bool {
        match key {
            "sslmode" => mode = Some(value),
            "sslrootcert" => root = Some(value),
            _ => return false,
        }
        true
    };
    let trimmed = url.trim();
    let is_url = ["postgres://", "postgresql://"].iter().any(|p| {
        trimmed
            .get(..p.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(p))
    });
    let rest = if is_url {
        match trimmed.split_once('?') {
            None => trimmed.to_owned(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        !take(key, percent_decode(value))
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // `host=h sslmode=verify-full ...`: the words without the two, spacing kept.
        let mut kept = String::with_capacity(trimmed.len());
        for word in trimmed.split_inclusive(char::is_whitespace) {
            let (key, value) = word.trim_end().split_once('=').unwrap_or(("", ""));
            if !take(key, value.trim_matches('\'').to_owned()) {
                kept.push_str(word);
            }
        }
        kept.trim_end().to_owned()
    };
    let ca =
        match (root, ca_file) {
            (Some(_), Some(_)) => return Err(
                "gateway.keyStore: the URL's sslrootcert and caFile both name a CA file; keep one"
                    .into(),
            ),
            (Some(r), None) if r == "system" => None,
            (Some(r), None) if r.is_empty() => {
                return Err("gateway.keyStore.url: sslrootcert is empty".into())
            }
            (Some(r), None) => Some(PathBuf::from(r)),
            (None, file) => file.map(Path::to_path_buf),
        };
    let tls = match mode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => {
            if ca.is_some() {
                return Err("gateway.keyStore: a CA file (caFile or sslrootcert) is only used with TLS: add sslmode=verify-full to the URL".into());
            }
            PgTls::Off {
                disable: mode.as_deref() == Some("disable"),
            }
        }
        Some("require" | "verify-ca" | "verify-full") => PgTls::Verify { ca_file: ca },
        Some(_) => {
            return Err("gateway.keyStore.url: sslmode is one of disable, allow, prefer, require, verify-ca or verify-full".into())
        }
    };
    Ok((rest, tls))
}

/// `%XX` escapes decoded (a query value); anything else as it is.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
