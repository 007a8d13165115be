//! Provider templates and dot paths, compiled once per snapshot (mesh-behaviour §4.2-4.3).
//!
//! A [`Template`] is the template text cut into literal runs, `{{name}}` placeholders and raw
//! splices (`"{{content_json}}"` *with* its quotes), so rendering a request is one pass of
//! appends. Unknown placeholders stay literal text, as in Mesh. Because the cuts are made on the
//! template and never on substituted values, a value that itself contains `{{model}}` or
//! `"{{content_json}}"` is never substituted again (Mesh's single-pass regex gives the same).

use serde_json::Value;

use crate::json::write_escaped;

/// A `{{name}}` placeholder with a value per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Var {
    ApiKey,
    Model,
    Query,
    JobId,
}

impl Var {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "api_key" => Self::ApiKey,
            "model" => Self::Model,
            "query" => Self::Query,
            "job_id" => Self::JobId,
            _ => return None,
        })
    }
}

/// A `"{{name}}"` token, quotes included, replaced by raw JSON after rendering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raw {
    ContentJson,
    MaxTokensJson,
    InputJson,
    PromptJson,
}

impl Raw {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "content_json" => Self::ContentJson,
            "max_tokens_json" => Self::MaxTokensJson,
            "input_json" => Self::InputJson,
            "prompt_json" => Self::PromptJson,
            _ => return None,
        })
    }
}

/// How placeholder values are inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// URLs and header values: plain textual substitution, no escaping.
    Text,
    /// Bodies: values JSON-escaped without quotes, then raw splices.
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Var(Var),
    Raw(Raw),
}

/// A compiled template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    mode: Mode,
    parts: Vec<Part>,
    /// Literal bytes, to size the output buffer.
    literal_len: usize,
}

/// The values a render may use; `None` leaves the placeholder literal.
#[derive(Clone, Copy, Debug, Default)]
pub struct Vars<'a> {
    pub api_key: Option<&'a str>,
    pub model: Option<&'a str>,
    /// Text blocks, joined with a blank line when rendered.
    pub query: Option<&'a [&'a str]>,
    pub job_id: Option<&'a str>,
    pub content_json: Option<&'a [u8]>,
    pub max_tokens_json: Option<&'a [u8]>,
    pub input_json: Option<&'a [u8]>,
    pub prompt_json: Option<&'a [u8]>,
}

impl Template {
    /// Cuts `text` into parts. In [`Mode::Json`], `"{{content_json}}"`, `"{{max_tokens_json}}"`,
    /// `"{{input_json}}"` and `"{{prompt_json}}"` become raw splices.
    #[must_use]
    pub fn compile(text: &str, mode: Mode) -> Self {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            let after = &rest[open + 2..];
            let name_len = after
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .count();
            if name_len == 0 || !after[name_len..].starts_with("}}") {
                literal.push_str(&rest[..open + 2]);
                rest = after;
                continue;
            }
            let name = &after[..name_len];
            let end = open + 2 + name_len + 2;
            let quoted =
                mode == Mode::Json && open > 0 && rest.as_bytes()[open - 1] == b'"' && rest[end..].starts_with('"');
            let part = match (quoted.then(|| Raw::parse(name)).flatten(), Var::parse(name)) {
                (Some(raw), _) => {
                    literal.push_str(&rest[..open - 1]);
                    rest = &rest[end + 1..];
                    Part::Raw(raw)
                }
                (None, Some(var)) => {
                    literal.push_str(&rest[..open]);
                    rest = &rest[end..];
                    Part::Var(var)
                }
                (None, None) => {
                    literal.push_str(&rest[..end]);
                    rest = &rest[end..];
                    continue;
                }
            };
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(part);
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        let literal_len = parts
            .iter()
            .map(|p| if let Part::Literal(s) = p { s.len() } else { 0 })
            .sum();
        Self {
            mode,
            parts,
            literal_len,
        }
    }

    /// Whether the template uses `var` (e.g. `{{api_key}}`, refused in bodies).
    #[must_use]
    pub fn uses(&self, var: Var) -> bool {
        self.parts.contains(&Part::Var(var))
    }

