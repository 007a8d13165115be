//! Web search in a chat stream (mesh-behaviour §2.6, §4.5): the family-specific extraction of
//! citations, queries, reported search counts and Gemini's suggestion HTML from upstream events,
//! and [`Search`], which de-duplicates and merges them by URL and writes them as NDJSON.

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
fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn array<'a>(value: Option<&'a Value>, key: &str) -> &'a [Value] {
    value
        .and_then(|v| v.get(key))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn is_type(value: &Value, kind: &str) -> bool {
    value.get("type").and_then(Value::as_str) == Some(kind)
}

/// `usage.server_tool_use.web_search_requests` of `usage`, truncated to an int as Mesh does.
fn search_requests(usage: Option<&Value>) -> Option<i64> {
    let n = usage?.get("server_tool_use")?.get("web_search_requests")?;
    n.as_i64().or_else(|| {
        #[expect(clippy::cast_possible_truncation, reason = "Mesh truncates a JSON number to an int")]
        n.as_f64().map(|f| f as i64)
    })
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

    fn query(&mut self, query: &str) {
        if !query.is_empty() && !self.queries.iter().any(|q| q == query) {
            self.queries.push(query.to_owned());
        }
    }

    /// Reads one upstream event (mesh-behaviour §4.5).
    pub fn observe(&mut self, event: &Value) {
        if !event.is_object() {
            return;
        }
        match self.family {
            Family::Anthropic => self.anthropic(event),
            Family::OpenAi | Family::Ollama => {
                let cited = self.cited;
                self.openai_chat(event);
                if self.cited == cited {
                    self.responses(event);
                }
            }
            Family::OpenAiResponses => self.responses(event),
            Family::Gemini => self.gemini(event),
            Family::Generic => {}
        }
    }

    fn anthropic(&mut self, event: &Value) {
        match event.get("type").and_then(Value::as_str) {
            Some("content_block_start") => {
                let block = event
                    .get("content_block")
                    .filter(|b| is_type(b, "web_search_tool_result"));
                for result in array(block, "content")
                    .iter()
                    .filter(|r| is_type(r, "web_search_result"))
                {
                    self.cite(text(result, "url"), text(result, "title"), "", text(result, "page_age"));
                }
            }
            Some("content_block_delta") => {
                let delta = event.get("delta").filter(|d| is_type(d, "citations_delta"));
                if let Some(citation) = delta.and_then(|d| d.get("citation")).filter(|c| c.is_object()) {
                    self.cite(
                        text(citation, "url"),
                        text(citation, "title"),
                        text(citation, "cited_text"),
                        "",
                    );
                }
            }
            _ => {}
        }
        let reported =
            search_requests(event.get("usage")).or_else(|| search_requests(event.get("message")?.get("usage")));
        if let Some(n) = reported {
            self.reported = self.reported.max(n);
        }
    }

    /// A `url_citation` annotation, its fields flat or nested under `url_citation`.
    fn url_citation(&mut self, annotation: &Value) {
        if !is_type(annotation, "url_citation") {
            return;
        }
        let fields = annotation
            .get("url_citation")
            .filter(|n| n.is_object())
            .unwrap_or(annotation);
        self.cite(text(fields, "url"), text(fields, "title"), "", "");
    }

    fn openai_chat(&mut self, event: &Value) {
        for choice in array(Some(event), "choices") {
            let annotations = |key: &str| {
                choice
                    .get(key)
                    .and_then(|m| m.get("annotations"))
                    .and_then(Value::as_array)
            };
            for annotation in annotations("delta")
                .or_else(|| annotations("message"))
                .map_or(&[][..], Vec::as_slice)
            {
                self.url_citation(annotation);
            }
        }
    }

    fn responses(&mut self, event: &Value) {
        match event.get("type").and_then(Value::as_str) {
            Some("response.output_text.annotation.added") => {
                if let Some(annotation) = event.get("annotation") {
                    self.url_citation(annotation);
                }
                return;
            }
            Some("response.output_item.added" | "response.output_item.done") => {
                if let Some(item) = event.get("item") {
                    self.responses_item(item);
                }
                return;
            }
            _ => {}
        }
        let output = match event.get("output").and_then(Value::as_array) {
            Some(output) => output.as_slice(),
            None => array(event.get("response").filter(|r| r.is_object()), "output"),
        };
        for item in output {
            self.responses_item(item);
        }
    }

    fn responses_item(&mut self, item: &Value) {
        match item.get("type").and_then(Value::as_str) {
            Some("web_search_call") => {
                if let Some(action) = item.get("action") {
                    self.query(text(action, "query"));
                }
            }
            Some("message") => {
                for part in array(Some(item), "content") {
                    for annotation in array(Some(part), "annotations") {
                        self.url_citation(annotation);
                    }
                }
            }
            _ => {}
        }
    }

    fn gemini(&mut self, event: &Value) {
        for candidate in array(Some(event), "candidates") {
            let Some(meta) = candidate.get("groundingMetadata").filter(|m| m.is_object()) else {
                continue;
            };
            for chunk in array(Some(meta), "groundingChunks") {
                if let Some(web) = chunk.get("web").filter(|w| w.is_object()) {
                    self.cite(text(web, "uri"), text(web, "title"), "", "");
                }
            }
            for query in array(Some(meta), "webSearchQueries") {
                self.query(query.as_str().unwrap_or(""));
            }
            let rendered = meta.get("searchEntryPoint").map_or("", |e| text(e, "renderedContent"));
            if !rendered.is_empty() {
                self.suggestions_html = Some(rendered.to_owned());
            }
        }
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
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn test_anthropic_search_count_comes_from_usage_or_message_usage() {
        let mut s = Search::new(Family::Anthropic);
        s.observe(
            &json!({"type": "message_start", "message": {"usage": {"server_tool_use": {"web_search_requests": 2}}}}),
        );
        s.observe(&json!({"type": "message_delta", "usage": {"server_tool_use": {"web_search_requests": 1.9}}}));
        assert_eq!(
            (s.reported, s.billable(), s.used()),
            (2, 2, true),
            "the highest count wins"
        );
    }

    #[test]
    fn test_openai_annotations_flat_or_nested_and_message_fallback() {
        let mut s = Search::new(Family::OpenAi);
        s.observe(&json!({"choices": [
            {"delta": {"annotations": [{"type": "url_citation", "url": "https://a", "title": "A"}, {"type": "file_citation", "url": "https://x"}]}},
            {"delta": {"content": "x"}, "message": {"annotations": [{"type": "url_citation", "url_citation": {"url": "https://b"}}]}},
        ]}));
        let urls: Vec<&str> = s.sources.iter().map(|c| c.url.as_str()).collect();
        assert_eq!(urls, ["https://a", "https://b"]);
        assert_eq!(s.billable(), 1, "citations without a count or query bill one search");
    }

    #[test]
    fn test_openai_falls_back_to_responses_rules() {
        let mut s = Search::new(Family::Ollama);
        s.observe(&json!({"response": {"output": [
            {"type": "web_search_call", "action": {"query": "q1"}},
            {"type": "web_search_call", "action": {"query": "q1"}},
            {"type": "message", "content": [{"annotations": [{"type": "url_citation", "url": "https://c"}]}]},
        ]}}));
        assert_eq!((s.queries.len(), s.sources.len(), s.billable()), (1, 1, 1));
    }

    #[test]
    fn test_gemini_grounding_queries_and_suggestions() {
        let mut s = Search::new(Family::Gemini);
        s.observe(&json!({"candidates": [{"groundingMetadata": {
            "groundingChunks": [{"web": {"uri": "https://g", "title": "G"}}, {"retrievedContext": {}}],
            "webSearchQueries": ["a", "b", "a", ""],
            "searchEntryPoint": {"renderedContent": "<div/>"},
        }}]}));
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
        s.observe(&json!({"choices": [{"delta": {"annotations": [{"type": "url_citation", "url": "https://a"}]}}]}));
        let mut t = Search::new(Family::OpenAi);
        t.observe(&json!([1, 2]));
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
