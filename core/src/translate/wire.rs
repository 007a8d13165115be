//! Helpers the codecs share: field access on `serde_json` values, the drift collector, and the
//! small encodings (base64url, data URLs) the IR needs.

use serde_json::{Map, Value};

use super::{Image, Passthrough, Tool};

/// `[]`, for absent optional lists.
pub(crate) static EMPTY_ARRAY: Value = Value::Array(Vec::new());

/// Serializes a value built by a codec.
pub(crate) fn to_vec(value: &Value) -> Vec<u8> {
    // NOTE: serializing a `Value` cannot fail (its keys are strings); the default is unreachable.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Collects the paths of fields a decoder could not classify.
#[derive(Debug, Default)]
pub(crate) struct Drift {
    pub(crate) unknown: Vec<String>,
}

impl Drift {
    /// Notes one unclassified path.
    pub(crate) fn note(&mut self, path: String) {
        if !self.unknown.contains(&path) {
            self.unknown.push(path);
        }
    }

    /// Notes every key of `map` missing from `known` under `prefix` (`""` at the top level).
    pub(crate) fn check(&mut self, prefix: &str, map: &Map<String, Value>, known: &[&str]) {
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.note(if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                });
            }
        }
    }
}

/// The value as an object, or an error naming `what`.
pub(crate) fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    value.as_object().ok_or_else(|| format!("{what} is not an object"))
}

/// The value as an array, or an error naming `what`.
pub(crate) fn array<'a>(value: &'a Value, what: &str) -> Result<&'a Vec<Value>, String> {
    value.as_array().ok_or_else(|| format!("{what} is not an array"))
}

/// An optional list field; absent and `null` are empty.
pub(crate) fn list<'a>(map: &'a Map<String, Value>, key: &str) -> Result<&'a [Value], String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(v) => array(v, key).map(Vec::as_slice),
    }
}

/// A string field; absent and `null` are `None`, another type is an error.
pub(crate) fn opt_str<'a>(map: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("{key} is not a string")),
    }
}

/// A required string field.
pub(crate) fn req_str<'a>(map: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    opt_str(map, key)?.ok_or_else(|| format!("{key} is missing"))
}

/// A non-negative integer field (token counts); absent and `null` are `None`.
pub(crate) fn opt_u64(map: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} is not a non-negative integer")),
    }
}

/// A number field (sampling parameters).
pub(crate) fn opt_f64(map: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("{key} is not a number")),
    }
}

/// An integer field (seeds), `None` when absent or `null`; a float with no fraction counts
/// (protobuf JSON writers emit `40.0`).
pub(crate) fn opt_i64(map: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => integer(v).map(Some).ok_or_else(|| format!("{key} is not an integer")),
    }
}

/// A JSON number that holds an integer, written with or without a fraction.
pub(crate) fn integer(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        let f = value.as_f64()?;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "checked: the float is integral and in range"
        )]
        let n = f as i64;
        (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(n)
    })
}

/// A boolean field that may be absent (`None`).
pub(crate) fn opt_bool(map: &Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| format!("{key} is not a boolean")),
    }
}

/// Keeps each of `keys` present in `body` as a top-level passthrough field.
pub(crate) fn keep(body: &Map<String, Value>, keys: &[&str], passthrough: &mut Passthrough) {
    for key in keys {
        if let Some(value) = body.get(*key) {
            passthrough.keep("", key, value);
        }
    }
}

/// A schema name OpenAI accepts (`^[a-zA-Z0-9_-]{1,64}$`); formats without names give none.
pub(crate) fn schema_name(name: &str) -> String {
    let clean: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(64)
        .collect();
    if clean.is_empty() {
        "response".to_owned()
    } else {
        clean
    }
}

/// A boolean field; absent and `null` are `false`.
pub(crate) fn flag(map: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| format!("{key} is not a boolean")),
    }
}

/// A token count inside an optional nested object, 0 when absent.
pub(crate) fn count(map: Option<&Map<String, Value>>, key: &str) -> u64 {
    map.and_then(|m| m.get(key)).and_then(Value::as_u64).unwrap_or(0)
}

/// Stop sequences given as one string or a list of strings.
pub(crate) fn stop_list(value: Option<&Value>) -> Result<Vec<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| "stop sequences must be strings".to_owned())
            })
            .collect(),
        Some(_) => Err("stop is not a string or a list".to_owned()),
    }
}

