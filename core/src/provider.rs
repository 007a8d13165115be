//! Providers as data (mesh-behaviour §4): the family presets and a generic provider's templates
//! both compile into one [`Plan`], so there is one rendering path.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::template::{DotPath, Mode, Template, Var};
use crate::translate::generic::StreamPaths;
use crate::translate::Format;

pub use crate::family::Family;

/// The format a provider family's chat endpoint speaks; `None` for generic providers, whose
/// templates are Mesh's.
#[must_use]
pub fn upstream_format(family: Family) -> Option<Format> {
    Some(match family {
        Family::Anthropic => Format::Anthropic,
        // NOTE: the Ollama preset calls Ollama's OpenAI-compatible endpoint.
        Family::OpenAi | Family::Ollama => Format::OpenAiChat,
        Family::OpenAiResponses => Format::OpenAiResponses,
        Family::Gemini => Format::Gemini,
        Family::Generic => return None,
    })
}

/// A generic provider's templates, as Mesh stores them (every field optional on the wire).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct GenericTemplates {
    pub endpoint_url: Option<String>,
    pub http_method: Option<String>,
    pub header_template: BTreeMap<String, String>,
    pub request_body_template: Option<String>,
    pub response_delta_path: Option<String>,
    pub response_done_signal: Option<String>,
    pub usage_input_tokens_path: Option<String>,
    pub usage_output_tokens_path: Option<String>,
    pub web_search_request_body_template: Option<String>,
    pub embedding_endpoint_url: Option<String>,
    pub embedding_request_body_template: Option<String>,
    pub embedding_response_vector_path: Option<String>,
    pub embedding_usage_tokens_path: Option<String>,
    pub generation_endpoint_url: Option<String>,
    pub generation_request_body_template: Option<String>,
    pub generation_response_media_path: Option<String>,
    pub generation_mode: Option<String>,
    pub generation_job_id_path: Option<String>,
    pub generation_status_url_template: Option<String>,
    pub generation_status_path: Option<String>,
    pub generation_content_url_template: Option<String>,
    pub generation_status_success_values: Option<Vec<String>>,
    pub generation_status_failure_values: Option<Vec<String>>,
    pub generation_poll_interval_ms: Option<i64>,
    pub generation_max_wait_seconds: Option<i64>,
    pub generation_duration_seconds_path: Option<String>,
    pub generation_usage_input_tokens_path: Option<String>,
    pub generation_usage_output_tokens_path: Option<String>,
}

/// Chat (`/v1/proxy`) rendering and stream parsing.
#[derive(Clone, Debug)]
pub struct ChatPlan {
    pub url: Template,
    pub body: Template,
    pub web_search_body: Option<Template>,
    /// Where the stream's text, end and usage are (how `/v1/proxy` reads it).
    pub stream: Arc<StreamPaths>,
}

/// `/v1/embeddings` rendering and extraction.
#[derive(Clone, Debug)]
pub struct EmbeddingPlan {
    pub url: Template,
    pub body: Template,
    pub vector: DotPath,
    pub usage: Option<DotPath>,
}

/// How a generation job completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerationMode {
    Sync,
    AsyncPoll,
}

impl GenerationMode {
    /// The config name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::AsyncPoll => "async_poll",
        }
    }
}

/// `/v1/generate` rendering, polling and extraction.
#[derive(Clone, Debug)]
pub struct GenerationPlan {
    pub url: Template,
    pub body: Template,
    pub mode: GenerationMode,
    pub media: Option<DotPath>,
    pub job_id: Option<DotPath>,
    pub status_url: Option<Template>,
    pub status: Option<DotPath>,
    pub content_url: Option<Template>,
    pub success_values: Vec<String>,
    pub failure_values: Vec<String>,
    pub poll_interval_ms: u64,
    pub max_wait_s: u64,
    pub duration: Option<DotPath>,
    pub usage_in: Option<DotPath>,
    pub usage_out: Option<DotPath>,
}

