//! Generated types for `airouter.v1`: the control plane <-> filter sync protocol and the admin
//! protocol.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/airouter.v1.rs"));
}

/// The gRPC services' and methods' names, generated from the proto: `names::sync::SERVICE`
/// (`airouter.v1.Sync`), `names::sync::WATCH`, ... (each method's name in upper snake case).
pub mod names {
    include!(concat!(env!("OUT_DIR"), "/names.rs"));
}

impl v1::Usage {
    /// Prompt and completion tokens together: what a rate limit on tokens, a quota and a
    /// headroom estimate count.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

impl v1::AttemptOutcome {
    /// The tokens this attempt used, none when it reported no usage.
    pub fn tokens(&self) -> u64 {
        self.usage.as_ref().map_or(0, v1::Usage::total_tokens)
    }
}

pub mod listing;
pub mod tables;
pub mod text;

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn rust_files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }

    /// The services' names come from the proto alone (`names`): no crate spells one again.
    #[test]
    fn no_other_crate_spells_a_service_name() {
        let package = super::names::sync::SERVICE.rsplit_once('.').unwrap().0;
        let spelled = format!("\"{package}.");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = Vec::new();
        for dir in [
            "contract/src",
            "filter-core/src",
            "filter/src",
            "control-plane/src",
            "tests/src",
            "tests/tests",
        ] {
            rust_files(&root.join(dir), &mut files);
        }
        assert!(files.len() > 10, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                !text.contains(&spelled),
                "{} spells {spelled}",
                file.display()
            );
        }
    }

    #[test]
    fn an_attempt_s_tokens_are_its_prompt_and_completion_and_none_without_usage() {
        use super::v1::{AttemptOutcome, Usage};
        let mut a = AttemptOutcome::default();
        assert_eq!(a.tokens(), 0);
        a.usage = Some(Usage {
            prompt_tokens: 7,
            completion_tokens: 5,
            cached_tokens: 3,
            ..Usage::default()
        });
        assert_eq!(a.tokens(), 12);
        a.usage = Some(Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: 5,
            ..Usage::default()
        });
        assert_eq!(a.tokens(), u64::MAX);
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn the_generated_servers_serve_these_names() {
        assert_eq!(
            super::v1::sync_server::SERVICE_NAME,
            super::names::sync::SERVICE
        );
        assert_eq!(
            super::v1::admin_server::SERVICE_NAME,
            super::names::admin::SERVICE
        );
    }
}