/// Tool-call arguments as the object formats carry them.
pub(crate) fn args_value(arguments: &str) -> Value {
    // NOTE: an empty string is what OpenAI streams for a call without arguments; text that is
    // not JSON cannot be an object, so it travels as a string rather than being dropped.
    if arguments.trim().is_empty() {
        return Value::Object(Map::new());
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}

/// Tool-call arguments as JSON text, from the object formats.
pub(crate) fn args_text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// An image from a URL that may be a `data:` URL (OpenAI's form for inline images).
pub(crate) fn image_from_url(url: &str) -> Image {
    if let Some(rest) = url.strip_prefix("data:") {
        if let Some((media_type, data)) = rest.split_once(";base64,") {
            return Image::Base64 {
                media_type: media_type.to_owned(),
                data: data.to_owned(),
            };
        }
    }
    Image::Url(url.to_owned())
}

/// An image as a URL, inline images as a `data:` URL.
pub(crate) fn image_to_url(image: &Image) -> String {
    match image {
        Image::Url(url) => url.clone(),
        Image::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
    }
}

/// The media type of base64 image data from its first bytes (Ollama sends none).
pub(crate) fn sniff_media_type(data: &str) -> &'static str {
    // NOTE: the base64 of each format's magic number; PNG is Ollama's usual input.
    if data.starts_with("/9j/") {
        "image/jpeg"
    } else if data.starts_with("R0lGOD") {
        "image/gif"
    } else if data.starts_with("UklGR") {
        "image/webp"
    } else {
        "image/png"
    }
}

/// The media type of an image URL from its extension, for Gemini's `fileData` which needs one.
pub(crate) fn guess_media_type(url: &str) -> &'static str {
    let path = url.split(['?', '#']).next().unwrap_or(url).to_ascii_lowercase();
    if path.ends_with(".png") {
        "image/png"
    } else if path.ends_with(".gif") {
        "image/gif"
    } else if path.ends_with(".webp") {
        "image/webp"
    } else {
        "image/jpeg"
    }
}

/// OpenAI-style function tool `{"type":"function","function":{...}}` decoded, drift noted.
pub(crate) fn function_tool(value: &Value, drift: &mut Drift, prefix: &str) -> Result<Tool, String> {
    let tool = object(value, "tool")?;
    drift.check(prefix, tool, &["type", "function"]);
    let function = object(tool.get("function").unwrap_or(&Value::Null), "tool function")?;
    drift.check(
        &format!("{prefix}.function"),
        function,
        &["name", "description", "parameters", "strict"],
    );
    Ok(Tool {
        name: req_str(function, "name")?.to_owned(),
        description: opt_str(function, "description")?.map(str::to_owned),
        parameters: function.get("parameters").cloned().unwrap_or_else(empty_schema),
    })
}

/// The schema of a tool without parameters.
pub(crate) fn empty_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// Ids for calls without one, and the calls awaiting a result, for the formats that match
/// results to calls by name (Gemini, Ollama).
#[derive(Debug)]
pub(crate) struct Calls {
    prefix: &'static str,
    pub(crate) made: usize,
    /// Appended to synthesized ids.
    pub(crate) suffix: String,
    open: Vec<(String, String)>,
}

impl Calls {
    pub(crate) fn new(prefix: &'static str) -> Self {
        Self {
            prefix,
            made: 0,
            suffix: String::new(),
            open: Vec::new(),
        }
    }

    /// The id of a call, synthesized when the wire has none.
    pub(crate) fn call_id(&mut self, id: Option<&str>, name: &str) -> String {
        let id = match id.filter(|id| !id.is_empty()) {
            Some(id) => id.to_owned(),
            None => format!("{}{}{}", self.prefix, self.made, self.suffix),
        };
        self.made += 1;
        self.open.push((id.clone(), name.to_owned()));
        id
    }

    /// The id of a result: its own, else the oldest unanswered call of that name.
    pub(crate) fn result_id(&mut self, id: Option<&str>, name: &str) -> String {
        if let Some(id) = id.filter(|id| !id.is_empty()) {
            self.open.retain(|(open, _)| open != id);
            return id.to_owned();
        }
        match self.open.iter().position(|(_, n)| n == name) {
            Some(i) => self.open.remove(i).0,
            None => format!("{}{name}", self.prefix),
        }
    }
}

/// Seconds since the epoch, for the `created` fields responses carry.
pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Unpadded base64url (RFC 4648 §5).
pub(crate) fn base64url_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(BASE64URL[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// Inverse of [`base64url_encode`]; `None` for anything it could not have produced.
pub(crate) fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let digit = BASE64URL.iter().position(|&a| a == c)?;
            n |= u32::try_from(digit).ok()? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push(n.to_be_bytes()[1 + i]);
        }
    }
    Some(out)
}

/// `,"detectors":[..]` naming data protection's blocking detectors (never the values); nothing
/// when there are none.
pub(crate) fn write_detectors(out: &mut Vec<u8>, detectors: &[String]) {
    if detectors.is_empty() {
        return;
    }
    out.extend_from_slice(b",\"detectors\":[");
    for (i, detector) in detectors.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        crate::json::write_str(out, detector);
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// Decoding an encoding gives the bytes back.
        #[test]
        fn prop_base64url_round_trips(bytes: Vec<u8>) {
            proptest::prop_assert_eq!(base64url_decode(&base64url_encode(&bytes)), Some(bytes));
        }
    }

    #[test]
    fn test_base64url_matches_rfc4648_vectors() {
        assert_eq!(base64url_encode(b"foob"), "Zm9vYg");
        assert_eq!(base64url_encode(b"\xfb\xff"), "-_8");
        assert_eq!(base64url_decode("Zm9vYmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(base64url_decode("Z"), None);
    }
}
