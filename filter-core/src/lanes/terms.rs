//! The pool's filters on providers (`selection.mode`, `region`, `allowPromptLogging`,
//! `keylessFallback`), from what the control plane resolved of each provider's terms (the
//! kind table `control-plane/data/terms.yaml` with the provider's `terms:` on top). A provider
//! a filter drops is no candidate of any call; the reason names the filter.

use ai_router_proto::v1::{Provider, Selection};

/// Why the pool's filters drop a provider, by the reason's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// `mode: production` and the provider's terms forbid production use.
    ProductionForbidden,
    /// `region` is a country the provider does not serve.
    RegionBlocked,
    /// `allowPromptLogging: false` and the provider may train on prompts.
    PromptLogging,
    /// A keyless provider without `keylessFallback: true`.
    Keyless,
}

impl Skip {
    pub fn reason(self) -> &'static str {
        match self {
            Skip::ProductionForbidden => "production_forbidden",
            Skip::RegionBlocked => "region_blocked",
            Skip::PromptLogging => "prompt_logging",
            Skip::Keyless => "keyless",
        }
    }

    /// What the reason means, for an error message.
    pub fn explain(self, selection: &Selection) -> String {
        match self {
            Skip::ProductionForbidden => {
                "its terms forbid production use (selection.mode: production)".into()
            }
            Skip::RegionBlocked => format!(
                "it is not available in {} (selection.region)",
                selection.region
            ),
            Skip::PromptLogging => {
                "it may train on prompts (selection.allowPromptLogging: false)".into()
            }
            Skip::Keyless => "it is keyless (selection.keylessFallback is off)".into(),
        }
    }
}

/// The filter that drops `provider`, if one does.
pub fn skipped(selection: &Selection, provider: &Provider) -> Option<Skip> {
    let terms = provider.terms.as_ref()?;
    if selection.production && terms.production_forbidden {
        return Some(Skip::ProductionForbidden);
    }
    if !selection.region.is_empty()
        && terms
            .blocked_regions
            .iter()
            .any(|r| r.eq_ignore_ascii_case(&selection.region))
    {
        return Some(Skip::RegionBlocked);
    }
    if selection.forbid_prompt_logging && terms.trains_on_prompts {
        return Some(Skip::PromptLogging);
    }
    if terms.keyless && !selection.keyless_fallback {
        return Some(Skip::Keyless);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::ProviderTerms;

    fn provider(id: &str, terms: ProviderTerms) -> Provider {
        Provider {
            id: id.into(),
            terms: Some(terms),
            ..Provider::default()
        }
    }

    fn pool() -> Vec<Provider> {
        vec![
            provider(
                "nvidia",
                ProviderTerms {
                    production_forbidden: true,
                    ..ProviderTerms::default()
                },
            ),
            provider(
                "gemini",
                ProviderTerms {
                    trains_on_prompts: true,
                    blocked_regions: vec!["DE".into(), "GB".into(), "CH".into()],
                    ..ProviderTerms::default()
                },
            ),
            provider(
                "ovh",
                ProviderTerms {
                    keyless: true,
                    ..ProviderTerms::default()
                },
            ),
            provider("groq", ProviderTerms::default()),
        ]
    }

    fn kept(selection: &Selection) -> Vec<String> {
        pool()
            .iter()
            .filter(|p| skipped(selection, p).is_none())
            .map(|p| p.id.clone())
            .collect()
    }

    #[test]
    fn each_filter_drops_exactly_its_providers() {
        let none = Selection::default();
        assert_eq!(kept(&none), ["nvidia", "gemini", "groq"]);
        let production = Selection {
            production: true,
            ..Selection::default()
        };
        assert_eq!(kept(&production), ["gemini", "groq"]);
        let germany = Selection {
            region: "DE".into(),
            ..Selection::default()
        };
        assert_eq!(kept(&germany), ["nvidia", "groq"]);
        assert_eq!(skipped(&germany, &pool()[1]), Some(Skip::RegionBlocked));
        assert_eq!(Skip::RegionBlocked.reason(), "region_blocked");
        let us = Selection {
            region: "US".into(),
            ..Selection::default()
        };
        assert_eq!(kept(&us), ["nvidia", "gemini", "groq"]);
        let no_logging = Selection {
            forbid_prompt_logging: true,
            ..Selection::default()
        };
        assert_eq!(kept(&no_logging), ["nvidia", "groq"]);
        let keyless = Selection {
            keyless_fallback: true,
            ..Selection::default()
        };
        assert_eq!(kept(&keyless), ["nvidia", "gemini", "ovh", "groq"]);
        // A provider without pushed terms (an older control plane) is never dropped.
        assert_eq!(skipped(&production, &Provider::default()), None);
    }
}
