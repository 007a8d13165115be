//! Web search in a chat stream (mesh-behaviour §2.6, §4.5): [`Search`] accumulates the
//! citations, queries, reported search counts and Gemini's suggestion HTML that each family's
//! adapter extracts from its upstream events (`observe_search` in `translate/<family>.rs`,
//! dispatched by [`crate::translate::observe_search`]), de-duplicates and merges them by URL and
//! writes them as NDJSON.

use std::collections::HashMap;

use serde_json::Value;

use crate::family::Family;
use crate::json::{write_int, write_str};

/// At most this many sources are kept; a URL beyond them only sets [`Search::truncated`].
pub const MAX_SOURCES: usize = 100;

/// One cited page; an empty field is absent on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Citation {
    pub url: String,
    pub title: String,
    pub cited_text: String,
    pub page_age: String,
}

impl Citation {
    /// Fills this citation's empty fields from `title`, `cited_text` and `page_age`.
    fn merge(&mut self, title: &str, cited_text: &str, page_age: &str) {
        for (field, value) in [
            (&mut self.title, title),
            (&mut self.cited_text, cited_text),
            (&mut self.page_age, page_age),
        ] {
            if field.is_empty() && !value.is_empty() {
                value.clone_into(field);
            }
        }
    }
}

/// Everything one call's search events reported so far.
#[derive(Debug)]
pub struct Search {
    family: Family,
    /// De-duplicated, in order of first sight, at most [`MAX_SOURCES`].
    pub sources: Vec<Citation>,
    index: HashMap<String, usize>,
    /// Distinct queries, in order of first sight.
    pub queries: Vec<String>,
    /// The highest search count the upstream reported (Anthropic's `web_search_requests`).
    pub reported: i64,
    /// Gemini's `searchEntryPoint.renderedContent`; the last one wins.
    pub suggestions_html: Option<String>,
    /// More than [`MAX_SOURCES`] URLs were seen.
    pub truncated: bool,
    /// Citations with a URL extracted, duplicates included (openai's fallback rule needs it).
    cited: u64,
}

/// `value[key]` as a string, or `""`.
pub(crate) fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `value[key]` as an array, or empty.
pub(crate) fn array<'a>(value: Option<&'a Value>, key: &str) -> &'a [Value] {
    value
        .and_then(|v| v.get(key))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `value.type == kind`.
pub(crate) fn is_type(value: &Value, kind: &str) -> bool {
    value.get("type").and_then(Value::as_str) == Some(kind)
}

impl Search {
    /// An empty accumulator for a stream of `family`'s events (generic extracts nothing).
    #[must_use]
    pub fn new(family: Family) -> Self {
        Self {
            family,
            sources: Vec::new(),
            index: HashMap::new(),
            queries: Vec::new(),
            reported: 0,
            suggestions_html: None,
            truncated: false,
            cited: 0,
        }
    }

    /// Web search was used at all: any citation, query or reported search count.
    #[must_use]
    pub fn used(&self) -> bool {
        !self.sources.is_empty() || !self.queries.is_empty() || self.reported > 0
    }

    /// Billable searches: the highest reported count; otherwise the number of distinct queries;
    /// otherwise 1 if anything was cited; otherwise 0.
    #[must_use]
    pub fn billable(&self) -> i64 {
        if self.reported > 0 {
            self.reported
        } else if !self.queries.is_empty() {
            i64::try_from(self.queries.len()).unwrap_or(i64::MAX)
        } else {
            i64::from(!self.sources.is_empty())
        }
    }

    /// Records one cited URL: merged into its first sighting, or appended while under the cap.
    pub fn cite(&mut self, url: &str, title: &str, cited_text: &str, page_age: &str) {
        if url.is_empty() {
            return;
        }
        self.cited += 1;
        if let Some(&at) = self.index.get(url) {
            self.sources[at].merge(title, cited_text, page_age);
            return;
        }
        if self.sources.len() >= MAX_SOURCES {
            self.truncated = true;
            return;
        }
        self.index.insert(url.to_owned(), self.sources.len());
        self.sources.push(Citation {
            url: url.to_owned(),
            title: title.to_owned(),
            cited_text: cited_text.to_owned(),
            page_age: page_age.to_owned(),
        });
    }