impl GenerationPlan {
    /// Mesh's completeness rule: sync needs the media path; async needs job id, status URL,
    /// status path and content URL.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        match self.mode {
            GenerationMode::Sync => self.media.is_some(),
            GenerationMode::AsyncPoll => {
                self.job_id.is_some()
                    && self.status_url.is_some()
                    && self.status.is_some()
                    && self.content_url.is_some()
            }
        }
    }
}

/// Everything needed to call one provider, compiled once per snapshot.
#[derive(Clone, Debug)]
pub struct Plan {
    pub family: Family,
    pub method: String,
    /// Header name and value template (text mode); `Content-Type` is added unless present.
    pub headers: Vec<(String, Template)>,
    pub has_content_type: bool,
    pub chat: Option<ChatPlan>,
    pub embedding: Option<EmbeddingPlan>,
    pub generation: Option<GenerationPlan>,
}

fn text(t: &str) -> Template {
    Template::compile(t, Mode::Text)
}

fn path(p: &str) -> Option<DotPath> {
    DotPath::parse(p)
}

const OPENAI_CHAT: &str = r#"{"model":"{{model}}","messages":[{"role":"user","content":"{{content_json}}"}],"max_tokens":"{{max_tokens_json}}","stream":true,"stream_options":{"include_usage":true}}"#;
const OPENAI_CHAT_SEARCH: &str = r#"{"model":"{{model}}","messages":[{"role":"user","content":"{{content_json}}"}],"max_tokens":"{{max_tokens_json}}","stream":true,"stream_options":{"include_usage":true},"web_search_options":{}}"#;
const OPENAI_EMBED: &str = r#"{"model":"{{model}}","input":"{{input_json}}"}"#;
const OPENAI_IMAGE: &str = r#"{"model":"{{model}}","prompt":"{{prompt_json}}","n":1}"#;
const RESPONSES: &str = r#"{"model":"{{model}}","input":[{"role":"user","content":"{{content_json}}"}],"max_output_tokens":"{{max_tokens_json}}","stream":true}"#;
const RESPONSES_SEARCH: &str = r#"{"model":"{{model}}","input":[{"role":"user","content":"{{content_json}}"}],"max_output_tokens":"{{max_tokens_json}}","stream":true,"tools":[{"type":"web_search"}]}"#;
const ANTHROPIC: &str = r#"{"model":"{{model}}","max_tokens":"{{max_tokens_json}}","stream":true,"messages":[{"role":"user","content":"{{content_json}}"}]}"#;
const ANTHROPIC_SEARCH: &str = r#"{"model":"{{model}}","max_tokens":"{{max_tokens_json}}","stream":true,"messages":[{"role":"user","content":"{{content_json}}"}],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}]}"#;
const GEMINI: &str = r#"{"contents":[{"role":"user","parts":"{{content_json}}"}],"generationConfig":{"maxOutputTokens":"{{max_tokens_json}}"}}"#;
const GEMINI_SEARCH: &str = r#"{"contents":[{"role":"user","parts":"{{content_json}}"}],"generationConfig":{"maxOutputTokens":"{{max_tokens_json}}"},"tools":[{"google_search":{}}]}"#;
const GEMINI_EMBED: &str = r#"{"content":{"parts":[{"text":"{{input_json}}"}]}}"#;
const GEMINI_IMAGE: &str = r#"{"instances":[{"prompt":"{{prompt_json}}"}],"parameters":{"sampleCount":1}}"#;

fn sync_generation(url: String, body: &str, media: &str) -> GenerationPlan {
    GenerationPlan {
        url: text(&url),
        body: Template::compile(body, Mode::Json),
        mode: GenerationMode::Sync,
        media: path(media),
        job_id: None,
        status_url: None,
        status: None,
        content_url: None,
        success_values: vec!["completed".into()],
        failure_values: vec!["failed".into()],
        poll_interval_ms: 3000,
        max_wait_s: 600,
        duration: None,
        usage_in: None,
        usage_out: None,
    }
}