    /// Appends the rendered template to `out`.
    pub fn render_into(&self, vars: &Vars<'_>, out: &mut Vec<u8>) {
        out.reserve(self.literal_len + 16);
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.extend_from_slice(s.as_bytes()),
                Part::Var(var) => {
                    let text = match var {
                        Var::ApiKey => vars.api_key,
                        Var::Model => vars.model,
                        Var::JobId => vars.job_id,
                        Var::Query => {
                            if let Some(blocks) = vars.query {
                                for (i, block) in blocks.iter().enumerate() {
                                    if i > 0 {
                                        self.put(out, "\n\n");
                                    }
                                    self.put(out, block);
                                }
                                continue;
                            }
                            None
                        }
                    };
                    match text {
                        Some(text) => self.put(out, text),
                        None => {
                            out.extend_from_slice(b"{{");
                            out.extend_from_slice(var_name(*var).as_bytes());
                            out.extend_from_slice(b"}}");
                        }
                    }
                }
                Part::Raw(raw) => {
                    let value = match raw {
                        Raw::ContentJson => vars.content_json,
                        Raw::MaxTokensJson => vars.max_tokens_json,
                        Raw::InputJson => vars.input_json,
                        Raw::PromptJson => vars.prompt_json,
                    };
                    match value {
                        Some(json) => out.extend_from_slice(json),
                        None => {
                            out.extend_from_slice(b"\"{{");
                            out.extend_from_slice(raw_name(*raw).as_bytes());
                            out.extend_from_slice(b"}}\"");
                        }
                    }
                }
            }
        }
    }

    /// The rendered template as bytes.
    #[must_use]
    pub fn render(&self, vars: &Vars<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        self.render_into(vars, &mut out);
        out
    }

    /// The rendered template as text (URLs and headers, whose values are all `str`).
    #[must_use]
    pub fn render_string(&self, vars: &Vars<'_>) -> String {
        // Literals and values are `str`; raw splices are JSON text produced by this crate.
        String::from_utf8(self.render(vars)).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    fn put(&self, out: &mut Vec<u8>, text: &str) {
        match self.mode {
            Mode::Text => out.extend_from_slice(text.as_bytes()),
            Mode::Json => write_escaped(out, text),
        }
    }
}

fn var_name(var: Var) -> &'static str {
    match var {
        Var::ApiKey => "api_key",
        Var::Model => "model",
        Var::Query => "query",
        Var::JobId => "job_id",
    }
}

fn raw_name(raw: Raw) -> &'static str {
    match raw {
        Raw::ContentJson => "content_json",
        Raw::MaxTokensJson => "max_tokens_json",
        Raw::InputJson => "input_json",
        Raw::PromptJson => "prompt_json",
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// An all-digit segment: an array index (or, on an object, the key with those digits).
    Index(usize, String),
    Key(String),
}

/// A dot path (`choices.0.delta.content`), split once when the snapshot is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DotPath {
    steps: Vec<Step>,
}

impl DotPath {
    /// Splits `path` on `.`; `None` for an empty path.
    #[must_use]
    pub fn parse(path: &str) -> Option<Self> {
        let path = path.trim();
        if path.is_empty() {
            return None;
        }
        let steps = path
            .split('.')
            .map(|s| match s.parse::<usize>() {
                Ok(i) if s.bytes().all(|b| b.is_ascii_digit()) => Step::Index(i, s.to_owned()),
                _ => Step::Key(s.to_owned()),
            })
            .collect();
        Some(Self { steps })
    }