    /// Records one distinct query.
    pub fn query(&mut self, query: &str) {
        if !query.is_empty() && !self.queries.iter().any(|q| q == query) {
            self.queries.push(query.to_owned());
        }
    }

    /// The family whose events this accumulator reads.
    #[must_use]
    pub fn family(&self) -> Family {
        self.family
    }

    /// Citations recorded so far, duplicates included (OpenAI's fallback to the Responses
    /// rules reads it: an event that cited nothing through one is read through the other).
    #[must_use]
    pub fn cited(&self) -> u64 {
        self.cited
    }

    /// A search count the upstream reported: the highest one wins.
    pub fn report(&mut self, searches: i64) {
        self.reported = self.reported.max(searches);
    }

    /// The final line's fields after `usage` (which the caller has closed): `sources`, and
    /// `queries`, `search_suggestions_html` and `sources_truncated` when present.
    pub fn write_final_fields(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"sources\":");
        write_citations(out, &self.sources);
        if !self.queries.is_empty() {
            out.extend_from_slice(b",\"queries\":[");
            for (i, query) in self.queries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, query);
            }
            out.push(b']');
        }
        if let Some(html) = &self.suggestions_html {
            out.extend_from_slice(b",\"search_suggestions_html\":");
            write_str(out, html);
        }
        if self.truncated {
            out.extend_from_slice(b",\"sources_truncated\":true");
        }
    }

    /// `,"web_searches":N`, for inside the final line's `usage` object.
    pub fn write_usage_field(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"web_searches\":");
        write_int(out, self.billable());
    }
}