impl Plan {
    /// The built-in preset of `family` for an API root `base_url` (mesh-behaviour §4.7, with
    /// `max_tokens` forwarded to every family and usage always requested). `None` for generic.
    #[must_use]
    pub fn preset(family: Family, base_url: &str, has_api_key: bool) -> Option<Self> {
        let base = base_url.trim_end_matches('/');
        let json = |t: &str| Template::compile(t, Mode::Json);
        let bearer = || vec![("Authorization".to_owned(), text("Bearer {{api_key}}"))];
        let openai_embedding = || EmbeddingPlan {
            url: text(&format!("{base}/v1/embeddings")),
            body: json(OPENAI_EMBED),
            vector: DotPath::parse("data.0.embedding").expect("static path"),
            usage: path("usage.prompt_tokens"),
        };
        let openai_image = || sync_generation(format!("{base}/v1/images/generations"), OPENAI_IMAGE, "data.0.b64_json");
        let (headers, chat, embedding, generation) = match family {
            Family::Generic => return None,
            Family::OpenAi | Family::Ollama => (
                bearer(),
                ChatPlan {
                    url: text(&format!("{base}/v1/chat/completions")),
                    body: json(OPENAI_CHAT),
                    web_search_body: (family == Family::OpenAi).then(|| json(OPENAI_CHAT_SEARCH)),
                    stream: Arc::new(StreamPaths {
                        delta: DotPath::parse("choices.0.delta.content").expect("static path"),
                        done_signal: None,
                        usage_in: path("usage.prompt_tokens"),
                        usage_out: path("usage.completion_tokens"),
                    }),
                },
                Some(openai_embedding()),
                (family == Family::OpenAi).then(openai_image),
            ),
            Family::OpenAiResponses => (
                bearer(),
                ChatPlan {
                    url: text(&format!("{base}/v1/responses")),
                    body: json(RESPONSES),
                    web_search_body: Some(json(RESPONSES_SEARCH)),
                    stream: Arc::new(StreamPaths {
                        delta: DotPath::parse("delta").expect("static path"),
                        done_signal: None,
                        usage_in: path("response.usage.input_tokens"),
                        usage_out: path("response.usage.output_tokens"),
                    }),
                },
                Some(openai_embedding()),
                Some(openai_image()),
            ),
            Family::Anthropic => (
                vec![
                    ("x-api-key".to_owned(), text("{{api_key}}")),
                    ("anthropic-version".to_owned(), text("2023-06-01")),
                ],
                ChatPlan {
                    url: text(&format!("{base}/v1/messages")),
                    body: json(ANTHROPIC),
                    web_search_body: Some(json(ANTHROPIC_SEARCH)),
                    stream: Arc::new(StreamPaths {
                        delta: DotPath::parse("delta.text").expect("static path"),
                        done_signal: None,
                        usage_in: path("message.usage.input_tokens"),
                        usage_out: path("usage.output_tokens"),
                    }),
                },
                None,
                None,
            ),
            Family::Gemini => (
                vec![("x-goog-api-key".to_owned(), text("{{api_key}}"))],
                ChatPlan {
                    url: text(&format!(
                        "{base}/v1beta/models/{{{{model}}}}:streamGenerateContent?alt=sse"
                    )),
                    body: json(GEMINI),
                    web_search_body: Some(json(GEMINI_SEARCH)),
                    stream: Arc::new(StreamPaths {
                        delta: DotPath::parse("candidates.0.content.parts.0.text").expect("static path"),
                        done_signal: None,
                        usage_in: path("usageMetadata.promptTokenCount"),
                        usage_out: path("usageMetadata.candidatesTokenCount"),
                    }),
                },
                Some(EmbeddingPlan {
                    url: text(&format!("{base}/v1beta/models/{{{{model}}}}:embedContent")),
                    body: json(GEMINI_EMBED),
                    vector: DotPath::parse("embedding.values").expect("static path"),
                    usage: None,
                }),
                Some(sync_generation(
                    format!("{base}/v1beta/models/{{{{model}}}}:predict"),
                    GEMINI_IMAGE,
                    "predictions.0.bytesBase64Encoded",
                )),
            ),
        };
        // NOTE: a keyless local server (Ollama) gets no empty `Bearer ` header.
        let headers = if has_api_key {
            headers
        } else {
            headers.into_iter().filter(|(_, t)| !t.uses(Var::ApiKey)).collect()
        };
        Some(Self {
            family,
            method: "POST".into(),
            headers,
            has_content_type: false,
            chat: Some(chat),
            embedding,
            generation,
        })
    }

