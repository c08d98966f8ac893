//! Which keys reach a model when a provider discovers its models (`discover: true`): the one
//! rule the filter's lane choice and the control plane's catalog both apply.
//!
//! A listed key (its catalog was read) reaches exactly the models its listing has; a key not
//! listed yet, or whose every listing failed, reaches the configured models only, as it would
//! without discovery.

use crate::v1::{Model, ProviderKey};

impl ProviderKey {
    /// Whether this key can reach `model` (a binary search over the sorted listing).
    pub fn reaches(&self, model: &Model) -> bool {
        if self.listed {
            self.models
                .binary_search_by(|listed| listed.as_str().cmp(model.id.as_str()))
                .is_ok()
        } else {
            !model.discovered
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(listed: Option<&[&str]>) -> ProviderKey {
        let mut models: Vec<String> = listed
            .unwrap_or_default()
            .iter()
            .map(|m| (*m).to_owned())
            .collect();
        models.sort();
        ProviderKey {
            listed: listed.is_some(),
            models,
            ..Default::default()
        }
    }

    fn model(id: &str, discovered: bool) -> Model {
        Model {
            id: id.into(),
            discovered,
            ..Default::default()
        }
    }

    #[test]
    fn a_listed_key_reaches_what_it_lists_and_an_unlisted_one_what_is_configured() {
        let configured = model("m-conf", false);
        let found = model("m-found", true);
        let listed = key(Some(&["m-found", "m-other", "a-first"]));
        assert!(listed.reaches(&found));
        // Configured, but this key's catalog does not have it.
        assert!(!listed.reaches(&configured));
        let unlisted = key(None);
        assert!(unlisted.reaches(&configured));
        assert!(!unlisted.reaches(&found));
        // Listed with nothing: the catalog was read and is empty.
        let empty = key(Some(&[]));
        assert!(!empty.reaches(&configured));
        assert!(!empty.reaches(&found));
    }
}
