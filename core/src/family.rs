//! The provider families: one wire dialect each (how content blocks render, how a stream reads,
//! which preset applies). At the bottom of the crate's layers, so the provider layer, the
//! translators and web search can all name a family without depending on one another.

/// A provider family: how content blocks render and which preset applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Generic,
    Anthropic,
    OpenAi,
    OpenAiResponses,
    Gemini,
    Ollama,
}

impl Family {
    /// Parses a config family name.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "generic" | "" => Self::Generic,
            "anthropic" => Self::Anthropic,
            "openai" => Self::OpenAi,
            "openai_responses" => Self::OpenAiResponses,
            "gemini" => Self::Gemini,
            "ollama" => Self::Ollama,
            _ => return None,
        })
    }
}