    /// Compiles a generic provider's templates (or the generic fields overriding a preset's
    /// embedding/generation parts). Every problem is pushed to `errors`.
    pub fn from_generic(
        family: Family,
        g: &GenericTemplates,
        preset: Option<Self>,
        errors: &mut Vec<String>,
        what: &str,
    ) -> Self {
        let json_body = |name: &str, t: &str, errors: &mut Vec<String>| {
            if serde_json::from_str::<serde::de::IgnoredAny>(t).is_err() {
                errors.push(format!("{what}.{name}: not valid JSON"));
            }
            let compiled = Template::compile(t, Mode::Json);
            if compiled.uses(Var::ApiKey) {
                errors.push(format!(
                    "{what}.{name}: {{{{api_key}}}} is allowed only in the URL and headers"
                ));
            }
            compiled
        };
        let nonempty = |s: &Option<String>| s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned);
        let mut plan = preset.unwrap_or_else(|| Self {
            family,
            method: "POST".into(),
            headers: Vec::new(),
            has_content_type: false,
            chat: None,
            embedding: None,
            generation: None,
        });
        if let Some(method) = nonempty(&g.http_method) {
            plan.method = method.to_ascii_uppercase();
        }
        if !g.header_template.is_empty() {
            plan.headers = g.header_template.iter().map(|(k, v)| (k.clone(), text(v))).collect();
        }
        if let (Some(url), Some(body), Some(delta)) = (
            nonempty(&g.endpoint_url),
            nonempty(&g.request_body_template),
            nonempty(&g.response_delta_path),
        ) {
            plan.chat = Some(ChatPlan {
                url: text(&url),
                body: json_body("request_body_template", &body, errors),
                web_search_body: nonempty(&g.web_search_request_body_template)
                    .map(|t| json_body("web_search_request_body_template", &t, errors)),
                stream: Arc::new(StreamPaths {
                    delta: DotPath::parse(&delta).expect("non-empty path"),
                    done_signal: nonempty(&g.response_done_signal),
                    usage_in: nonempty(&g.usage_input_tokens_path).and_then(|p| path(&p)),
                    usage_out: nonempty(&g.usage_output_tokens_path).and_then(|p| path(&p)),
                }),
            });
        } else if family == Family::Generic && plan.chat.is_none() && g.endpoint_url.is_some() {
            errors.push(format!(
                "{what}: a generic chat endpoint needs request_body_template and response_delta_path"
            ));
        }
        if let (Some(url), Some(body), Some(vector)) = (
            nonempty(&g.embedding_endpoint_url),
            nonempty(&g.embedding_request_body_template),
            nonempty(&g.embedding_response_vector_path),
        ) {
            plan.embedding = Some(EmbeddingPlan {
                url: text(&url),
                body: json_body("embedding_request_body_template", &body, errors),
                vector: DotPath::parse(&vector).expect("non-empty path"),
                usage: nonempty(&g.embedding_usage_tokens_path).and_then(|p| path(&p)),
            });
        }
        if let (Some(url), Some(body)) = (
            nonempty(&g.generation_endpoint_url),
            nonempty(&g.generation_request_body_template),
        ) {
            let mode = match g.generation_mode.as_deref().unwrap_or("") {
                "" | "sync" => GenerationMode::Sync,
                "async_poll" => GenerationMode::AsyncPoll,
                other => {
                    errors.push(format!("{what}.generation_mode: {other:?} is not sync or async_poll"));
                    GenerationMode::Sync
                }
            };
            let positive = |v: Option<i64>, default: u64| {
                v.and_then(|v| u64::try_from(v).ok())
                    .filter(|&v| v > 0)
                    .unwrap_or(default)
            };
            let values = |v: &Option<Vec<String>>, default: &str| match v {
                Some(list) if !list.is_empty() => list.clone(),
                _ => vec![default.to_owned()],
            };
            let generation = GenerationPlan {
                url: text(&url),
                body: json_body("generation_request_body_template", &body, errors),
                mode,
                media: nonempty(&g.generation_response_media_path).and_then(|p| path(&p)),
                job_id: nonempty(&g.generation_job_id_path).and_then(|p| path(&p)),
                status_url: nonempty(&g.generation_status_url_template).map(|t| text(&t)),
                status: nonempty(&g.generation_status_path).and_then(|p| path(&p)),
                content_url: nonempty(&g.generation_content_url_template).map(|t| text(&t)),
                success_values: values(&g.generation_status_success_values, "completed"),
                failure_values: values(&g.generation_status_failure_values, "failed"),
                poll_interval_ms: positive(g.generation_poll_interval_ms, 3000),
                max_wait_s: positive(g.generation_max_wait_seconds, 600),
                duration: nonempty(&g.generation_duration_seconds_path).and_then(|p| path(&p)),
                usage_in: nonempty(&g.generation_usage_input_tokens_path).and_then(|p| path(&p)),
                usage_out: nonempty(&g.generation_usage_output_tokens_path).and_then(|p| path(&p)),
            };
            if mode == GenerationMode::AsyncPoll && !generation.is_complete() {
                errors.push(format!(
                    "{what}: async_poll generation needs job id path, status URL, status path and content URL"
                ));
            }
            plan.generation = Some(generation);
        }
        plan
    }

    /// Finishes a plan: notes whether the headers set `Content-Type` themselves.
    #[must_use]
    pub fn finish(mut self) -> Self {
        self.has_content_type = self
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::Vars;

    #[test]
    fn test_every_preset_body_is_valid_json_once_rendered() {
        for family in [
            Family::OpenAi,
            Family::OpenAiResponses,
            Family::Anthropic,
            Family::Gemini,
            Family::Ollama,
        ] {
            let plan = Plan::preset(family, "http://h/", true).unwrap();
            let chat = plan.chat.as_ref().unwrap();
            let vars = Vars {
                model: Some("m"),
                content_json: Some(b"[]"),
                max_tokens_json: Some(b"5"),
                ..Vars::default()
            };
            for body in std::iter::once(&chat.body).chain(chat.web_search_body.as_ref()) {
                let v: serde_json::Value = serde_json::from_slice(&body.render(&vars)).unwrap();
                assert!(v.to_string().contains('5'), "{family:?} forwards max_tokens");
            }
            assert!(
                !chat.url.render_string(&vars).contains("//v1"),
                "base_url's trailing slash trimmed"
            );
        }
    }

    #[test]
    fn test_api_key_in_a_body_template_is_refused() {
        let g = GenericTemplates {
            endpoint_url: Some("http://h/x".into()),
            request_body_template: Some(r#"{"k":"{{api_key}}"}"#.into()),
            response_delta_path: Some("a.b".into()),
            ..GenericTemplates::default()
        };
        let mut errors = Vec::new();
        let plan = Plan::from_generic(Family::Generic, &g, None, &mut errors, "providers[0]");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(plan.chat.is_some());
    }
}
