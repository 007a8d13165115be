//! Templates and dot paths under arbitrary text: compiling, rendering with arbitrary values and
//! reading paths out of arbitrary JSON never panic; a JSON-mode render of a valid JSON template
//! with JSON-escaped values stays valid JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshfast_core::template::{DotPath, Mode, Template, Vars};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (template, value) = text.split_once('\u{1}').unwrap_or((&text, ""));
    let query = [value];
    let vars = Vars { api_key: Some(value), model: Some(value), query: Some(&query), job_id: Some(value), ..Vars::default() };
    for mode in [Mode::Text, Mode::Json] {
        let compiled = Template::compile(template, mode);
        let rendered = compiled.render(&vars);
        if mode == Mode::Json && serde_json::from_str::<serde_json::Value>(template).is_ok() && !template.contains("{{") {
            assert!(serde_json::from_slice::<serde_json::Value>(&rendered).is_ok());
        }
    }
    if let Some(path) = DotPath::parse(template) {
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(value) {
            let _ = path.get(&json);
            let _ = path.get_int(&json);
            let _ = path.get_text(&json);
        }
    }
});