/// Appends `[{url, title?, cited_text?, page_age?}, …]`.
pub fn write_citations(out: &mut Vec<u8>, citations: &[Citation]) {
    out.push(b'[');
    for (i, c) in citations.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"url\":");
        write_str(out, &c.url);
        for (key, value) in [
            ("title", &c.title),
            ("cited_text", &c.cited_text),
            ("page_age", &c.page_age),
        ] {
            if !value.is_empty() {
                out.extend_from_slice(b",\"");
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(b"\":");
                write_str(out, value);
            }
        }
        out.push(b'}');
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::observe_search as observe;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn test_anthropic_search_count_comes_from_usage_or_message_usage() {
        let mut s = Search::new(Family::Anthropic);
        observe(
            &mut s,
            &json!({"type": "message_start", "message": {"usage": {"server_tool_use": {"web_search_requests": 2}}}}),
        );
        observe(
            &mut s,
            &json!({"type": "message_delta", "usage": {"server_tool_use": {"web_search_requests": 1.9}}}),
        );
        assert_eq!(
            (s.reported, s.billable(), s.used()),
            (2, 2, true),
            "the highest count wins"
        );
    }

    #[test]
    fn test_openai_annotations_flat_or_nested_and_message_fallback() {
        let mut s = Search::new(Family::OpenAi);
        observe(
            &mut s,
            &json!({"choices": [
                {"delta": {"annotations": [{"type": "url_citation", "url": "https://a", "title": "A"}, {"type": "file_citation", "url": "https://x"}]}},
                {"delta": {"content": "x"}, "message": {"annotations": [{"type": "url_citation", "url_citation": {"url": "https://b"}}]}},
            ]}),
        );
        let urls: Vec<&str> = s.sources.iter().map(|c| c.url.as_str()).collect();
        assert_eq!(urls, ["https://a", "https://b"]);
        assert_eq!(s.billable(), 1, "citations without a count or query bill one search");
    }

    #[test]
    fn test_openai_falls_back_to_responses_rules() {
        let mut s = Search::new(Family::Ollama);
        observe(
            &mut s,
            &json!({"response": {"output": [
                {"type": "web_search_call", "action": {"query": "q1"}},
                {"type": "web_search_call", "action": {"query": "q1"}},
                {"type": "message", "content": [{"annotations": [{"type": "url_citation", "url": "https://c"}]}]},
            ]}}),
        );
        assert_eq!((s.queries.len(), s.sources.len(), s.billable()), (1, 1, 1));
    }

    #[test]
    fn test_gemini_grounding_queries_and_suggestions() {
        let mut s = Search::new(Family::Gemini);
        observe(
            &mut s,
            &json!({"candidates": [{"groundingMetadata": {
                "groundingChunks": [{"web": {"uri": "https://g", "title": "G"}}, {"retrievedContext": {}}],
                "webSearchQueries": ["a", "b", "a", ""],
                "searchEntryPoint": {"renderedContent": "<div/>"},
            }}]}),
        );
        assert_eq!(
            (
                s.sources.len(),
                s.queries.clone(),
                s.suggestions_html.as_deref(),
                s.billable()
            ),
            (1, vec!["a".to_owned(), "b".to_owned()], Some("<div/>"), 2)
        );
    }

    #[test]
    fn test_generic_and_non_objects_extract_nothing() {
        let mut s = Search::new(Family::Generic);
        observe(
            &mut s,
            &json!({"choices": [{"delta": {"annotations": [{"type": "url_citation", "url": "https://a"}]}}]}),
        );
        let mut t = Search::new(Family::OpenAi);
        observe(&mut t, &json!([1, 2]));
        assert!(!s.used() && !t.used());
        assert_eq!(s.billable(), 0);
    }

    #[test]
    fn test_final_fields_are_json_with_optional_keys() {
        let mut s = Search::new(Family::Gemini);
        s.cite("https://a\"", "T", "", "");
        s.query("q");
        s.suggestions_html = Some("<b>".into());
        let mut out = b"{\"usage\":{\"x\":1".to_vec();
        s.write_usage_field(&mut out);
        out.push(b'}');
        s.write_final_fields(&mut out);
        out.push(b'}');
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({"usage": {"x": 1, "web_searches": 1}, "sources": [{"url": "https://a\"", "title": "T"}], "queries": ["q"], "search_suggestions_html": "<b>"})
        );
    }

    /// The slow reference: a linear scan per citation, no index.
    fn reference(cites: &[(usize, u8, u8, u8)]) -> (Vec<Citation>, bool) {
        let mut sources: Vec<Citation> = Vec::new();
        let mut truncated = false;
        for &(url, title, cited, age) in cites {
            let field = |tag: &str, v: u8| if v == 0 { String::new() } else { format!("{tag}{v}") };
            let c = Citation {
                url: format!("https://u/{url}"),
                title: field("t", title),
                cited_text: field("c", cited),
                page_age: field("p", age),
            };
            let full = sources.len() >= MAX_SOURCES;
            match sources.iter_mut().find(|s| s.url == c.url) {
                Some(s) => {
                    if s.title.is_empty() {
                        s.title = c.title;
                    }
                    if s.cited_text.is_empty() {
                        s.cited_text = c.cited_text;
                    }
                    if s.page_age.is_empty() {
                        s.page_age = c.page_age;
                    }
                }
                None if full => truncated = true,
                None => sources.push(c),
            }
        }
        (sources, truncated)
    }

    proptest! {
        /// De-duplication, field merging and the 100-source cap match the linear-scan reference.
        #[test]
        fn prop_sources_match_linear_reference(cites in proptest::collection::vec((0usize..130, 0u8..3, 0u8..3, 0u8..3), 0..300)) {
            let mut s = Search::new(Family::Anthropic);
            for &(url, title, cited, age) in &cites {
                let field = |tag: &str, v: u8| if v == 0 { String::new() } else { format!("{tag}{v}") };
                s.cite(&format!("https://u/{url}"), &field("t", title), &field("c", cited), &field("p", age));
            }
            let (sources, truncated) = reference(&cites);
            prop_assert_eq!(&s.sources, &sources);
            prop_assert_eq!(s.truncated, truncated);
            prop_assert_eq!(s.billable(), i64::from(!sources.is_empty()));
        }
    }
}