    /// The value at this path in `value`, if every step resolves.
    #[must_use]
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.steps.iter().try_fold(value, |v, step| match (step, v) {
            (Step::Index(i, _), Value::Array(items)) => items.get(*i),
            (Step::Index(_, key) | Step::Key(key), Value::Object(map)) => map.get(key),
            _ => None,
        })
    }

    /// The value at this path, mutably (to take a string out without copying it).
    pub fn get_mut<'v>(&self, value: &'v mut Value) -> Option<&'v mut Value> {
        self.steps.iter().try_fold(value, |v, step| match (step, v) {
            (Step::Index(i, _), Value::Array(items)) => items.get_mut(*i),
            (Step::Index(_, key) | Step::Key(key), Value::Object(map)) => map.get_mut(key),
            _ => None,
        })
    }

    /// The number at this path, truncated to an integer (Mesh's usage rule).
    #[must_use]
    pub fn get_int(&self, value: &Value) -> Option<i64> {
        let n = self.get(value)?;
        n.as_i64()
            .or_else(|| n.as_u64().map(|u| i64::try_from(u).unwrap_or(i64::MAX)))
            .or_else(|| {
                #[expect(clippy::cast_possible_truncation, reason = "Mesh truncates a JSON number to an int")]
                n.as_f64().map(|f| f as i64)
            })
    }

    /// The string, or number as text, at this path (async job ids and statuses).
    #[must_use]
    pub fn get_text(&self, value: &Value) -> Option<String> {
        match self.get(value)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_json_mode_escapes_values_and_splices_raw() {
        let t = Template::compile(
            r#"{"model":"{{model}}","q":"{{query}}","c":"{{content_json}}","m":"{{max_tokens_json}}","x":"{{nope}}","k":"a{{content_json}}"}"#,
            Mode::Json,
        );
        let vars = Vars {
            model: Some("g\"pt"),
            query: Some(&["a\nb", "c"]),
            content_json: Some(b"[{\"type\":\"text\"}]"),
            max_tokens_json: Some(b"12"),
            ..Vars::default()
        };
        assert_eq!(
            String::from_utf8(t.render(&vars)).unwrap(),
            r#"{"model":"g\"pt","q":"a\nb\n\nc","c":[{"type":"text"}],"m":12,"x":"{{nope}}","k":"a{{content_json}}"}"#
        );
    }

    #[test]
    fn test_text_mode_substitutes_plainly_and_keeps_missing_values() {
        let t = Template::compile("https://h/{{model}}:x?key={{api_key}}&j={{job_id}}{{", Mode::Text);
        let vars = Vars {
            model: Some("m/1"),
            api_key: Some("k&"),
            ..Vars::default()
        };
        assert_eq!(t.render_string(&vars), "https://h/m/1:x?key=k&&j={{job_id}}{{");
        assert!(t.uses(Var::ApiKey));
    }

    #[test]
    fn test_values_are_never_substituted_twice() {
        let t = Template::compile(r#"{"q":"{{query}}","c":"{{content_json}}"}"#, Mode::Json);
        let vars = Vars {
            query: Some(&["\"{{content_json}}\" {{model}}"]),
            content_json: Some(b"[]"),
            model: Some("X"),
            ..Vars::default()
        };
        assert_eq!(
            String::from_utf8(t.render(&vars)).unwrap(),
            r#"{"q":"\"{{content_json}}\" {{model}}","c":[]}"#
        );
    }

    #[test]
    fn test_dot_paths_index_arrays_and_objects() {
        let v: Value = serde_json::json!({"choices": [{"delta": {"content": "hi"}}], "u": {"0": 3.9}});
        assert_eq!(
            DotPath::parse("choices.0.delta.content").unwrap().get(&v),
            Some(&Value::from("hi"))
        );
        assert_eq!(DotPath::parse("u.0").unwrap().get_int(&v), Some(3));
        assert_eq!(DotPath::parse("choices.1.delta").unwrap().get(&v), None);
        assert_eq!(DotPath::parse(""), None);
    }

    proptest! {
        /// The escaper's output, quoted, parses back to the input (serde_json is the reference).
        #[test]
        fn prop_json_escape_round_trips(s: String) {
            let mut out = vec![b'"'];
            write_escaped(&mut out, &s);
            out.push(b'"');
            prop_assert_eq!(serde_json::from_slice::<String>(&out).unwrap(), s);
        }

        /// Rendering equals Mesh's two passes done with string replacement on the template.
        #[test]
        fn prop_render_matches_two_pass_replace(model in "[a-z{}\"\\\\]{0,8}", pre in "[a-z\" ]{0,6}", post in "[a-z\" ]{0,6}") {
            let text = format!("{pre}{{{{model}}}}{post}\"{{{{content_json}}}}\"{pre}");
            let t = Template::compile(&text, Mode::Json);
            let vars = Vars { model: Some(&model), content_json: Some(b"[1]"), ..Vars::default() };
            let mut escaped = Vec::new();
            write_escaped(&mut escaped, &model);
            let reference = text.replacen("{{model}}", std::str::from_utf8(&escaped).unwrap(), 1).replacen("\"{{content_json}}\"", "[1]", 1);
            prop_assert_eq!(String::from_utf8(t.render(&vars)).unwrap(), reference);
        }
    }
}
